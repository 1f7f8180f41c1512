"""``corral events`` prints one line for each kind of event, as the store writes them (a
kind it could not describe would end the command at the first such event): every kind,
from real changes on SQLite (the lines depend on the events' shape, not on the database)."""

from __future__ import annotations

from pathlib import Path

from corral.actors.model import NewActor
from corral.cli.events import describe
from corral.events import EventFilter, EventKind
from corral.pools import PoolError, Serverless
from corral.runs import NewRun, RunReport, RunStatus, RunType
from corral.store import LogLine, Store
from corral.store.events import EventStore
from corral.tasks.model import TaskSpec

NOW = 1_700_000_000.0


def test_every_kind_of_event_is_one_line_naming_what_changed(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "corral.db"))
    try:
        runner, _ = store.runners.register(
            name="box", hostname="h", labels=(), slots=2, version="1", transport="http", now=NOW
        )
        plan = store.projects.ensure("/repo", "main", NOW)
        store.tasks.add(plan.id, [TaskSpec(key="a", title="a", prompt="do a")], {}, NOW)
        run = store.runs.create(
            NewRun(type=RunType.COMMAND, command=("true",), session_name="s1"), NOW
        )
        store.runs.claim(runner.id, 1, NOW)
        store.runs.mark_started(run.id, runner.id, 1, NOW)
        store.logs.append(run.id, runner.id, 1, [LogLine(0, "stdout", "hello", NOW)])
        report = RunReport(RunStatus.COMPLETED, exit_code=0, session_id="sess-1")
        store.runs.finish(run.id, runner.id, 1, report, NOW)
        store.tasks.set_paused(plan.id, True, NOW, reason="for the test")
        actor = store.actors.create(NewActor("echo", "k", pool="sl"), NOW)[0]
        store.pools.put("sl", Serverless(url="http://127.0.0.1:9"), NOW)
        store.pools.record_demand("sl", 1, 1, NOW)
        store.pools.record_error("sl", PoolError.HTTP_ERROR, "GET /start: HTTP 503", NOW)
        events = EventStore(store.db).read(0, EventFilter(), limit=1000)
    finally:
        store.close()

    lines = {kind: [describe(e.to_json()) for e in events if e.kind == kind] for kind in EventKind}
    assert all(lines.values()), {k: v for k, v in lines.items() if not v}  # every kind seen
    assert all("\n" not in line for found in lines.values() for line in found)
    assert any(f"{run.id} running on {runner.id}" in line for line in lines[EventKind.RUN])
    assert (
        lines[EventKind.LOG] == [lines[EventKind.LOG][0]]
        and "stdout: hello" in lines[EventKind.LOG][0]
    )
    assert any("session sess-1 (s1) runs 1" in line for line in lines[EventKind.SESSION])
    assert any(f"{plan.id}/a" in line for line in lines[EventKind.TASK])
    assert any("paused" in line for line in lines[EventKind.PLAN])
    assert any(f"{actor.id} (echo) pending gen 0" in line for line in lines[EventKind.ACTOR])
    assert any("pool    sl wants 1 runners" in line for line in lines[EventKind.POOL])
    assert any("error http_error: GET /start: HTTP 503" in line for line in lines[EventKind.POOL])
