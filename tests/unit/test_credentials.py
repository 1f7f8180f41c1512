"""The local admin token (``.corral/credentials``), and the Host and Origin parsing the
coordinator's guard relies on."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from corral import errors
from corral.coordinator.auth import allowed_hosts, bearer, host_name, origin_netloc
from corral.credentials import CREDENTIALS, client_token, coordinator_token, read_token


def test_a_coordinator_makes_its_token_once_readable_by_its_owner_only(tmp_path: Path) -> None:
    assert read_token(tmp_path) is None
    made = coordinator_token(None, tmp_path)
    path = tmp_path / CREDENTIALS
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == made + "\n" and len(made) > 40
    assert coordinator_token(None, tmp_path) == made  # the next start takes the same one
    assert client_token(None, tmp_path) == made  # and a CLI or runner here finds it


def test_an_explicit_token_wins_and_writes_nothing(tmp_path: Path) -> None:
    assert coordinator_token("crl_given", tmp_path) == "crl_given"
    assert not (tmp_path / CREDENTIALS).exists()
    assert client_token("crl_given", tmp_path) == "crl_given"
    assert client_token(None, tmp_path) is None


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8765", "localhost"),
        ("LocalHost", "localhost"),
        ("[::1]:8765", "::1"),
        ("::1", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("evil.example:80", "evil.example"),
    ],
)
def test_host_names(header: str, name: str) -> None:
    assert host_name(header) == name


def test_origins_bearer_and_defaults() -> None:
    assert origin_netloc("http://LOCALHOST:8765/") == "localhost:8765"
    assert origin_netloc("null") == "" and origin_netloc("file://x") == ""
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None and bearer("Bearer ") is None and bearer(None) is None
    assert set(allowed_hosts("0.0.0.0", ["a.example"])) == {
        "localhost",
        "127.0.0.1",
        "::1",
        "a.example",
    }
    assert "10.0.0.5" in allowed_hosts("10.0.0.5", [])


def test_refusals_travel_back_with_their_codes() -> None:
    body = {"error": {"code": "runner_not_yours", "message": "no"}}
    forbidden = errors.from_wire(403, body)
    assert isinstance(forbidden, errors.Forbidden) and forbidden.code == "runner_not_yours"
    unauthorized = errors.from_wire(401, {"error": {"code": "invalid_token", "message": "no"}})
    assert isinstance(unauthorized, errors.Unauthorized) and unauthorized.exit_code == 6
