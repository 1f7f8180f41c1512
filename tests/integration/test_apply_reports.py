"""A runner's batch of reports is applied in one transaction (``apply_reports``), on SQLite
and PostgreSQL: flat when every report is accepted, and when one is refused, the others
still take effect and the refused one changes nothing."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from corral.coordinator.link_core import Outcome, apply_reports, parse_events
from corral.errors import IllegalTransition, LeaseLost
from corral.protocol.messages import Indexed
from corral.runs import NewRun, RunStatus, RunType
from corral.store import Store
from corral.store.actors import Changes
from corral.store.db import SpoiltTransaction

NOW = 1_700_000_000.0


def events(*bodies: dict[str, Any]) -> list[Any]:
    return parse_events([Indexed(i, b) for i, b in enumerate(bodies, 1)])


def two_claimed_runs(store: Store) -> tuple[str, str, str]:
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=[], slots=2, version="t", transport="websocket", now=NOW
    )
    for _ in range(2):
        store.runs.create(NewRun(type=RunType.COMMAND, command=("true",)), NOW)
    a, b = store.runs.claim(runner.id, 2, NOW)
    return runner.id, a.id, b.id


def test_an_accepted_batch_takes_effect_with_what_then_writes(store: Store) -> None:
    runner_id, a, b = two_claimed_runs(store)
    batch = events(
        {"type": "started", "run_id": a, "attempt": 1},
        {"type": "started", "run_id": b, "attempt": 1},
        {"type": "finished", "run_id": a, "attempt": 1, "status": "completed", "exit_code": 0},
    )

    def then(outcomes: list[Outcome], _: Changes) -> int:
        store.commands.events_applied(runner_id, 3)
        return len(outcomes)

    applied = apply_reports(store, runner_id, batch, NOW + 1, then)
    assert applied.applied == 3
    assert [error for error, _ in applied.outcomes] == [None, None, None]
    finished = applied.outcomes[2][1]
    assert finished is not None and finished.status is RunStatus.COMPLETED
    assert [store.runs.get(r).status for r in (a, b)] == [RunStatus.COMPLETED, RunStatus.RUNNING]
    assert store.commands.state(runner_id).last_event_idx == 3


def test_start_reports_taken_together_keep_each_runs_order(store: Store) -> None:
    runner_id, a, b = two_claimed_runs(store)
    batch = events(
        {"type": "finished", "run_id": a, "attempt": 1, "status": "failed", "exit_code": 1},
        {"type": "started", "run_id": b, "attempt": 1},
        {"type": "started", "run_id": a, "attempt": 1},  # after its final report: refused
        {"type": "started", "run_id": b, "attempt": 1},  # a repeat: moot
    )
    applied = apply_reports(store, runner_id, batch, NOW + 1, lambda outcomes, _: None)
    errors = [error for error, _ in applied.outcomes]
    assert errors[0] is None and errors[1] is None and errors[3] is None
    assert isinstance(errors[2], IllegalTransition)  # a failed run does not start
    assert [store.runs.get(r).status for r in (a, b)] == [RunStatus.FAILED, RunStatus.RUNNING]


def test_start_reports_taken_together_refuse_only_the_one_not_leased(store: Store) -> None:
    runner_id, a, b = two_claimed_runs(store)
    batch = events(
        {"type": "started", "run_id": a, "attempt": 1},
        {"type": "started", "run_id": b, "attempt": 2},  # not its lease
        {"type": "finished", "run_id": a, "attempt": 1, "status": "completed", "exit_code": 0},
    )
    applied = apply_reports(store, runner_id, batch, NOW + 1, lambda outcomes, _: None)
    errors = [error for error, _ in applied.outcomes]
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], LeaseLost)
    assert [store.runs.get(r).status for r in (a, b)] == [RunStatus.COMPLETED, RunStatus.CLAIMED]


def test_final_reports_taken_together_keep_each_runs_order(store: Store) -> None:
    runner_id, a, b = two_claimed_runs(store)
    batch = events(
        {"type": "started", "run_id": a, "attempt": 1},
        {"type": "finished", "run_id": a, "attempt": 1, "status": "completed", "exit_code": 0},
        {"type": "started", "run_id": b, "attempt": 1},
        {"type": "session", "run_id": b, "attempt": 1, "session_id": "s-1"},
        {"type": "finished", "run_id": b, "attempt": 1, "status": "failed", "exit_code": 2},
        {"type": "finished", "run_id": b, "attempt": 1, "status": "failed", "exit_code": 2},
    )
    applied = apply_reports(store, runner_id, batch, NOW + 1, lambda outcomes, _: None)
    assert [error for error, _ in applied.outcomes] == [None] * 6
    ended = [run.status if run else None for _, run in applied.outcomes]
    assert ended == [None, RunStatus.COMPLETED, None, None, RunStatus.FAILED, RunStatus.FAILED]
    done_b = store.runs.get(b)
    assert (done_b.status, done_b.exit_code, done_b.session_id) == (RunStatus.FAILED, 2, "s-1")
    assert store.runs.get(a).status is RunStatus.COMPLETED


def test_a_refused_report_changes_nothing_and_the_others_still_count(store: Store) -> None:
    runner_id, a, b = two_claimed_runs(store)
    batch = events(
        {"type": "started", "run_id": a, "attempt": 1},
        {"type": "finished", "run_id": b, "attempt": 7, "status": "failed"},  # not its lease
        {"type": "finished", "run_id": a, "attempt": 1, "status": "completed", "exit_code": 0},
    )
    calls: list[int] = []

    def then(outcomes: list[Outcome], _: Changes) -> None:
        calls.append(len(outcomes))
        store.commands.events_applied(runner_id, 3)

    applied = apply_reports(store, runner_id, batch, NOW + 1, then)
    errors = [error for error, _ in applied.outcomes]
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], LeaseLost)
    assert calls == [3]  # the flat try was undone before its ``then``; this one committed
    assert store.runs.get(a).status is RunStatus.COMPLETED
    assert store.runs.get(b).status is RunStatus.CLAIMED  # untouched
    assert store.commands.state(runner_id).last_event_idx == 3


def test_a_failure_inside_a_flat_transaction_undoes_all_of_it(store: Store) -> None:
    run_id = store.runs.create(NewRun(type=RunType.COMMAND, command=("true",)), NOW).id
    with pytest.raises(LeaseLost), store.db.transaction(flat=True):
        store.runs.request_cancel(run_id, NOW)  # joins the flat transaction: no savepoint
        raise LeaseLost("a later report is refused")
    assert store.runs.get(run_id).status is RunStatus.PENDING


def test_a_failure_caught_inside_a_flat_transaction_still_undoes_all_of_it(store: Store) -> None:
    run_id = store.runs.create(NewRun(type=RunType.COMMAND, command=("true",)), NOW).id
    with pytest.raises(SpoiltTransaction), store.db.transaction(flat=True):
        store.runs.request_cancel(run_id, NOW)
        with contextlib.suppress(LeaseLost), store.db.transaction():  # joins: no savepoint
            store.runs.create(NewRun(type=RunType.COMMAND, command=("half",)), NOW)
            raise LeaseLost("refused, and its caller goes on")
    assert store.runs.get(run_id).status is RunStatus.PENDING
    assert [run.id for run in store.runs.list()] == [run_id]


def test_a_flat_savepoint_spoilt_inside_undoes_only_itself(store: Store) -> None:
    with store.db.transaction():
        kept = store.runs.create(NewRun(type=RunType.COMMAND, command=("kept",)), NOW).id
        with pytest.raises(SpoiltTransaction), store.db.transaction(flat=True):
            store.runs.create(NewRun(type=RunType.COMMAND, command=("undone",)), NOW)
            with contextlib.suppress(LeaseLost), store.db.transaction():
                raise LeaseLost("refused, and its caller goes on")
    assert [run.id for run in store.runs.list()] == [kept]
