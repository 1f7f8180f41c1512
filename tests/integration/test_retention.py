"""Retention on SQLite and PostgreSQL: old finished runs, their logs and silent runners go;
nothing a live run, a session's result, a task or a kept runner needs ever does. Time is
passed in; nothing sleeps."""

from __future__ import annotations

from typing import Any

import pytest
from api_fixtures import running_api, wait_until

from corral.clock import FakeClock
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import NotFound
from corral.ids import RunnerId
from corral.runners import RunnerState
from corral.runs import AgentSpec, NewRun, Run, RunReport, RunStatus, RunType
from corral.store import LogLine, Store
from corral.store.retention import MARKER_LINE_NO, Collected, Retention
from corral.tasks.model import TaskSpec

T0 = 1_700_000_000.0
DAY = 86400.0
RETENTION = Retention(runs_s=30 * DAY, runners_s=7 * DAY, log_chars=None, events_s=None)


def register(store: Store, name: str, now: float = T0) -> RunnerId:
    runner, _ = store.runners.register(
        name=name, hostname=name, labels=(), slots=64, version="0", transport="poll", now=now
    )
    return runner.id


def claimed(store: Store, runner: RunnerId, spec: NewRun, now: float) -> Run:
    created = store.runs.create(spec, now)
    (run,) = store.runs.claim(runner, 1, now)
    assert run.id == created.id
    store.runs.mark_started(run.id, runner, run.attempts, now)
    return run


def log(store: Store, run: Run, *texts: str, first: int = 0) -> None:
    lines = [LogLine(first + i, "stdout", text, T0) for i, text in enumerate(texts)]
    assert run.runner_id is not None
    store.logs.append(run.id, run.runner_id, run.attempts, lines)


def finish(store: Store, run: Run, now: float, **report: Any) -> Run:
    assert run.runner_id is not None
    outcome = RunReport(status=RunStatus.COMPLETED, exit_code=0, **report)
    return store.runs.finish(run.id, run.runner_id, run.attempts, outcome, now)


def command(*argv: str) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=argv or ("echo",))


def texts(store: Store, run_id: str) -> list[str]:
    return [entry.text for entry in store.logs.read(run_id, 0, 10_000)]


def gone(store: Store, run_id: str) -> bool:
    try:
        store.runs.get(run_id)
    except NotFound:
        return True
    return False


def test_old_finished_runs_and_silent_runners_go_and_nothing_needed_does(store: Store) -> None:
    worker = register(store, "worker")
    silent = register(store, "silent")  # stopped long ago, names no run: it goes
    resumable = register(store, "resumable")  # stopped too, but a session lives there

    old = claimed(store, worker, command("echo", "old"), T0)
    log(store, old, "old line")
    finish(store, old, T0)
    recent = claimed(store, worker, command("echo", "recent"), T0 + 25 * DAY)
    finish(store, recent, T0 + 25 * DAY)
    running = claimed(store, worker, command("sleep", "1000"), T0)  # a live run, for weeks
    log(store, running, "still", "going")

    agent = AgentSpec(name="claude", executor="claude")
    session_run = claimed(
        store,
        resumable,
        NewRun(type=RunType.START_SESSION, prompt="hi", session_name="s", agent=agent),
        T0,
    )
    store.runs.record_session(session_run.id, resumable, 1, "sess-1", T0)
    finish(store, session_run, T0, result="the answer", session_id="sess-1")

    project = store.projects.ensure("/repo", "main", T0)
    store.tasks.add(project.id, [TaskSpec(key="t", title="t", prompt="t")], {}, T0)
    (task_run,) = store.tasks.start(project.id, 1, T0)
    (task_run,) = store.runs.claim(worker, 1, T0)
    store.runs.mark_started(task_run.id, worker, 1, T0)
    store.runs.record_task_step(task_run.id, worker, 1, "worktree", {}, T0)
    finish(store, task_run, T0, task={"outcome": "merged", "merge_commit": "abc"})
    assert store.tasks.get(project.id, "t").run_id == task_run.id
    pending = store.runs.create(command("echo", "waiting"), T0)  # no runner took it, for weeks

    store.runners.set_state(silent, RunnerState.STOPPED, T0)
    store.runners.set_state(resumable, RunnerState.STOPPED, T0)
    store.runners.touch([worker], T0 + 31 * DAY)
    before_running = texts(store, running.id)

    collected = store.collect_garbage(RETENTION, T0 + 31 * DAY)

    assert collected == Collected(runs=1, log_lines=1, runners=1, commands=0)
    assert gone(store, old.id)
    with store.db.transaction(write=False) as tx:
        left = tx.one("SELECT COUNT(*) AS n FROM run_logs WHERE run_id = ?", (old.id,))
    assert left is not None and left["n"] == 0
    for kept in (recent.id, running.id, pending.id, session_run.id, task_run.id):
        assert not gone(store, kept), kept
    assert texts(store, running.id) == before_running == ["still", "going"]
    assert store.runs.get(running.id).status is RunStatus.RUNNING
    session = store.sessions.get("s")
    assert (session.result, session.last_run_id) == ("the answer", session_run.id)
    assert store.runners.get(resumable).id == resumable  # the session's resume goes there
    with pytest.raises(NotFound):
        store.runners.get(silent)
    assert store.tasks.get(project.id, "t").run_id == task_run.id
    # A run keeps going after a collection: its lease and its log are untouched.
    log(store, running, "more", first=2)
    assert finish(store, running, T0 + 32 * DAY).status is RunStatus.COMPLETED
    assert texts(store, running.id) == ["still", "going", "more"]
    # Nothing else is old enough: a second collection deletes nothing.
    assert store.collect_garbage(RETENTION, T0 + 31 * DAY) == Collected()


