"""The decisions beside the run transition table (``corral.runs``), row by row: where a
lost run goes, how a final report ends a run a cancel was asked of, when a rate-limited
run stops being given another go, and the guards bulk statements take from the table."""

from __future__ import annotations

import pytest

from corral.runs import (
    MAX_RATE_LIMIT_REQUEUES,
    TRANSITIONS,
    RunStatus,
    after_lost,
    after_rate_limit,
    attempts_counted,
    lost_for_good,
    may_become,
    status_reported,
)

S = RunStatus


@pytest.mark.parametrize(
    ("cancel_requested", "attempts", "rate_limited", "max_attempts", "goes_to"),
    [
        (False, 1, 0, 3, S.PENDING),  # attempts left
        (False, 2, 0, 3, S.PENDING),
        # The last attempt was lost: it stays lost, for its runner's late report (a grace;
        # then the reconciler fails it).
        (False, 3, 0, 3, S.LOST),
        (False, 4, 0, 3, S.LOST),
        (False, 3, 1, 3, S.PENDING),  # a rate-limited attempt was given back: not counted
        (False, 5, 2, 3, S.LOST),
        (False, 1, 0, 1, S.LOST),
        (True, 1, 0, 3, S.CANCELLED),  # a cancel was asked: it is not run again
        (True, 3, 0, 3, S.CANCELLED),
    ],
)
def test_where_a_lost_run_goes(
    cancel_requested: bool, attempts: int, rate_limited: int, max_attempts: int, goes_to: S
) -> None:
    status = after_lost(
        cancel_requested=cancel_requested,
        attempts=attempts,
        rate_limited=rate_limited,
        max_attempts=max_attempts,
    )
    assert status is goes_to
    assert status is S.LOST or status in TRANSITIONS[S.LOST]
    if status is S.LOST:  # and when its grace is over, it may fail
        assert S.FAILED in TRANSITIONS[S.LOST]


@pytest.mark.parametrize(("attempts", "goes_to"), [(1, S.PENDING), (3, S.FAILED)])
def test_a_run_of_a_stopped_runner_waits_for_no_report(attempts: int, goes_to: S) -> None:
    """Stopped (told to, or known dead), not lost: its last attempt fails at once."""
    status = after_lost(
        cancel_requested=False,
        attempts=attempts,
        rate_limited=0,
        max_attempts=3,
        report_may_come=False,
    )
    assert status is goes_to


def test_a_run_lost_for_good_says_why_and_that_no_attempt_was_left() -> None:
    error = lost_for_good("runner rnr_1 was lost", attempts=5, rate_limited=2, max_attempts=3)
    assert error == "runner rnr_1 was lost; no attempts left (3/3)"


@pytest.mark.parametrize(
    ("reported", "cancel_requested", "ends"),
    [
        (S.FAILED, True, S.CANCELLED),  # the failure is how the cancel showed
        (S.FAILED, False, S.FAILED),
        (S.COMPLETED, True, S.COMPLETED),  # it finished before the cancel reached it
        (S.COMPLETED, False, S.COMPLETED),
        (S.CANCELLED, True, S.CANCELLED),
        (S.TIMED_OUT, True, S.TIMED_OUT),
        (S.PENDING, True, S.PENDING),  # given back: decided by after_rate_limit
    ],
)
def test_how_a_final_report_ends_a_run(reported: S, cancel_requested: bool, ends: S) -> None:
    assert status_reported(reported, cancel_requested) is ends


@pytest.mark.parametrize(
    ("rate_limited", "goes_to"),
    [
        (0, S.PENDING),
        (1, S.PENDING),
        (MAX_RATE_LIMIT_REQUEUES - 1, S.PENDING),
        (MAX_RATE_LIMIT_REQUEUES, S.FAILED),
        (MAX_RATE_LIMIT_REQUEUES + 5, S.FAILED),
    ],
)
def test_when_a_rate_limited_run_stops_being_given_back(rate_limited: int, goes_to: S) -> None:
    status = after_rate_limit(rate_limited)
    assert status is goes_to
    assert status in TRANSITIONS[S.RUNNING]


@pytest.mark.parametrize("rate_limited", [0, MAX_RATE_LIMIT_REQUEUES])
def test_a_run_given_back_after_a_cancel_was_asked_is_cancelled(rate_limited: int) -> None:
    """Requeued, it would be claimed again, and the claim starts an attempt with no cancel
    asked: the run would run again instead of ending cancelled."""
    status = after_rate_limit(rate_limited, cancel_requested=True)
    assert status is S.CANCELLED
    assert status in TRANSITIONS[S.RUNNING] and status in TRANSITIONS[S.CLAIMED]


def test_the_requeue_cap_is_read_when_deciding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.runs.MAX_RATE_LIMIT_REQUEUES", 2)
    assert [after_rate_limit(n) for n in range(4)] == [S.PENDING, S.PENDING, S.FAILED, S.FAILED]


def test_attempts_given_back_do_not_count() -> None:
    assert attempts_counted(attempts=5, rate_limited=2) == 3
    assert attempts_counted(attempts=1, rate_limited=0) == 1


@pytest.mark.parametrize(
    ("new", "sources"),
    [
        (S.CLAIMED, {S.PENDING}),  # the claim's guard
        (S.RUNNING, {S.CLAIMED}),  # the start's guard
        (S.LOST, {S.CLAIMED, S.RUNNING}),
        (S.PENDING, {S.CLAIMED, S.RUNNING, S.LOST}),
        (S.COMPLETED, {S.RUNNING}),
    ],
)
def test_bulk_guards_come_from_the_table(new: S, sources: set[S]) -> None:
    assert may_become(new) == sources
