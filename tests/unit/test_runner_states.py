"""The runner state table in ``corral.runners``, row by row, and what drains and stops
leave a runner in."""

from __future__ import annotations

import itertools

import pytest

from corral.errors import IllegalTransition
from corral.runners import (
    ALIVE,
    TRANSITIONS,
    RunnerState,
    check_runner_transition,
    state_after,
)

R = RunnerState
# The diagram in corral/runners.py, edge by edge.
DIAGRAM = {
    (R.ACTIVE, R.DRAINING),  # drain
    (R.DRAINING, R.STOPPED),  # leaves, or is stopped
    (R.ACTIVE, R.STOPPED),  # stop
    (R.LOST, R.STOPPED),  # stop
    (R.ACTIVE, R.LOST),  # silent
    (R.DRAINING, R.LOST),  # silent
    (R.DRAINING, R.ACTIVE),  # registers again
    (R.LOST, R.ACTIVE),  # registers again
    (R.STOPPED, R.ACTIVE),  # registers again
}


def test_the_table_draws_exactly_the_diagram() -> None:
    assert set(TRANSITIONS) == set(RunnerState)
    assert {(old, new) for old, targets in TRANSITIONS.items() for new in targets} == DIAGRAM


def test_alive_runners_are_active_or_draining() -> None:
    assert {R.ACTIVE, R.DRAINING} == ALIVE


@pytest.mark.parametrize(("old", "new"), sorted(itertools.product(R, R)))
def test_check_runner_transition(old: R, new: R) -> None:
    if (old, new) in DIAGRAM or old is new:
        check_runner_transition("rnr_x", old, new)
    else:
        with pytest.raises(IllegalTransition):
            check_runner_transition("rnr_x", old, new)


@pytest.mark.parametrize(
    ("old", "asked", "left_in"),
    [
        (R.ACTIVE, R.DRAINING, R.DRAINING),
        (R.DRAINING, R.DRAINING, R.DRAINING),  # drained twice
        (R.LOST, R.DRAINING, R.LOST),  # gone: nothing to drain
        (R.STOPPED, R.DRAINING, R.STOPPED),
        (R.ACTIVE, R.STOPPED, R.STOPPED),
        (R.DRAINING, R.STOPPED, R.STOPPED),
        (R.LOST, R.STOPPED, R.STOPPED),
        (R.STOPPED, R.STOPPED, R.STOPPED),  # stopped twice
    ],
)
def test_what_a_drain_or_a_stop_leaves(old: R, asked: R, left_in: R) -> None:
    assert state_after("rnr_x", old, asked) is left_in


def test_a_stopped_runner_cannot_be_declared_lost() -> None:
    with pytest.raises(IllegalTransition):
        state_after("rnr_x", R.STOPPED, R.LOST)