def test_a_silent_runner_goes_with_the_commands_it_never_acknowledged(store: Store) -> None:
    silent = register(store, "silent")
    store.commands.push(silent, [{"type": "stop_run", "run_id": "run_000000000000"}], T0)
    store.runners.set_state(silent, RunnerState.LOST, T0)

    assert store.collect_garbage(RETENTION, T0 + 6 * DAY) == Collected()
    assert [c.idx for c in store.commands.unacknowledged(silent, 0)] == [1]
    assert store.collect_garbage(RETENTION, T0 + 8 * DAY) == Collected(runners=1, commands=1)
    with pytest.raises(NotFound):
        store.runners.get(silent)


def test_forever_keeps_everything(store: Store) -> None:
    worker = register(store, "worker")
    finish(store, claimed(store, worker, command(), T0), T0)
    store.runners.set_state(register(store, "silent"), RunnerState.STOPPED, T0)
    forever = Retention(runs_s=None, runners_s=None, log_chars=None, events_s=None)
    assert store.collect_garbage(forever, T0 + 1000 * DAY) == Collected()
    assert len(store.runs.list()) == 1 and len(store.runners.list()) == 2


def test_a_finished_runs_log_over_the_cap_keeps_its_ends(store: Store) -> None:
    worker = register(store, "worker")
    lines = [f"{i:03d}" + "x" * 97 for i in range(100)]  # 100 characters each
    done = claimed(store, worker, command(), T0)
    log(store, done, *lines)
    finish(store, done, T0)
    live = claimed(store, worker, command(), T0)
    log(store, live, *lines)
    cap = Retention(runs_s=None, runners_s=None, log_chars=1000, events_s=None)

    assert store.collect_garbage(cap, T0) == Collected(log_lines=90)

    kept = store.logs.read(done.id, 0, 10_000)
    assert [e.text for e in kept[:5]] == lines[:5]
    assert [e.text for e in kept[6:]] == lines[-5:]
    marker = kept[5]
    assert marker.line_no == MARKER_LINE_NO
    assert marker.text.startswith("[corral: 90 lines (9000 characters) removed")
    assert texts(store, live.id) == lines  # a live run's log is not trimmed
    assert store.collect_garbage(cap, T0) == Collected()  # under the cap now
    assert store.logs.read(done.id, 0, 10_000) == kept  # the marker too
    # A reader that had reached the middle goes on from its cursor.
    assert [e.text for e in store.logs.read(done.id, kept[5].id, 100)] == lines[-5:]
    # Trimmed again: one marker.
    lower = Retention(runs_s=None, runners_s=None, log_chars=400, events_s=None)
    assert store.collect_garbage(lower, T0) == Collected(log_lines=6)
    again = store.logs.read(done.id, 0, 10_000)
    assert [e.text for e in again if e.line_no != MARKER_LINE_NO] == lines[:2] + lines[-2:]
    assert [e.line_no for e in again].count(MARKER_LINE_NO) == 1
    assert again[2].line_no == MARKER_LINE_NO


@pytest.mark.anyio
async def test_the_coordinator_collects_on_its_own(db_url: str) -> None:
    """The periodic job: a coordinator started long after a run ended deletes it."""
    setup = Store.open(db_url)
    try:
        worker = register(setup, "worker")
        old = claimed(setup, worker, command(), T0)
        finish(setup, old, T0)
        live = claimed(setup, worker, command(), T0)
    finally:
        setup.close()
    settings = CoordinatorSettings(db_url=db_url, gc_interval_s=0.05, retention=RETENTION)
    clock = FakeClock(T0 + 31 * DAY)
    async with running_api(settings, clock=clock, reconcile=True) as api:
        await wait_until(
            lambda: gone(api.coordinator.store, old.id), timeout=30, what="the old run deleted"
        )
        assert (await api.run(live.id))["status"] in ("running", "pending")


@pytest.mark.anyio
async def test_runner_reports_may_be_larger_than_client_requests(db_url: str) -> None:
    settings = CoordinatorSettings(db_url=db_url, max_body_bytes=2000, max_runner_body_bytes=8000)
    filler = "x" * 3000
    async with running_api(settings) as api:
        client = await api.client.post("/runs", json={"type": "command", "command": [filler]})
        assert client.status_code == 413, client.text
        runner = await api.client.post("/runner/register", json={"name": "r", "hostname": filler})
        assert runner.status_code == 422, runner.text  # past the body limit: the field's own
        huge = await api.client.post("/runner/register", json={"name": "r", "x": filler * 3})
        assert huge.status_code == 413, huge.text
