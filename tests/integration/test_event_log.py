"""The event log in the store, on SQLite and PostgreSQL: each change writes its event in
its own transaction (a change undone leaves none), ids only grow, filters, retention and
resume checks; on PostgreSQL, concurrent writers never make a reader skip an event."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from corral.errors import Gone, IllegalTransition, InvalidRequest
from corral.events import Event, EventFilter, EventKind
from corral.runners import Runner, RunnerState
from corral.runs import NewRun, RunReport, RunStatus, RunType
from corral.store import LogLine, Store
from corral.store.events import EventStore

NOW = 1_700_000_000.0


def command(**kw: Any) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=("echo", "hi"), **kw)


def register(store: Store, name: str = "r", now: float = NOW) -> Runner:
    runner, _ = store.runners.register(
        name=name,
        hostname=f"{name}.host",
        labels=(),
        slots=4,
        version="0.1.0",
        transport="http",
        now=now,
        runner_id=None,
        held=(),
    )
    return runner


def read_all(events: EventStore, after: int = 0, where: EventFilter | None = None) -> list[Event]:
    events.number()
    return events.read(after, where or EventFilter(), limit=10_000)


def test_a_runs_life_is_its_events_in_order(store: Store) -> None:
    events = EventStore(store.db)
    runner = register(store)
    run = store.runs.create(command(), NOW)
    store.runs.claim(runner.id, 1, NOW + 1)
    store.runs.mark_started(run.id, runner.id, 1, NOW + 2)
    lines = [LogLine(i, "stdout", f"line {i}", NOW + 2) for i in range(3)]
    store.logs.append(run.id, runner.id, 1, lines)
    store.runs.finish(run.id, runner.id, 1, RunReport(RunStatus.COMPLETED, exit_code=0), NOW + 3)

    found = read_all(events)
    ids = [e.id for e in found]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [(e.kind, e.data.get("status", e.data.get("state"))) for e in found] == [
        (EventKind.RUNNER, "active"),
        (EventKind.RUN, "pending"),
        (EventKind.RUN, "claimed"),
        (EventKind.RUN, "running"),
        (EventKind.LOG, None),
        (EventKind.LOG, None),
        (EventKind.LOG, None),
        (EventKind.RUN, "completed"),
    ]
    assert [e.data["text"] for e in found if e.kind is EventKind.LOG] == [
        "line 0",
        "line 1",
        "line 2",
    ]
    log = next(e for e in found if e.kind is EventKind.LOG)
    assert (log.run_id, log.runner_id, log.data["line_no"]) == (run.id, runner.id, 0)
    done = found[-1]
    assert done.run_id == run.id and done.runner_id == runner.id and done.at == NOW + 3
    assert done.data["exit_code"] == 0 and done.data["attempts"] == 1
    assert events.latest() == found[-1].id


def test_a_refused_change_writes_no_event(store: Store) -> None:
    events = EventStore(store.db)
    runner = register(store)
    run = store.runs.create(command(), NOW)
    store.runs.claim(runner.id, 1, NOW)
    store.runs.mark_started(run.id, runner.id, 1, NOW)
    store.runs.finish(run.id, runner.id, 1, RunReport(RunStatus.COMPLETED, exit_code=0), NOW)
    before = read_all(events)
    with pytest.raises(IllegalTransition):
        store.runs.request_cancel(run.id, NOW + 1)  # finished: nothing changes
    with pytest.raises(Exception), store.db.transaction() as tx:  # noqa: B017
        tx.execute("UPDATE runs SET status = 'failed' WHERE id = ?", (run.id,))
        raise RuntimeError("undone")  # the change and its event go together
    assert read_all(events) == before


def test_a_heartbeat_is_no_event_but_a_drain_is(store: Store) -> None:
    events = EventStore(store.db)
    runner = register(store)
    first = read_all(events)
    store.runners.heartbeat(runner.id, None, NOW + 5)
    assert read_all(events) == first
    store.runners.set_state(runner.id, RunnerState.DRAINING, NOW + 6)
    (drained,) = read_all(events, after=first[-1].id)
    assert (drained.kind, drained.runner_id, drained.data["state"]) == (
        EventKind.RUNNER,
        runner.id,
        "draining",
    )


def test_filters_pick_their_events(store: Store) -> None:
    events = EventStore(store.db)
    runner = register(store)
    mine = store.runs.create(command(session_name="alpha"), NOW)
    other = store.runs.create(command(), NOW)
    store.runs.claim(runner.id, 2, NOW)

    def ids(**query: str) -> set[str | None]:
        return {e.run_id for e in read_all(events, where=EventFilter.parse(**query))}

    assert ids(run_id=mine.id) == {mine.id}
    assert ids(session="alpha") == {mine.id}
    assert ids(kind="runner") == {None}
    assert ids(kind="run,log", runner=runner.id) == {mine.id, other.id}
    assert ids(plan="prj_none") == set()
    with pytest.raises(InvalidRequest, match="not an event kind"):
        EventFilter.parse(kind="run,bogus")
    for event in read_all(events):  # the store's filter and the live one agree
        for query in ({"run_id": mine.id}, {"session": "alpha"}, {"kind": "runner"}):
            wanted = EventFilter.parse(**query)
            assert wanted.matches(event) == (
                event.id in {e.id for e in read_all(events, where=wanted)}
            )


def test_retention_deletes_old_events_and_refuses_a_resume_from_them(store: Store) -> None:
    events = EventStore(store.db)
    register(store, now=NOW)
    for i in range(5):
        store.runs.create(command(), NOW + i)
    found = read_all(events)
    assert len(found) == 6
    assert events.collect(cutoff=NOW + 3, batch=2) == 4  # the runner and runs at +0 .. +2
    kept = read_all(events)
    assert [e.id for e in kept] == [e.id for e in found[4:]]
    assert events.check_resume(found[3].id) == found[3].id  # nothing after it is gone
    with pytest.raises(Gone) as gone:
        events.check_resume(found[2].id)
    assert gone.value.code == "events_expired" and gone.value.http_status == 410
    with pytest.raises(InvalidRequest) as unknown:
        events.check_resume(found[-1].id + 1)
    assert unknown.value.code == "unknown_event_id"
    # Ids are never given again, even once every event is gone; events nobody read yet
    # (on PostgreSQL: not numbered yet) go too.
    store.runs.create(command(), NOW + 50)
    assert events.collect(cutoff=NOW + 100, batch=10) == 3
    store.runs.create(command(), NOW + 101)
    (newest,) = read_all(events, after=found[-1].id)
    assert newest.id > found[-1].id


@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)
def test_concurrent_writers_never_make_a_resuming_reader_skip_an_event(
    store: Store, store_url: str
) -> None:
    """Writers commit out of the order their rows were written in (each holds its
    transaction open a while); a reader numbering and resuming after the last id it saw,
    over and over, must see every event exactly once, ids without a hole."""
    events = EventStore(store.db)
    writers, runs_each = 6, 25
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(index: int) -> None:
        own = Store.open(store_url)
        try:
            for i in range(runs_each):
                with own.db.transaction() as tx:
                    own.runs.create(command(session_name=f"w{index}"), NOW + i)
                    # Hold the transaction open: later writers commit first.
                    tx.execute("SELECT pg_sleep(?)", ((index % 3) * 0.002,))
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    seen: list[int] = []

    def read() -> None:
        after = 0
        while not stop.is_set() or events.number():
            batch = read_all(events, after=after)
            seen.extend(e.id for e in batch)
            after = batch[-1].id if batch else after

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    reader.join()
    assert not errors, errors
    seen.extend(e.id for e in read_all(events, after=seen[-1] if seen else 0))
    assert seen == list(range(1, writers * runs_each + 1))
