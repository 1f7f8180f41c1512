"""Which coordinator a client talks to, and which failed requests may go to another one
(``corral.client.coordinators``)."""

from __future__ import annotations

import httpx
import pytest

from corral.client import AsyncClient, Client, calls
from corral.client.coordinators import Coordinators, Following, split_urls
from corral.runner.coordinators import Coordinators as RunnerCoordinators

A, B, C = "http://a:8765", "http://b:8765", "http://c:8765"
LIST, RETRY = calls.list_runs(), calls.task_action("p1", "a", "retry")
REQUEST = httpx.Request("POST", f"{A}/runs")


def test_urls_come_as_a_list_or_one_string_with_commas() -> None:
    assert split_urls(f" {A}/, ,{B}") == (A, B)
    assert split_urls([A, f"{B}/"]) == (A, B)
    with pytest.raises(ValueError, match="no coordinator URL"):
        split_urls(" , ")


BAD_URLS = [
    ("http://bad..name:8765", "not a valid URL"),  # an empty label
    (f"http://{'x' * 64}.example", "not a valid URL"),  # a label over 63 characters
    ("http://a:99999", "not a valid URL"),  # a port out of range
    ("127.0.0.1:8765", "did you mean http://127.0.0.1:8765"),
]


@pytest.mark.parametrize(("url", "said"), BAD_URLS)
def test_a_url_no_connection_can_use_is_refused_when_given(url: str, said: str) -> None:
    """From Python as from the CLI: at once and saying why, not as a UnicodeError from
    the resolver at the first request (or, in a runner, after it started)."""
    for make in (Client, AsyncClient, RunnerCoordinators):
        with pytest.raises(ValueError, match=said):
            make([A, url])


def test_a_client_stays_with_the_one_that_answered() -> None:
    coordinators = Coordinators([A, B, C])
    assert coordinators.order() == [A, B, C]
    coordinators.answered(B)
    assert coordinators.current == B
    assert coordinators.order() == [B, C, A]  # B first, then each other once


def test_two_requests_failing_on_one_move_on_once() -> None:
    coordinators = Coordinators([A, B, C])
    coordinators.move_on(A)
    coordinators.move_on(A)  # the second saw A fail too: B is not skipped
    assert coordinators.current == B


def test_a_request_that_never_left_may_go_to_the_next_whatever_its_method() -> None:
    coordinators = Coordinators([A, B])
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=REQUEST)
    assert coordinators.refusal(RETRY, A, refused) is None
    assert coordinators.current == B


def test_a_write_whose_outcome_is_unknown_is_not_sent_again() -> None:
    coordinators = Coordinators([A, B])
    for cut in (
        httpx.RemoteProtocolError("Server disconnected", request=REQUEST),
        httpx.ReadError("[Errno 104] Connection reset by peer", request=REQUEST),
        httpx.ReadTimeout("timed out", request=REQUEST),
    ):
        refusal = coordinators.refusal(RETRY, A, cut)
        assert refusal is not None and refusal.code == "outcome_unknown"
        assert (
            f"lost the coordinator at {A} after sending POST /projects/p1/tasks/a/retry"
            in refusal.message
        )
        assert coordinators.current == A  # nothing moved: the caller decides
        # A read may go again: it changes nothing; so may a create, with its key.
        assert coordinators.refusal(LIST, A, cut) is None
        coordinators.answered(A)
        assert coordinators.refusal(calls.create_run({"type": "command"}), A, cut) is None
        coordinators.answered(A)


@pytest.mark.parametrize(
    "call",
    [
        calls.ensure_project("/repo", "main", {}),
        calls.add_tasks("p1", [{"id": "a", "title": "A"}], None),
        calls.start_plan("p1", 2),
        calls.stop_plan("p1"),
        calls.pause_plan("p1", True),
        calls.pause_plan("p1", False),
        calls.cancel_run("r1"),
        calls.task_action("p1", "a", "cancel"),
        calls.stop_runner("r1"),
        calls.drain_runner("r1", 30.0),
        calls.revoke_token("t"),
    ],
    ids=lambda call: call.path,
)
def test_a_write_that_does_no_more_sent_twice_goes_to_the_next(call: calls.Call[object]) -> None:
    coordinators = Coordinators([A, B])
    cut = httpx.ReadError("[Errno 104] Connection reset by peer", request=REQUEST)
    assert coordinators.refusal(call, A, cut) is None
    assert coordinators.current == B


@pytest.mark.parametrize(
    "call",
    [RETRY, calls.raw("POST", "/runs/r1/retry", None, None)],
    ids=lambda call: call.path,
)
def test_a_write_that_would_do_more_sent_twice_is_not_sent_again(call: calls.Call[object]) -> None:
    """A retry makes another attempt each time; a raw write is not known to do no more."""
    coordinators = Coordinators([A, B])
    cut = httpx.ReadError("[Errno 104] Connection reset by peer", request=REQUEST)
    refusal = coordinators.refusal(call, A, cut)
    assert refusal is not None and refusal.code == "outcome_unknown"


def test_each_create_carries_a_key_of_its_own_kept_when_sent_again() -> None:
    one, other = calls.create_run({}), calls.create_runs([{}])
    assert one.headers is not None and other.headers is not None
    assert one.headers["Idempotency-Key"] != other.headers["Idempotency-Key"]
    assert one.headers == one.headers  # a property of the call: the same at each send
    assert other.body == {"runs": [{}]} and not other.params
    assert LIST.headers is None and RETRY.headers is None


def test_one_url_fails_as_it_always_did() -> None:
    coordinators = Coordinators(A)
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=REQUEST)
    refusal = coordinators.refusal(LIST, A, refused)
    assert refusal is not None and refusal.code == "unavailable"
    assert refusal.message == f"cannot reach the coordinator at {A}: [Errno 111] Connection refused"
    following = Following(coordinators)
    lost = following.lost(A, refused)
    assert lost is not None
    assert lost.message == f"lost the coordinator at {A}: [Errno 111] Connection refused"
    assert not following.ended_early(A)  # the stream ends, as it did


def test_a_stream_gives_up_after_a_round_of_failures_and_one_that_opened_counts_again() -> None:
    following = Following(Coordinators([A, B]))
    cut = httpx.ReadError("reset", request=REQUEST)
    assert following.lost(A, cut) is None
    following.opened(B)  # B served it a while: its loss starts the count again
    assert following.lost(B, cut) is None
    gave_up = following.lost(A, cut)  # B, then A: a round
    assert gave_up is not None
    assert gave_up.message == f"cannot reach any coordinator ({B}: reset; {A}: reset)"


def test_a_stream_closed_early_everywhere_in_turn_ends_as_with_one_url() -> None:
    following = Following(Coordinators([A, B]))
    assert following.ended_early(A)  # A is stopping: on to B
    following.passed()  # B passed something on
    assert following.ended_early(B)
    assert not following.ended_early(A)  # A closed it at once too: the caller looks
