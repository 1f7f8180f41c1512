"""Task graphs in the store, on both backends: importing plans, claiming ready tasks into
runs, settling attempts through the run API, failures, retries, budgets, cancels.

Every operation gets an explicit ``now``; nothing sleeps. The last test is PostgreSQL
only: many blockers completed at once by concurrent Stores never strand a dependent.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from corral.errors import Conflict, InvalidRequest
from corral.ids import RunnerId
from corral.runs import NewRun, Run, RunReport, RunStatus, RunType
from corral.store import Store
from corral.store.commands import START_RUN
from corral.tasks.model import Project, Task, TaskSpec, TaskStatus

NOW = 1_700_000_000.0
S = TaskStatus

postgres_only = pytest.mark.parametrize(
    "dialect", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


# ---- helpers ---------------------------------------------------------------------------------


def spec(key: str, *after: str, **kw: Any) -> TaskSpec:
    return TaskSpec(
        key=key, title=kw.pop("title", f"task {key}"), prompt=f"do {key}", after=after, **kw
    )


def project(store: Store, now: float = NOW, **settings: Any) -> Project:
    return store.projects.ensure("/repo", "main", now, **settings)


def tasks_by_key(store: Store, pid: str) -> dict[str, Task]:
    return {t.key: t for t in store.tasks.list(pid)}


def statuses(store: Store, pid: str) -> dict[str, TaskStatus]:
    return {k: t.status for k, t in tasks_by_key(store, pid).items()}


def register(store: Store, name: str = "r1", now: float = NOW) -> RunnerId:
    runner, _ = store.runners.register(
        name=name, hostname=name, labels=(), slots=64, version="0", transport="http", now=now
    )
    return runner.id


def task_updates(store: Store) -> list[tuple[str, float]]:
    with store.db.transaction(write=False) as tx:
        rows = tx.execute("SELECT key, updated_at FROM tasks ORDER BY key")
    return [(r["key"], r["updated_at"]) for r in rows]


def task_runs(store: Store) -> list[Run]:
    return [r for r in store.runs.list(limit=100_000) if r.type is RunType.TASK]


def claim_all(store: Store, runner: RunnerId, now: float) -> dict[str, Run]:
    """Claim every pending run for ``runner``; by task id."""
    return {str(r.task_id): r for r in store.runs.claim(runner, 10_000, now)}


def finish(
    store: Store,
    run: Run,
    now: float,
    *,
    status: RunStatus = RunStatus.COMPLETED,
    cost: float | None = None,
    error: str | None = None,
    agent_step: dict[str, Any] | None = None,
    **task: Any,
) -> Run:
    assert run.runner_id is not None
    store.runs.mark_started(run.id, run.runner_id, run.attempts, now)  # a no-op if it was
    # As a runner does, the attempt reports its worktree before anything else (a task
    # still ``claimed`` can fail but not complete: see the task transition table).
    store.runs.record_task_step(run.id, run.runner_id, run.attempts, "worktree", {"at": now}, now)
    if agent_step is not None:
        store.runs.record_task_step(run.id, run.runner_id, run.attempts, "agent", agent_step, now)
    report = RunReport(status=status, cost_usd=cost, error=error, task=task or None)
    return store.runs.finish(run.id, run.runner_id, run.attempts, report, now)


def run_task_once(
    store: Store, runner: RunnerId, pid: str, key: str, now: float, **finish_kw: Any
) -> Run:
    """Claim the run of task ``key`` (already scheduled) unless held already; finish it."""
    task = tasks_by_key(store, pid)[key]
    assert task.status is S.CLAIMED and task.run_id, f"{key} is {task.status}"
    run = store.runs.get(task.run_id)
    if run.status is RunStatus.PENDING:
        run = claim_all(store, runner, now)[task.id]
    return finish(store, run, now, **finish_kw)


def fail_task_once(
    store: Store,
    runner: RunnerId,
    pid: str,
    key: str,
    now: float,
    *,
    error: str,
    cost: float | None = None,
) -> Run:
    """``run_task_once`` for an attempt whose agent failed with ``error``."""
    return run_task_once(
        store,
        runner,
        pid,
        key,
        now,
        status=RunStatus.FAILED,
        cost=cost,
        error=error,
        outcome="agent_failed",
    )


# ---- importing -------------------------------------------------------------------------------


def test_add_tasks_sets_statuses_and_counters(store: Store) -> None:
    pid = project(store).id
    result = store.tasks.add(
        pid, [spec("a"), spec("b"), spec("c", "a"), spec("d", "a", "b"), spec("e", "d")], {}, NOW
    )
    assert result.created == ["a", "b", "c", "d", "e"]
    tasks = tasks_by_key(store, pid)
    assert {k: t.status for k, t in tasks.items()} == {
        "a": S.READY,
        "b": S.READY,
        "c": S.BLOCKED,
        "d": S.BLOCKED,
        "e": S.BLOCKED,
    }
    assert {k: t.remaining_blockers for k, t in tasks.items()} == {
        "a": 0,
        "b": 0,
        "c": 1,
        "d": 2,
        "e": 1,
    }
    assert tasks["d"].blocked_by == ("a", "b")
    assert all(t.attempts == 0 and t.run_id is None for t in tasks.values())


def test_reimport_is_idempotent_and_changes_only_content(store: Store) -> None:
    pid = project(store).id
    plan = [spec("a"), spec("b", "a"), spec("c", "b")]
    store.tasks.add(pid, plan, {}, NOW)
    before, updates = store.tasks.list(pid), task_updates(store)

    again = store.tasks.add(pid, plan, {}, NOW + 10)
    assert (again.created, again.updated, again.unchanged) == ([], [], ["a", "b", "c"])
    assert store.tasks.list(pid) == before
    assert task_updates(store) == updates  # nothing written

    changed = [spec("a"), spec("b", "a", title="b, better"), spec("c", "b")]
    result = store.tasks.add(pid, changed, {}, NOW + 20)
    assert (result.created, result.updated, result.unchanged) == ([], ["b"], ["a", "c"])
    b = tasks_by_key(store, pid)["b"]
    assert b.title == "b, better" and b.status is S.BLOCKED and b.remaining_blockers == 1


def test_tasks_may_come_before_their_blockers(store: Store) -> None:
    """Order inside a plan does not matter: a task may name blockers listed after it."""
    pid = project(store).id
    result = store.tasks.add(
        pid, [spec("d", "c", "b"), spec("c", "a"), spec("b", "a"), spec("a")], {}, NOW
    )
    assert result.created == ["d", "c", "b", "a"]
    tasks = tasks_by_key(store, pid)
    assert statuses(store, pid) == {"a": S.READY, "b": S.BLOCKED, "c": S.BLOCKED, "d": S.BLOCKED}
    assert {k: t.remaining_blockers for k, t in tasks.items()} == {"a": 0, "b": 1, "c": 1, "d": 2}
    assert tasks["d"].blocked_by == ("b", "c")
    # A later import may also put a new blocker after its new dependent.
    store.tasks.add(pid, [spec("f", "e", "a"), spec("e", "d")], {}, NOW + 1)
    assert tasks_by_key(store, pid)["f"].remaining_blockers == 2
    assert [t.key for t in store.tasks.list(pid)] == ["d", "c", "b", "a", "f", "e"]


@pytest.mark.parametrize(
    ("bad", "code", "message"),
    [
        ([spec("b", "c")], "dependencies_changed", "dependencies"),  # b exists without any
        ([spec("x", "y"), spec("y", "x")], "dependency_cycle", "cycle"),
        ([spec("x", "nope")], "unknown_dependency", "unknown task 'nope'"),
        ([spec("x", "x")], "dependency_cycle", "depends on itself"),
        ([spec("x"), spec("x")], "duplicate_task", "duplicate"),
        ([spec("A")], "duplicate_task", "duplicate"),  # differs from the stored a only in case
    ],
    ids=["changed-deps", "cycle", "unknown", "self", "duplicate", "case-duplicate"],
)
def test_a_bad_import_writes_nothing(
    store: Store, bad: list[TaskSpec], code: str, message: str
) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b"), spec("c")], {}, NOW)
    before, updates = store.tasks.list(pid), task_updates(store)
    # A content change and a new task come first: neither may stay behind.
    with pytest.raises(InvalidRequest, match=message) as refused:
        store.tasks.add(
            pid, [spec("a", title="new title"), spec("new"), *bad], {}, NOW + 10, digest="d1"
        )
    assert refused.value.code == code
    assert store.tasks.list(pid) == before
    assert task_updates(store) == updates
    assert store.projects.get(pid).plan_digest is None


def test_a_started_task_cannot_change(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a")], {}, NOW)
    store.tasks.start(pid, 1, NOW)
    with pytest.raises(InvalidRequest, match="no longer change"):
        store.tasks.add(pid, [spec("a", title="other")], {}, NOW + 1)
    assert tasks_by_key(store, pid)["a"].title == "task a"


# ---- claiming --------------------------------------------------------------------------------


def test_start_claims_up_to_workers_by_priority_atomically(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(
        pid,
        [
            spec("low", priority=-5),
            spec("mid"),
            spec("high", priority=10),
            spec("higher", priority=20),
            spec("waits", "low", priority=100),
        ],
        {},
        NOW,
    )
    runs = store.tasks.start(pid, 2, NOW)
    tasks = tasks_by_key(store, pid)
    assert sorted(r.task_id for r in runs if r.task_id) == sorted(
        [tasks["higher"].id, tasks["high"].id]
    )
    assert {k for k, t in tasks.items() if t.status is S.CLAIMED} == {"higher", "high"}
    for run in runs:
        stored = store.runs.get(run.id)
        assert stored.type is RunType.TASK and stored.status is RunStatus.PENDING
        task = next(t for t in tasks.values() if t.id == stored.task_id)
        assert task.run_id == stored.id and task.attempts == 1
        assert stored.prompt == task.prompt and stored.project_dir == "/repo"
    assert len(task_runs(store)) == 2
    assert store.projects.get(pid).workers == 2
    # Nothing more while both workers are busy.
    assert store.tasks.schedule(pid, NOW + 1) == []


def test_a_paused_project_claims_nothing_until_resumed(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b")], {}, NOW)
    assert store.tasks.set_paused(pid, True, NOW, "by hand") == []
    assert store.tasks.start(pid, 2, NOW) == []
    assert store.tasks.schedule(pid, NOW + 1) == []
    p = store.projects.get(pid)
    assert p.paused and p.pause_reason == "by hand"
    assert set(statuses(store, pid).values()) == {S.READY}
    assert task_runs(store) == []

    runs = store.tasks.set_paused(pid, False, NOW + 2)
    assert len(runs) == 2
    assert set(statuses(store, pid).values()) == {S.CLAIMED}
    p = store.projects.get(pid)
    assert not p.paused and p.pause_reason is None


def test_a_pause_stops_claims_only(store: Store) -> None:
    """A task under way when the plan is paused goes on to the end (and its dependent is
    not claimed); the pause lasts through another start until it is lifted."""
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b", "a"), spec("c")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)
    store.tasks.set_paused(pid, True, NOW + 1, "by hand")
    run_task_once(store, runner, pid, "a", NOW + 2, outcome="merged", merge_commit="m")
    assert statuses(store, pid) == {"a": S.COMPLETED, "b": S.READY, "c": S.READY}
    assert store.tasks.start(pid, 2, NOW + 3) == []
    assert store.projects.get(pid).paused
    assert len(store.tasks.set_paused(pid, False, NOW + 4)) == 2


def test_a_started_task_whose_runner_is_gone_is_interrupted(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b")], {}, NOW)
    store.tasks.start(pid, 2, NOW)
    assert not any(t.interrupted for t in store.tasks.list(pid))  # claimed, queued
    runner = register(store, "r1", NOW)
    runs = claim_all(store, runner, NOW)
    a = tasks_by_key(store, pid)["a"]
    run = runs[a.id]
    store.runs.mark_started(run.id, runner, run.attempts, NOW)
    store.runs.record_task_step(run.id, runner, run.attempts, "worktree", {"path": "/wt"}, NOW)
    assert not store.tasks.get(pid, "a").interrupted

    store.reconcile(NOW + 100, lost_after_s=30, timeout_grace_s=5)  # the runner is lost
    assert {k: t.interrupted for k, t in tasks_by_key(store, pid).items()} == {
        "a": True,  # in progress, its run back to pending
        "b": False,  # claimed and queued again: nothing had started
    }
    assert store.tasks.get(pid, "a").interrupted

    other = register(store, "r2", NOW + 100)
    claim_all(store, other, NOW + 101)
    assert not store.tasks.get(pid, "a").interrupted  # picked up again


# ---- a whole flow through the run API --------------------------------------------------------


def test_full_flow_steps_merge_and_wake_dependents(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b"), spec("c", "a", "b"), spec("d", "c")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 4, NOW)
    claimed = claim_all(store, runner, NOW + 1)
    tasks = tasks_by_key(store, pid)
    run_a = claimed[tasks["a"].id]
    store.runs.mark_started(run_a.id, runner, run_a.attempts, NOW + 1)

    def step(name: str, data: dict[str, Any], at: float) -> Task:
        store.runs.record_task_step(run_a.id, runner, run_a.attempts, name, data, at)
        return tasks_by_key(store, pid)["a"]

    assert step("worktree", {"path": "/wt/a"}, NOW + 2).status is S.IN_PROGRESS
    a = step("agent", {"session_id": "sess-a", "result": "ok"}, NOW + 3)
    assert a.status is S.IN_PROGRESS and a.session_id == "sess-a"
    a = step("committed", {"commit": "c0ffee"}, NOW + 4)
    assert a.status is S.IN_PROGRESS and a.commit_sha == "c0ffee"
    a = step("merging", {}, NOW + 5)
    assert a.status is S.MERGING
    assert a.steps == {
        "worktree": {"path": "/wt/a"},
        "agent": {"session_id": "sess-a", "result": "ok"},
        "committed": {"commit": "c0ffee"},
        "merging": {},
    }

    finish(store, run_a, NOW + 6, outcome="merged", commit="c0ffee", merge_commit="x")
    tasks = tasks_by_key(store, pid)
    assert tasks["a"].status is S.COMPLETED
    assert tasks["a"].merge_sha == "x" and tasks["a"].finished_at == NOW + 6
    assert tasks["c"].status is S.BLOCKED and tasks["c"].remaining_blockers == 1
    assert tasks["d"].remaining_blockers == 1

    run_b = claimed[tasks["b"].id]
    finish(store, run_b, NOW + 7, outcome="already_merged", merge_commit="y")
    tasks = tasks_by_key(store, pid)
    assert tasks["b"].status is S.COMPLETED
    # c's last blocker completed: it became ready and was claimed in that same transaction.
    c = tasks["c"]
    assert c.remaining_blockers == 0 and c.status is S.CLAIMED and c.run_id is not None
    run_c = store.runs.get(c.run_id)
    assert run_c.task_id == c.id and run_c.status is RunStatus.PENDING
    assert run_c.created_at == NOW + 7
    assert tasks["d"].status is S.BLOCKED

    run_c = claim_all(store, runner, NOW + 8)[c.id]
    finish(store, run_c, NOW + 9, outcome="merged", merge_commit="z")
    d = tasks_by_key(store, pid)["d"]
    assert d.status is S.CLAIMED
    run_d = claim_all(store, runner, NOW + 10)[d.id]
    finish(store, run_d, NOW + 11, outcome="merged", merge_commit="w")
    assert set(statuses(store, pid).values()) == {S.COMPLETED}
    assert len(task_runs(store)) == 4


def test_a_step_from_an_old_run_is_ignored(store: Store) -> None:
    pid = project(store, retry_backoff_s=0.0).id
    store.tasks.add(pid, [spec("a")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)
    tid = tasks_by_key(store, pid)["a"].id
    first = claim_all(store, runner, NOW)[tid]
    finish(store, first, NOW + 1, status=RunStatus.FAILED, error="boom", outcome="agent_failed")
    second = claim_all(store, runner, NOW + 2)[tid]
    assert second.id != first.id
    store.runs.record_task_step(second.id, runner, second.attempts, "worktree", {"p": 2}, NOW + 3)
    # A late report of the first run's (its lease is still its own) changes nothing.
    store.runs.record_task_step(first.id, runner, first.attempts, "agent", {"late": 1}, NOW + 4)
    a = tasks_by_key(store, pid)["a"]
    assert a.steps["worktree"] == {"p": 2} and "agent" not in a.steps
    assert a.run_id == second.id and a.status is S.IN_PROGRESS


# ---- no changes ------------------------------------------------------------------------------


def test_no_changes_fails_the_attempt_with_backoff_then_the_task(store: Store) -> None:
    pid = project(store, on_no_changes="fail", retry_backoff_s=10.0).id
    store.tasks.add(pid, [spec("a", max_attempts=2), spec("b", "a")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 2, NOW)
    agent = {"session_id": "s1", "result": "nothing to do"}
    run_task_once(store, runner, pid, "a", NOW + 1, agent_step=agent, outcome="no_changes")
    a = tasks_by_key(store, pid)["a"]
    assert a.status is S.READY and a.attempts == 1 and a.run_id is None
    assert a.last_error == "the agent made no changes"
    # The next attempt runs the agent again: reusing its result could only fail the same way.
    assert "agent" not in a.steps
    # The backoff: not claimed before it ends (10 s after the failure), claimed after.
    assert store.tasks.schedule(pid, NOW + 10) == []
    assert store.tasks.schedule_all(NOW + 10.5) == []
    again = store.tasks.schedule_all(NOW + 11)
    assert [r.task_id for r in again] == [a.id]
    run_task_once(store, runner, pid, "a", NOW + 12, outcome="no_changes")
    tasks = tasks_by_key(store, pid)
    assert tasks["a"].status is S.FAILED and tasks["a"].attempts == 2
    assert tasks["a"].last_error == "the agent made no changes"
    assert tasks["b"].status is S.BLOCKED_BY_FAILURE


def test_no_changes_completes_when_the_project_says_so(store: Store) -> None:
    pid = project(store, on_no_changes="complete").id
    store.tasks.add(pid, [spec("a"), spec("b", "a")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)
    run_task_once(store, runner, pid, "a", NOW + 1, outcome="no_changes")
    tasks = tasks_by_key(store, pid)
    assert tasks["a"].status is S.COMPLETED and tasks["a"].last_error == "no changes"
    assert tasks["b"].status is S.CLAIMED


# ---- merge conflicts, failures, retries ------------------------------------------------------


def test_merge_conflict_blocks_dependents_transitively_until_retried(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b", "a"), spec("c", "b"), spec("other")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)  # a first (file order)
    run_task_once(
        store,
        runner,
        pid,
        "a",
        NOW + 1,
        status=RunStatus.FAILED,
        error="merge conflict in f.txt",
        outcome="merge_conflict",
        commit="abc",
        conflict="CONFLICT (content): f.txt",
    )
    tasks = tasks_by_key(store, pid)
    assert tasks["a"].status is S.MERGE_CONFLICT
    assert tasks["a"].conflict == "CONFLICT (content): f.txt"
    assert tasks["a"].commit_sha == "abc" and tasks["a"].last_error == "merge conflict"
    assert tasks["b"].status is S.BLOCKED_BY_FAILURE
    assert tasks["c"].status is S.BLOCKED_BY_FAILURE
    assert tasks["other"].status is S.CLAIMED  # the freed worker took the next ready task

    store.tasks.stop(pid, NOW + 2)
    task, runs = store.tasks.retry(pid, "a", NOW + 3)
    assert task.status is S.READY and task.attempts == 0 and runs == []
    assert task.steps == {} and task.last_error is None
    assert task.conflict == "CONFLICT (content): f.txt"  # the next attempt is told about it
    tasks = tasks_by_key(store, pid)
    assert tasks["b"].status is S.BLOCKED and tasks["c"].status is S.BLOCKED


def test_failure_after_max_attempts_and_partial_retry(store: Store) -> None:
    pid = project(store, retry_backoff_s=0.0).id
    store.tasks.add(
        pid,
        [
            spec("x", max_attempts=2),
            spec("y", max_attempts=1),
            spec("both", "x", "y"),
            spec("after-both", "both"),
        ],
        {},
        NOW,
    )
    runner = register(store)
    store.tasks.start(pid, 2, NOW)
    now = NOW
    for attempt in (1, 2):
        now += 1
        fail_task_once(store, runner, pid, "x", now, error=f"boom {attempt}")
        if attempt == 1:
            x = tasks_by_key(store, pid)["x"]
            assert x.status is S.CLAIMED and x.attempts == 2  # retried at once (no backoff)
            assert x.last_error == "boom 1"
    fail_task_once(store, runner, pid, "y", now + 1, error="nope")
    tasks = tasks_by_key(store, pid)
    assert tasks["x"].status is S.FAILED and tasks["x"].attempts == 2
    assert tasks["x"].last_error == "boom 2" and tasks["x"].finished_at == now
    assert tasks["y"].status is S.FAILED and tasks["y"].last_error == "nope"
    assert tasks["both"].status is S.BLOCKED_BY_FAILURE
    assert tasks["after-both"].status is S.BLOCKED_BY_FAILURE

    # Retrying x alone: y is still failed, so both (and its dependent) stay put.
    store.tasks.stop(pid, now + 2)
    x, _ = store.tasks.retry(pid, "x", now + 3)
    assert x.status is S.READY and x.attempts == 0
    tasks = tasks_by_key(store, pid)
    assert tasks["both"].status is S.BLOCKED_BY_FAILURE
    assert tasks["after-both"].status is S.BLOCKED_BY_FAILURE

    y, _ = store.tasks.retry(pid, "y", now + 4)
    assert y.status is S.READY
    tasks = tasks_by_key(store, pid)
    assert tasks["both"].status is S.BLOCKED and tasks["both"].remaining_blockers == 2
    assert tasks["after-both"].status is S.BLOCKED


def test_only_settled_failures_can_be_retried(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b", "a")], {}, NOW)
    for key in ("a", "b"):
        with pytest.raises(Conflict, match="only failed"):
            store.tasks.retry(pid, key, NOW)


# ---- runs lost with their runner ---------------------------------------------------------------


def test_a_lost_and_requeued_task_run_leaves_the_task_alone(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a")], {}, NOW)
    store.tasks.start(pid, 1, NOW)
    runner = register(store, "r1", NOW)
    a = tasks_by_key(store, pid)["a"]
    run = claim_all(store, runner, NOW)[a.id]
    store.runs.mark_started(run.id, runner, run.attempts, NOW)
    store.runs.record_task_step(run.id, runner, run.attempts, "worktree", {"path": "/wt"}, NOW)
    result = store.reconcile(NOW + 100, lost_after_s=30, timeout_grace_s=5)
    assert result.requeued == [run.id]
    after = tasks_by_key(store, pid)["a"]
    assert after.status is S.IN_PROGRESS and after.run_id == run.id and after.attempts == 1
    assert after.steps == {"worktree": {"path": "/wt"}}
    assert store.runs.get(run.id).status is RunStatus.PENDING

    # Another runner takes the same run over and finishes the task.
    other = register(store, "r2", NOW + 100)
    again = claim_all(store, other, NOW + 101)[a.id]
    assert again.id == run.id and again.attempts == 2
    finish(store, again, NOW + 102, outcome="merged", merge_commit="m")
    assert tasks_by_key(store, pid)["a"].status is S.COMPLETED


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_a_task_run_failed_by_the_reconciler_fails_the_attempt(
    store: Store, max_attempts: int
) -> None:
    pid = project(store, retry_backoff_s=5.0).id
    store.tasks.add(pid, [spec("a", max_attempts=max_attempts), spec("b", "a")], {}, NOW)
    store.tasks.start(pid, 1, NOW)
    tid = tasks_by_key(store, pid)["a"].id
    now = NOW
    run = None
    failed: list[str] = []
    for i in range(10):  # the run's own attempts (5) run out on the way
        runner = register(store, f"r{i}", now)
        claimed = claim_all(store, runner, now)
        if tid not in claimed:
            break
        run = claimed[tid]
        now += 100
        result = store.reconcile(now, lost_after_s=30, timeout_grace_s=5)
        failed += result.failed
    # The last attempt lost, the run waits for its late report (the task with it, not
    # retried yet), and the reconciler fails it once its grace is over.
    assert run is not None and failed == []
    assert store.runs.get(run.id).status is RunStatus.LOST
    waiting = tasks_by_key(store, pid)["a"]
    assert (waiting.status, waiting.run_id, waiting.interrupted) == (S.CLAIMED, run.id, True)
    now += 100
    failed += store.reconcile(now, lost_after_s=30, timeout_grace_s=5).failed
    failed += store.reconcile(now + 1, lost_after_s=30, timeout_grace_s=5).failed
    assert failed == [run.id]
    stored = store.runs.get(run.id)
    assert stored.status is RunStatus.FAILED and "no attempts left" in (stored.error or "")
    a = tasks_by_key(store, pid)["a"]
    assert a.attempts == 1 and "no attempts left" in (a.last_error or "")
    if max_attempts == 1:
        assert a.status is S.FAILED
        assert tasks_by_key(store, pid)["b"].status is S.BLOCKED_BY_FAILURE
    else:
        assert a.status is S.READY and a.run_id is None
        assert store.tasks.schedule(pid, now) == []  # the backoff
        assert [r.task_id for r in store.tasks.schedule(pid, now + 5)] == [tid]


def test_a_missing_program_gives_the_attempt_back_and_stops_the_plan_run(store: Store) -> None:
    """Not worth retrying, and not the task's fault: it waits, ready, for a plan run that
    has the program; the plan run claims nothing more meanwhile."""
    pid = project(store, retry_backoff_s=0.0).id
    store.tasks.add(pid, [spec("a"), spec("b"), spec("c", "a")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)
    run = run_task_once(
        store,
        runner,
        pid,
        "a",
        NOW + 1,
        status=RunStatus.FAILED,
        error="could not start: no such program: 'claude'",
        outcome="missing_program",
    )
    assert run.status is RunStatus.FAILED
    a = tasks_by_key(store, pid)["a"]
    assert a.status is S.READY and a.attempts == 0 and a.run_id is None
    assert a.last_error == "could not start: no such program: 'claude'"
    assert statuses(store, pid) == {"a": S.READY, "b": S.READY, "c": S.BLOCKED}
    assert store.projects.get(pid).workers == 0
    assert store.tasks.schedule_all(NOW + 2) == []
    assert len(store.tasks.start(pid, 1, NOW + 3)) == 1  # the next plan run goes on


# ---- cost and budgets ------------------------------------------------------------------------


def test_costs_add_up_and_a_project_budget_stops_claims_until_raised(store: Store) -> None:
    pid = project(store, budget_usd=1.0, retry_backoff_s=0.0).id
    store.tasks.add(pid, [spec("a", max_attempts=3), spec("b"), spec("c", "b")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 2, NOW)  # a and b
    fail_task_once(store, runner, pid, "a", NOW + 1, error="x", cost=0.25)
    run_task_once(store, runner, pid, "a", NOW + 2, cost=0.25, outcome="merged")
    tasks = tasks_by_key(store, pid)
    assert tasks["a"].cost_usd == pytest.approx(0.5)
    assert store.projects.get(pid).cost_usd == pytest.approx(0.5)
    assert not store.projects.get(pid).paused

    # b's run brings the plan to its budget: c (now ready) is not claimed.
    run_task_once(store, runner, pid, "b", NOW + 3, cost=0.5, outcome="merged")
    tasks = tasks_by_key(store, pid)
    p = store.projects.get(pid)
    assert tasks["b"].status is S.COMPLETED and tasks["b"].cost_usd == pytest.approx(0.5)
    assert p.cost_usd == pytest.approx(1.0)
    assert p.budget_reached and not p.paused
    assert tasks["c"].status is S.READY
    assert store.tasks.schedule(pid, NOW + 4) == []
    assert store.tasks.schedule_all(NOW + 5) == []
    assert store.tasks.start(pid, 2, NOW + 5) == []
    assert statuses(store, pid)["c"] is S.READY

    # A higher budget lets the plan go on.
    project(store, NOW + 6, budget_usd=2.0)
    assert [r.task_id for r in store.tasks.schedule_all(NOW + 6)] == [tasks["c"].id]


def test_an_agents_cost_counts_whatever_happens_after_it(store: Store) -> None:
    """The agent reported its cost with its step; the attempt then failed in git (its
    report carries no cost). The cost still counts for the run, task, plan and session, so
    the budget sees it; the next attempt reuses the agent's result without counting it again."""
    pid = project(store, budget_usd=0.4, retry_backoff_s=0.0).id
    store.tasks.add(pid, [spec("a", max_attempts=2), spec("b")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)
    run = claim_all(store, runner, NOW)[tasks_by_key(store, pid)["a"].id]
    store.runs.mark_started(run.id, runner, run.attempts, NOW)
    store.runs.record_session(run.id, runner, run.attempts, "sess-a", NOW)
    agent = {"run_id": run.id, "session_id": "sess-a", "result": "done", "cost_usd": 0.4}
    failed = finish(
        store,
        run,
        NOW + 1,
        status=RunStatus.FAILED,
        error="git commit failed",
        agent_step=agent,
        outcome="error",
    )
    assert failed.cost_usd == pytest.approx(0.4)
    assert tasks_by_key(store, pid)["a"].cost_usd == pytest.approx(0.4)
    p = store.projects.get(pid)
    assert p.cost_usd == pytest.approx(0.4)
    assert store.sessions.get("sess-a").cost_usd == pytest.approx(0.4)
    assert p.budget_reached
    assert statuses(store, pid) == {"a": S.READY, "b": S.READY}  # nothing claimed

    project(store, NOW + 2, budget_usd=1.0)  # the next attempt reuses the agent's result
    store.tasks.schedule(pid, NOW + 2)
    again = run_task_once(store, runner, pid, "a", NOW + 3, outcome="merged", merge_commit="m")
    assert again.cost_usd is None
    assert tasks_by_key(store, pid)["a"].cost_usd == pytest.approx(0.4)
    assert store.projects.get(pid).cost_usd == pytest.approx(0.4)


def test_an_agents_cost_counts_when_its_run_is_lost_for_good(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a")], {}, NOW)
    store.tasks.start(pid, 1, NOW)
    tid = tasks_by_key(store, pid)["a"].id
    runner = register(store, "r0", NOW)
    run = claim_all(store, runner, NOW)[tid]
    store.runs.mark_started(run.id, runner, run.attempts, NOW)
    store.runs.record_session(run.id, runner, run.attempts, "sess-a", NOW)
    agent = {"run_id": run.id, "session_id": "sess-a", "cost_usd": 0.25}
    store.runs.record_task_step(run.id, runner, run.attempts, "agent", agent, NOW)
    store.runs.record_task_step(run.id, runner, run.attempts, "agent", agent, NOW)  # sent twice
    now, failed = NOW, []
    for i in range(1, 10):  # runners die until the run's own attempts run out
        now += 100
        failed += store.reconcile(now, lost_after_s=30, timeout_grace_s=5).failed
        if failed:
            break
        claim_all(store, register(store, f"r{i}", now), now)
    assert failed == [run.id]
    assert store.runs.get(run.id).cost_usd == pytest.approx(0.25)
    assert tasks_by_key(store, pid)["a"].cost_usd == pytest.approx(0.25)
    assert store.projects.get(pid).cost_usd == pytest.approx(0.25)
    assert store.sessions.get("sess-a").cost_usd == pytest.approx(0.25)


def test_a_task_budget_fails_the_task_instead_of_retrying(store: Store) -> None:
    pid = project(store, retry_backoff_s=0.0).id
    store.tasks.add(pid, [spec("a", max_attempts=5, budget_usd=1.0), spec("b", "a")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)
    fail_task_once(store, runner, pid, "a", NOW + 1, error="e1", cost=0.6)
    assert tasks_by_key(store, pid)["a"].status is S.CLAIMED  # under budget: retried
    fail_task_once(store, runner, pid, "a", NOW + 2, error="e2", cost=0.6)
    tasks = tasks_by_key(store, pid)
    a = tasks["a"]
    assert a.status is S.FAILED and a.attempts == 2
    assert a.cost_usd == pytest.approx(1.2)
    assert a.last_error and "budget" in a.last_error and "e2" in a.last_error
    assert tasks["b"].status is S.BLOCKED_BY_FAILURE


# ---- cancel ----------------------------------------------------------------------------------


def test_cancel_a_ready_task_then_retry_it(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b", "a"), spec("c", "b")], {}, NOW)
    a = store.tasks.cancel(pid, "a", NOW + 1)
    assert a.status is S.CANCELLED and a.finished_at == NOW + 1
    assert statuses(store, pid) == {
        "a": S.CANCELLED,
        "b": S.BLOCKED_BY_FAILURE,
        "c": S.BLOCKED_BY_FAILURE,
    }
    assert store.tasks.start(pid, 2, NOW + 2) == []  # nothing ready

    a, runs = store.tasks.retry(pid, "a", NOW + 3)
    assert a.status is S.CLAIMED and len(runs) == 1  # the plan is running: claimed at once
    assert statuses(store, pid) == {"a": S.CLAIMED, "b": S.BLOCKED, "c": S.BLOCKED}


def test_cancel_a_running_task_then_its_run_ends(store: Store) -> None:
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b", "a")], {}, NOW)
    runner = register(store)
    store.tasks.start(pid, 1, NOW)
    run = claim_all(store, runner, NOW)[tasks_by_key(store, pid)["a"].id]
    store.runs.mark_started(run.id, runner, run.attempts, NOW)
    assert store.tasks.cancel(pid, "a", NOW + 1).status is S.CANCELLED
    store.runs.request_cancel(run.id, NOW + 1)
    ended = finish(store, run, NOW + 2, status=RunStatus.FAILED, cost=0.1, error="killed")
    assert ended.status is RunStatus.CANCELLED
    tasks = tasks_by_key(store, pid)
    assert tasks["a"].status is S.CANCELLED and tasks["a"].cost_usd == pytest.approx(0.1)
    assert tasks["b"].status is S.BLOCKED_BY_FAILURE
    assert store.tasks.cancel(pid, "a", NOW + 3) == tasks["a"]  # sent again: nothing changes
    assert tasks_by_key(store, pid) == tasks


# ---- concurrency (PostgreSQL) ------------------------------------------------------------------


def _run_threads(targets: Sequence[Callable[[], None]], timeout: float = 120.0) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(target: Callable[[], None]) -> None:
        try:
            barrier.wait()
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    if errors:
        raise errors[0]


@postgres_only
def test_postgres_concurrent_completions_wake_every_dependent(store: Store, store_url: str) -> None:
    blockers, children, threads, workers = 200, 2000, 8, 600
    specs = [spec(f"b{i}") for i in range(blockers)]
    for j in range(children):
        first = j % blockers
        second = (first + 1 + (j // blockers) * 7) % blockers  # distinct from first
        assert second != first
        specs.append(spec(f"c{j}", f"b{first}", f"b{second}"))
    pid = project(store).id
    store.tasks.add(pid, specs, {}, NOW)
    started = store.tasks.start(pid, workers, NOW)
    assert len(started) == blockers  # only the blockers are ready

    runners = [register(store, f"r{i}") for i in range(threads)]
    held: dict[RunnerId, list[Run]] = {}
    per = blockers // threads
    for runner in runners:
        held[runner] = store.runs.claim(runner, per, NOW + 1)
    assert sum(len(v) for v in held.values()) == blockers

    opened = [Store.open(store_url) for _ in range(threads)]
    try:

        def complete(own: Store, runner: RunnerId) -> Callable[[], None]:
            def work() -> None:
                for i, run in enumerate(held[runner]):
                    now = NOW + 2 + i * 0.001
                    own.runs.mark_started(run.id, runner, run.attempts, now)
                    own.runs.record_task_step(run.id, runner, run.attempts, "worktree", {}, now)
                    report = RunReport(
                        RunStatus.COMPLETED, task={"outcome": "merged", "merge_commit": f"m{i}"}
                    )
                    own.runs.finish(run.id, runner, run.attempts, report, now)

            return work

        _run_threads([complete(s, r) for s, r in zip(opened, runners, strict=True)])
    finally:
        for s in opened:
            s.close()

    tasks = tasks_by_key(store, pid)
    by_status = Counter(t.status for t in tasks.values())
    assert all(tasks[f"b{i}"].status is S.COMPLETED for i in range(blockers))
    child_tasks = [tasks[f"c{j}"] for j in range(children)]
    assert [t.key for t in child_tasks if t.status is S.BLOCKED] == []
    assert all(t.remaining_blockers == 0 for t in child_tasks)
    assert {t.status for t in child_tasks} <= {S.READY, S.CLAIMED}, by_status
    claimed = [t for t in child_tasks if t.status is S.CLAIMED]
    assert len(claimed) == workers  # every free worker took a child, no more
    # Each claimed child has exactly one run, and it is the one it names.
    runs = task_runs(store)
    per_task = Counter(r.task_id for r in runs)
    assert len(runs) == blockers + len(claimed)
    assert all(n == 1 for n in per_task.values())
    assert all(store.runs.get(str(t.run_id)).task_id == t.id for t in claimed)


def test_a_claimed_task_run_carries_its_context_on_either_transport(store: Store) -> None:
    """The claim reads the task's context in its own transaction, for the long-poll claim
    and the socket's claim into start commands alike (one place, issue 11 §4)."""
    pid = project(store).id
    store.tasks.add(pid, [spec("a"), spec("b")], {}, NOW)
    store.tasks.start(pid, 2, NOW)
    (polled,) = store.runs.claim(register(store, "poller"), 1, NOW + 1)
    started: list[Run] = []

    def start(run: Run) -> dict[str, Any]:
        started.append(run)
        return {"type": "start_run", "run_id": run.id}

    store.commands.claim_into_commands(register(store, "socket"), NOW + 1, start)
    for run in (polled, *started):
        assert run.task is not None
        assert run.task["id"] == run.task_id
        assert (run.task["repo_path"], run.task["target_branch"]) == ("/repo", "main")
        assert run.task["steps"] == {}
    assert {polled.task["key"], started[0].task["key"]} == {"a", "b"}  # type: ignore[index]


def test_a_claim_into_start_commands_that_takes_a_task_run_gives_it_its_context(
    store: Store,
) -> None:
    """On PostgreSQL the claim's statement stores the start commands itself (``START_RUN``),
    but not when it takes a task run, whose start carries what is read of its task after
    the claim: then every start is made by ``start``, numbered in claim order."""
    pid = project(store).id
    store.tasks.add(pid, [spec("a")], {}, NOW)
    store.tasks.start(pid, 1, NOW)
    store.runs.create(NewRun(type=RunType.COMMAND, command=("true",), priority=-1), NOW)
    runner = register(store, "socket")
    store.commands.push(runner, [{"type": "x"}], NOW)
    started: list[Run] = []

    def start(run: Run) -> dict[str, Any]:
        started.append(run)
        return {"type": "start_run", "run_id": run.id, "task": run.task}

    commands, _ = store.commands.claim_into_commands(runner, NOW + 1, start, (), START_RUN)
    assert [c.idx for c in commands] == [2, 3]
    assert [c.body["run_id"] for c in commands] == [r.id for r in started]
    assert started[0].task is not None and started[0].task["key"] == "a"
    assert started[1].task_id is None
    # Whole, as the claim wrote them (PostgreSQL reads them back after its statement).
    assert [(r.status, r.runner_id, r.attempts) for r in started] == [
        (RunStatus.CLAIMED, runner, 1)
    ] * 2
