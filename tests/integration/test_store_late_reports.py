"""Late final reports, on SQLite and PostgreSQL: a runner finished an attempt, but its lease
ran out before the report was stored, and the run went back to pending for that attempt.
The report still ends the run while nobody has claimed it since; a cancel, a new claim or
another end refuses it and changes nothing (issue 16 §2: never run finished work twice).
With no attempt left, the run waits lost instead, for a grace (its runner's threshold): the
report still ends it as reported (done work is not recorded as failed); a cancel ends it;
after the grace the reconciler fails it, once.

Every operation gets an explicit ``now``; nothing sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest

import corral.store.task_runs as task_runs
from corral.errors import IllegalTransition, LeaseLost
from corral.events import EventFilter, EventKind
from corral.ids import RunnerId
from corral.runners import RunnerState
from corral.runs import NewRun, Run, RunReport, RunStatus, RunType
from corral.store import LogLine, Store
from corral.store.events import EventStore
from corral.tasks.model import TaskSpec, TaskStatus

NOW = 1_700_000_000.0
LOST_AFTER = 30.0
LOST_AT = NOW + LOST_AFTER + 10  # the holder has been silent past its threshold by then
LATER = LOST_AT + 1


def register(store: Store, name: str, now: float = NOW) -> RunnerId:
    runner, _ = store.runners.register(
        name=name, hostname=name, labels=(), slots=4, version="0", transport="http", now=now
    )
    return runner.id


def started_by(store: Store, runner: RunnerId, max_attempts: int = 3, **kw: Any) -> Run:
    store.runs.create(
        NewRun(type=RunType.COMMAND, command=("true",), max_attempts=max_attempts, **kw), NOW
    )
    (run,) = store.runs.claim(runner, 1, NOW)
    store.runs.mark_started(run.id, runner, run.attempts, NOW)
    return run


def declare_lost(store: Store, runner: RunnerId) -> None:
    lost = store.reconcile(LOST_AT, lost_after_s=LOST_AFTER, timeout_grace_s=5)
    assert lost.lost_runners == [runner]


def reconcile(store: Store, now: float) -> list[str]:
    """A reconciler's pass at ``now``: the runs it failed."""
    return list(store.reconcile(now, lost_after_s=LOST_AFTER, timeout_grace_s=5).failed)


def report(
    store: Store, run: Run, runner: RunnerId, status: RunStatus = RunStatus.COMPLETED, **kw: Any
) -> Run:
    return store.runs.finish(run.id, runner, run.attempts, RunReport(status, **kw), LATER)


def run_events(store: Store, run: Run) -> list[dict[str, Any]]:
    events = EventStore(store.db)
    events.number()
    where = EventFilter(kinds=frozenset({EventKind.RUN}), run_id=run.id)
    return [dict(e.data) | {"runner_id": e.runner_id} for e in events.read(0, where, 10_000)]


# ---- accepted ------------------------------------------------------------------------------


def test_a_late_report_ends_the_run_waiting_for_its_attempt(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    waiting = store.runs.get(run.id)
    assert waiting.status is RunStatus.PENDING and waiting.runner_id is None
    assert waiting.attempts == 1

    ended = report(store, run, old, exit_code=0, result="done")

    assert ended.status is RunStatus.COMPLETED
    assert (ended.attempts, ended.runner_id, ended.exit_code, ended.result) == (1, old, 0, "done")
    assert ended.finished_at == LATER
    assert store.runs.get(run.id) == ended
    # Nobody may claim it now: it is done.
    assert store.runs.claim(register(store, "other", LATER), 1, LATER + 1) == []
    # The event log tells it as it happened: lost, pending, then completed by "old".
    statuses = [(e["status"], e["runner_id"]) for e in run_events(store, run)]
    assert statuses[-3:] == [("lost", old), ("pending", None), ("completed", old)]


def test_a_repeated_late_report_changes_nothing(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    first = report(store, run, old)
    assert report(store, run, old) == first


def test_a_report_before_the_lost_runner_was_noticed_is_on_time(store: Store) -> None:
    """The lease ran out on the runner's side, but the coordinator has not declared it
    lost yet: the run is still held by the old identity, and its report ends it."""
    old = register(store, "old")
    run = started_by(store, old)
    assert report(store, run, old).status is RunStatus.COMPLETED


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED])
def test_a_late_report_ends_the_run_as_it_ended(store: Store, status: RunStatus) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    assert report(store, run, old, status, exit_code=3).status is status


