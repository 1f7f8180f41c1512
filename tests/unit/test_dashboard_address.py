"""The dashboard's address as the CLI prints it: the token and the page in the fragment."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from corral.dashboard.site import address


def test_the_token_and_the_page_travel_in_the_fragment_only() -> None:
    printed = address("http://127.0.0.1:8765/", "crl_a+b/c=", page="/plans/prj_1")
    parts = urlsplit(printed)
    assert (parts.path, parts.query) == ("/", "")  # nothing a server or its log would see
    assert parse_qs(parts.fragment) == {"token": ["crl_a+b/c="], "page": ["/plans/prj_1"]}


def test_without_a_token_the_address_opens_the_page_and_asks_for_one() -> None:
    assert address("http://h:1", None) == "http://h:1/"
    assert address("http://h:1", None, page="/runners") == "http://h:1/#/runners"
    assert address("http://h:1", "t") == "http://h:1/#token=t"
