"""The run status transition table in ``corral.runs``: the one place that says what may
happen to a run. Legal moves pass, everything else raises ``IllegalTransition``."""

from __future__ import annotations

import itertools

import pytest

from corral.cli import follow
from corral.errors import Conflict, IllegalTransition
from corral.runs import (
    LATE_REPORT,
    TERMINAL,
    TRANSITIONS,
    RunReport,
    RunStatus,
    check_transition,
)

S = RunStatus
LEGAL = sorted((old, new) for old, targets in TRANSITIONS.items() for new in targets)
ILLEGAL = sorted(
    (old, new)
    for old, new in itertools.product(RunStatus, RunStatus)
    if new not in TRANSITIONS[old]
)


def test_every_status_has_a_row() -> None:
    assert set(TRANSITIONS) == set(RunStatus)
    assert all(new in set(RunStatus) for targets in TRANSITIONS.values() for new in targets)


@pytest.mark.parametrize(("old", "new"), LEGAL, ids=[f"{o}->{n}" for o, n in LEGAL])
def test_legal_transitions_pass(old: RunStatus, new: RunStatus) -> None:
    check_transition("run_x", old, new)


@pytest.mark.parametrize(("old", "new"), ILLEGAL, ids=[f"{o}->{n}" for o, n in ILLEGAL])
def test_every_other_transition_is_illegal(old: RunStatus, new: RunStatus) -> None:
    with pytest.raises(IllegalTransition):
        check_transition("run_x", old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.COMPLETED, S.RUNNING),
        (S.PENDING, S.COMPLETED),
        (S.PENDING, S.RUNNING),
        (S.FAILED, S.PENDING),
        (S.CANCELLED, S.PENDING),
        (S.TIMED_OUT, S.COMPLETED),
        (S.LOST, S.RUNNING),
        (S.LOST, S.COMPLETED),
        (S.RUNNING, S.CLAIMED),
        (S.RUNNING, S.RUNNING),
    ],
)
def test_sample_of_illegal_transitions(old: RunStatus, new: RunStatus) -> None:
    with pytest.raises(IllegalTransition) as caught:
        check_transition("run_abc", old, new)
    error = caught.value
    assert isinstance(error, Conflict)
    assert error.code == "illegal_transition"
    assert error.http_status == 409
    assert str(old) in error.message and str(new) in error.message
    assert "run_abc" in error.message
    assert error.details == {"run_id": "run_abc", "status": str(old)}
    assert error.to_dict()["error"]["code"] == "illegal_transition"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.PENDING, S.CLAIMED),  # claim
        (S.CLAIMED, S.RUNNING),  # start
        (S.RUNNING, S.COMPLETED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.TIMED_OUT),
        (S.RUNNING, S.CANCELLED),
        (S.CLAIMED, S.LOST),
        (S.RUNNING, S.LOST),
        (S.LOST, S.PENDING),  # attempts left
        (S.LOST, S.FAILED),  # none left
        (S.RUNNING, S.PENDING),  # rate limit: the attempt is given back
        (S.PENDING, S.CANCELLED),
        (S.CLAIMED, S.CANCELLED),
        (S.CLAIMED, S.FAILED),  # could not spawn
    ],
)
def test_the_documented_paths_are_in_the_table(old: RunStatus, new: RunStatus) -> None:
    assert new in TRANSITIONS[old]


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_terminal_states_have_no_way_out(status: RunStatus) -> None:
    assert status.is_terminal
    assert TRANSITIONS[status] == frozenset()
    for new in RunStatus:
        with pytest.raises(IllegalTransition):
            check_transition("run_x", status, new)


def test_terminal_is_exactly_the_states_without_exits() -> None:
    assert {s for s, targets in TRANSITIONS.items() if not targets} == set(TERMINAL)
    assert {S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT} == TERMINAL
    assert not S.LOST.is_terminal  # requeued, or it waits for a late report, then fails


def test_only_claimed_and_running_hold_a_lease() -> None:
    assert {s for s in RunStatus if s.holds_lease} == {S.CLAIMED, S.RUNNING}


@pytest.mark.parametrize("status", sorted(TERMINAL | {S.PENDING}))
def test_run_report_accepts_what_a_runner_can_report(status: RunStatus) -> None:
    report = RunReport(status=status, exit_code=0)
    assert report.status is status


@pytest.mark.parametrize("status", [S.CLAIMED, S.RUNNING, S.LOST])
def test_run_report_refuses_what_a_runner_cannot_report(status: RunStatus) -> None:
    with pytest.raises(ValueError, match=f"cannot report status {status}"):
        RunReport(status=status)


def test_the_cli_knows_the_same_terminal_states() -> None:
    assert follow.TERMINAL is TERMINAL
    assert {"completed", "failed", "cancelled", "timed_out"} == TERMINAL  # the API's strings


@pytest.mark.parametrize("waiting", [S.PENDING, S.LOST])
@pytest.mark.parametrize("new", sorted(TERMINAL))
def test_only_a_late_report_ends_a_waiting_run_as_it_ended(
    waiting: RunStatus, new: RunStatus
) -> None:
    """A late final report (``LATE_REPORT``) may end a run that waits for its attempt: back
    at pending (attempts left), or lost (none left, for a grace); nothing else may, and it
    may end nothing else that way."""
    assert new in LATE_REPORT[waiting]
    check_transition("run_x", waiting, new, late=True)
    if new not in TRANSITIONS[waiting]:
        with pytest.raises(IllegalTransition):
            check_transition("run_x", waiting, new)
    assert set(LATE_REPORT) == {S.PENDING, S.LOST}
    for other in (S.CLAIMED, S.RUNNING, *TERMINAL):
        if new not in TRANSITIONS[other]:
            with pytest.raises(IllegalTransition):
                check_transition("run_x", other, new, late=True)