def test_late_logs_and_session_are_kept_and_a_late_start_is_moot(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    store.runs.mark_started(run.id, old, 1, LATER)  # the run stays pending
    assert store.runs.get(run.id).status is RunStatus.PENDING
    store.logs.append(run.id, old, 1, [LogLine(0, "stdout", "the last line", LATER)])
    store.runs.record_session(run.id, old, 1, "sess-1", LATER)
    ended = report(store, run, old, session_id="sess-1", cost_usd=0.5)
    assert [e.text for e in store.logs.read(run.id)] == ["the last line"]
    assert ended.session_id == "sess-1"
    session = store.sessions.get("sess-1")
    assert session.last_run_id == run.id and session.cost_usd == 0.5


def test_a_late_give_back_changes_nothing(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    given = report(store, run, old, RunStatus.PENDING, retry_after_s=5.0)
    assert given.status is RunStatus.PENDING and given.rate_limited == 0
    assert store.runs.get(run.id).available_at == LOST_AT


# ---- refused -------------------------------------------------------------------------------


def test_a_late_report_after_another_claim_is_refused(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    other = register(store, "other", LOST_AT)
    (again,) = store.runs.claim(other, 1, LOST_AT)
    assert again.attempts == 2
    with pytest.raises(LeaseLost):
        report(store, run, old)
    still = store.runs.get(run.id)
    assert (still.status, still.runner_id, still.attempts) == (RunStatus.CLAIMED, other, 2)
    with pytest.raises(LeaseLost):
        store.logs.append(run.id, old, 1, [LogLine(0, "stdout", "late", LATER)])


def test_a_late_report_after_a_cancel_is_refused(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    store.runs.request_cancel(run.id, LOST_AT)
    with pytest.raises(LeaseLost):
        report(store, run, old)
    assert store.runs.get(run.id).status is RunStatus.CANCELLED


def test_a_late_report_from_another_runner_is_refused(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    stranger = register(store, "stranger", LOST_AT)
    with pytest.raises(LeaseLost):
        report(store, run, stranger)
    with pytest.raises(LeaseLost):
        store.runs.finish(run.id, old, 2, RunReport(RunStatus.COMPLETED), LATER)  # no attempt 2
    assert store.runs.get(run.id).status is RunStatus.PENDING


def test_an_attempt_given_back_takes_no_late_report_of_an_earlier_one(store: Store) -> None:
    """ "old" lost attempt 1; "other" claimed attempt 2 and gave it back (rate limited): the
    run waits at pending again, but for attempt 2, which "old" never held."""
    old = register(store, "old")
    run = started_by(store, old)
    declare_lost(store, old)
    other = register(store, "other", LOST_AT)
    assert [r.attempts for r in store.runs.claim(other, 1, LOST_AT)] == [2]
    store.runs.mark_started(run.id, other, 2, LOST_AT)
    store.runs.finish(run.id, other, 2, RunReport(RunStatus.PENDING, retry_after_s=0), LOST_AT)
    with pytest.raises(LeaseLost):
        report(store, run, old)
    with pytest.raises(LeaseLost):  # nor a late one of its own: it gave it back
        store.runs.finish(run.id, other, 2, RunReport(RunStatus.COMPLETED), LATER)
    assert store.runs.get(run.id).status is RunStatus.PENDING


# ---- the last attempt: lost, for a grace -----------------------------------------------------

# The lost runner's threshold (here the coordinator's) again, from the loss: the grace is over.
GRACE_OVER = LOST_AT + LOST_AFTER + 1


def lost_last_attempt(store: Store, runner: RunnerId, **kw: Any) -> Run:
    run = started_by(store, runner, max_attempts=1, **kw)
    declare_lost(store, runner)
    return run


def test_a_run_lost_with_no_attempt_left_waits_lost_for_its_runner(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old, max_attempts=1)
    result = store.reconcile(LOST_AT, lost_after_s=LOST_AFTER, timeout_grace_s=5)
    assert (result.waiting, result.failed, result.requeued) == ([run.id], [], [])
    waiting = store.runs.get(run.id)
    assert (waiting.status, waiting.runner_id, waiting.attempts) == (RunStatus.LOST, old, 1)
    assert (waiting.finished_at, waiting.error) == (None, f"runner {old} was lost")
    # Its grace counts from the loss, by the coordinator's threshold (the runner has none).
    assert waiting.lost_at == LOST_AT
    assert store.runs.grace_ends_at(run.id, LOST_AFTER) == LOST_AT + LOST_AFTER
    # Nobody may claim it (it is not pending), and within its grace nothing fails it.
    assert store.runs.claim(register(store, "other", LOST_AT), 1, LATER) == []
    assert reconcile(store, GRACE_OVER - 2) == []
    assert store.runs.get(run.id).status is RunStatus.LOST


def test_a_late_report_in_the_grace_ends_the_run_as_reported(store: Store) -> None:
    old = register(store, "old")
    run = lost_last_attempt(store, old, session_name="fix")
    store.logs.append(run.id, old, 1, [LogLine(0, "stdout", "the last line", LATER)])

    ended = report(store, run, old, exit_code=0, result="done", cost_usd=0.25, session_id="sess-1")

    assert (ended.status, ended.exit_code, ended.result, ended.error) == (
        RunStatus.COMPLETED,
        0,
        "done",
        None,
    )
    assert (ended.cost_usd, ended.session_id, ended.runner_id, ended.attempts) == (
        0.25,
        "sess-1",
        old,
        1,
    )
    assert ended.finished_at == LATER
    assert store.runs.get(run.id) == ended
    assert [e.text for e in store.logs.read(run.id)] == ["the last line"]
    session = store.sessions.get("sess-1")
    assert (session.last_run_id, session.cost_usd, session.runs) == (run.id, 0.25, 1)
    statuses = [(e["status"], e["runner_id"]) for e in run_events(store, run)]
    assert statuses[-2:] == [("lost", old), ("completed", old)]
    # A repeat of the report changes nothing; the grace's end finds nothing to fail.
    assert report(store, run, old, exit_code=0, result="done") == ended
    assert reconcile(store, GRACE_OVER) == []
    assert store.runs.get(run.id) == ended
    assert [e["status"] for e in run_events(store, run)].count("completed") == 1


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.TIMED_OUT])
def test_a_late_failure_in_the_grace_is_recorded_as_reported(
    store: Store, status: RunStatus
) -> None:
    old = register(store, "old")
    run = lost_last_attempt(store, old)
    ended = report(store, run, old, status, exit_code=3, error="tests failed")
    assert (ended.status, ended.exit_code, ended.error) == (status, 3, "tests failed")
    assert reconcile(store, GRACE_OVER) == []
    assert store.runs.get(run.id) == ended


def test_in_the_grace_a_report_from_another_runner_or_attempt_is_refused(store: Store) -> None:
    old = register(store, "old")
    run = lost_last_attempt(store, old)
    stranger = register(store, "stranger", LOST_AT)
    with pytest.raises(LeaseLost):
        report(store, run, stranger)
    with pytest.raises(LeaseLost):
        store.runs.finish(run.id, old, 2, RunReport(RunStatus.COMPLETED), LATER)  # no attempt 2
    with pytest.raises(LeaseLost):
        store.logs.append(run.id, stranger, 1, [LogLine(0, "stdout", "not mine", LATER)])
    assert store.runs.get(run.id).status is RunStatus.LOST
    # It still waits for its own runner's report.
    assert report(store, run, old).status is RunStatus.COMPLETED


def test_a_late_give_back_in_the_grace_changes_nothing(store: Store) -> None:
    old = register(store, "old")
    run = lost_last_attempt(store, old)
    given = report(store, run, old, RunStatus.PENDING, retry_after_s=5.0)
    assert (given.status, given.rate_limited) == (RunStatus.LOST, 0)
    assert reconcile(store, GRACE_OVER) == [run.id]


def test_a_cancel_in_the_grace_ends_it_cancelled(store: Store) -> None:
    old = register(store, "old")
    run = lost_last_attempt(store, old)
    cancelled = store.runs.request_cancel(run.id, LATER)
    assert (cancelled.status, cancelled.finished_at) == (RunStatus.CANCELLED, LATER)
    with pytest.raises(IllegalTransition):  # ended: its report comes too late
        report(store, run, old)
    assert reconcile(store, GRACE_OVER) == []
    assert store.runs.get(run.id) == cancelled
    assert [e["status"] for e in run_events(store, run)][-2:] == ["lost", "cancelled"]


def test_after_its_grace_the_reconciler_fails_it_once(store: Store, store_url: str) -> None:
    """With the same error as a lost last attempt always had; from two handles on the
    database (two coordinators), one after the other: one transition, one event."""
    old = register(store, "old")
    run = lost_last_attempt(store, old)
    other = Store.open(store_url)
    try:
        assert reconcile(store, GRACE_OVER) == [run.id]
        assert reconcile(other, GRACE_OVER + 1) == []
        assert reconcile(store, GRACE_OVER + 2) == []
    finally:
        other.close()
    failed = store.runs.get(run.id)
    assert (failed.status, failed.finished_at, failed.runner_id) == (
        RunStatus.FAILED,
        GRACE_OVER,
        old,
    )
    assert failed.error == f"runner {old} was lost; no attempts left (1/1)"
    statuses = [e["status"] for e in run_events(store, run)]
    assert statuses[-2:] == ["lost", "failed"] and statuses.count("failed") == 1
    # Its runner's report, later still, is refused: ended runs never move.
    with pytest.raises(IllegalTransition):
        report(store, run, old)
    assert store.runs.get(run.id) == failed


def test_the_grace_is_the_lost_runners_own_threshold(store: Store) -> None:
    """A runner that told its own threshold (a WebSocket runner's) gets its runs' grace by
    it, not by the coordinator's default."""
    runner, _ = store.runners.register(
        name="ws",
        hostname="ws",
        labels=(),
        slots=1,
        version="0",
        transport="websocket",
        now=NOW,
        lost_after_s=10.0,
    )
    run = lost_last_attempt(store, runner.id)
    assert store.runs.grace_ends_at(run.id, LOST_AFTER) == LOST_AT + 10
    assert reconcile(store, LOST_AT + 10) == []
    assert reconcile(store, LOST_AT + 11) == [run.id]
    # Ended, it waits no more; when it was lost stays told.
    assert store.runs.grace_ends_at(run.id, LOST_AFTER) is None
    assert store.runs.get(run.id).lost_at == LOST_AT


def test_a_last_attempt_its_runner_no_longer_reports_waits_lost_too(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old, max_attempts=1)
    store.runners.heartbeat(old, [], NOW + 20)  # holds nothing, past the claim's grace
    waiting = store.runs.get(run.id)
    assert (waiting.status, waiting.error) == (RunStatus.LOST, f"runner {old} no longer reports it")
    ended = report(store, run, old, exit_code=0)
    assert (ended.status, ended.exit_code) == (RunStatus.COMPLETED, 0)


def test_a_last_attempt_its_runner_no_longer_reports_fails_after_the_grace(store: Store) -> None:
    old = register(store, "old")
    run = started_by(store, old, max_attempts=1)
    store.runners.heartbeat(old, [], NOW + 20)
    store.runners.heartbeat(old, [], NOW + 50)  # alive all along
    assert reconcile(store, NOW + 20 + LOST_AFTER - 1) == []
    assert reconcile(store, NOW + 20 + LOST_AFTER + 1) == [run.id]
    failed = store.runs.get(run.id)
    assert failed.error == f"runner {old} no longer reports it; no attempts left (1/1)"


def test_a_last_attempt_of_a_stopped_runner_fails_at_once(store: Store) -> None:
    """Stopped (told to, or known dead: a new ``tasks run`` finds its local runner's process
    gone), not lost: no report of it is waited for."""
    old = register(store, "old")
    run = started_by(store, old, max_attempts=1)
    store.runners.set_state(old, RunnerState.STOPPED, LATER)
    failed = store.runs.get(run.id)
    assert (failed.status, failed.finished_at) == (RunStatus.FAILED, LATER)
    assert failed.error == "runner stopped; no attempts left (1/1)"


# ---- task runs -----------------------------------------------------------------------------


def test_a_late_report_of_a_task_run_settles_its_task(store: Store) -> None:
    """The attempt merged its task before its runner's lease ran out: the late report
    completes the task with its merge, and its dependent becomes ready, once."""
    pid, run, old = task_a_run_lost(store)
    store.runs.record_task_step(run.id, old, 1, "merging", {"at": LATER}, LATER)
    outcome = {"outcome": "merged", "commit": "c1", "merge_commit": "m1"}
    ended = report(store, run, old, task=outcome)
    assert ended.status is RunStatus.COMPLETED
    tasks = {t.key: t for t in store.tasks.list(pid)}
    assert tasks["a"].status is TaskStatus.COMPLETED
    assert (tasks["a"].merge_sha, tasks["a"].attempts) == ("m1", 1)
    assert tasks["b"].status in (TaskStatus.READY, TaskStatus.CLAIMED)
    # Only b's run is left to claim: a is not run again.
    claimed = store.runs.claim(register(store, "other", LATER), 10, LATER + 1)
    assert [r.task_id for r in claimed] == [tasks["b"].id]


def task_run_lost_for_good(store: Store, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Run]:
    """Tasks a, then b after a; a's run (its only attempt) lost by its runner "old"."""
    monkeypatch.setattr(task_runs, "TASK_RUN_ATTEMPTS", 1)
    pid, run, _ = task_a_run_lost(store, retry_backoff_s=0.0)
    assert store.runs.get(run.id).status is RunStatus.LOST
    return pid, run


def task_a_run_lost(store: Store, **project: float) -> tuple[str, Run, RunnerId]:
    """Tasks a, then b after a; a's run started by runner "old", which is then lost."""
    pid = store.projects.ensure("/repo", "main", NOW, **project).id
    store.tasks.add(
        pid,
        [
            TaskSpec(key="a", title="a", prompt="do a"),
            TaskSpec(key="b", title="b", prompt="do b", after=("a",)),
        ],
        {},
        NOW,
    )
    store.tasks.start(pid, 1, NOW)
    old = register(store, "old")
    (run,) = store.runs.claim(old, 1, NOW)
    store.runs.mark_started(run.id, old, 1, NOW)
    store.runs.record_task_step(run.id, old, 1, "worktree", {"at": NOW}, NOW)
    declare_lost(store, old)
    return pid, run, old


def test_a_late_report_in_the_grace_settles_its_task_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, run = task_run_lost_for_good(store, monkeypatch)
    a = {t.key: t for t in store.tasks.list(pid)}["a"]
    assert (a.status, a.run_id, a.attempts, a.interrupted) == (
        TaskStatus.IN_PROGRESS,
        run.id,
        1,
        True,
    )
    other = register(store, "other", LOST_AT)
    assert store.runs.claim(other, 10, LATER) == []  # a waits: not retried meanwhile

    outcome = {"outcome": "merged", "commit": "c1", "merge_commit": "m1"}
    assert report(store, run, RunnerId(str(run.runner_id)), task=outcome).status is (
        RunStatus.COMPLETED
    )
    assert reconcile(store, GRACE_OVER) == []
    tasks = {t.key: t for t in store.tasks.list(pid)}
    assert (tasks["a"].status, tasks["a"].merge_sha, tasks["a"].attempts) == (
        TaskStatus.COMPLETED,
        "m1",
        1,
    )
    claimed = store.runs.claim(register(store, "third", GRACE_OVER), 10, GRACE_OVER)
    assert [r.task_id for r in claimed] == [tasks["b"].id]  # b's run only: a is not run again


def test_a_task_run_failed_after_its_grace_retries_its_task_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, run = task_run_lost_for_good(store, monkeypatch)
    assert reconcile(store, GRACE_OVER) == [run.id]
    assert reconcile(store, GRACE_OVER + 1) == []
    a = {t.key: t for t in store.tasks.list(pid)}["a"]
    assert a.attempts == 2 and a.run_id != run.id  # retried once, in a new run
    assert "no attempts left (1/1)" in (a.last_error or "")
    runs = store.runs.list(limit=10)
    assert sorted(r.status for r in runs if r.task_id == a.id) == sorted(
        [RunStatus.FAILED, RunStatus.PENDING]
    )
    # Its runner's report of the failed run, later still, changes nothing.
    with pytest.raises(IllegalTransition):
        report(store, run, RunnerId(str(run.runner_id)), task={"outcome": "merged"})
    assert {t.key: t for t in store.tasks.list(pid)}["a"].attempts == 2
