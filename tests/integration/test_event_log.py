"""The event log in the store, on SQLite and PostgreSQL: each change writes its event in
its own transaction (a change undone leaves none), ids only grow, filters, retention and
resume checks; a task's steps, actors (state, generation, placement) and pools (settings,
demand, errors) are events too; on PostgreSQL, concurrent writers never make a reader skip
an event."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.actors import lifecycle as lc
from corral.actors.lifecycle import CrashPolicy
from corral.actors.model import NewActor
from corral.errors import Gone, IllegalTransition, InvalidRequest
from corral.events import Event, EventFilter, EventKind
from corral.pools import PoolError, Serverless
from corral.runners import Runner, RunnerState
from corral.runs import NewRun, RunReport, RunStatus, RunType
from corral.store import LogLine, Store
from corral.store.db import PostgresDatabase
from corral.store.events import EventStore
from corral.store.schema import MIGRATIONS, render, statements
from corral.tasks.model import TaskSpec

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
    assert [e.data["text"] for e in found if e.kind == EventKind.LOG] == [
        "line 0",
        "line 1",
        "line 2",
    ]
    log = next(e for e in found if e.kind == EventKind.LOG)
    assert (log.run_id, log.runner_id, log.data["line_no"]) == (run.id, runner.id, 0)
    done = found[-1]
    assert done.run_id == run.id and done.runner_id == runner.id and done.at == NOW + 3
    assert done.data["exit_code"] == 0 and done.data["attempts"] == 1
    assert events.latest() == found[-1].id


# Strings a JSON encoder must escape, or pass through, for the text to stay one
# ``data:`` line whose JSON says exactly what was stored.
ODD = 'say "hi"\\ \r\n\tbye é \u2028 \x1b 😀'


def test_an_events_text_made_by_the_database_is_one_message_saying_what_was_stored(
    store: Store,
) -> None:
    events = EventStore(store.db)
    runner = register(store)
    at = 1_764_142_351.123_456_7  # more digits than SQLite's text of a REAL keeps
    run = store.runs.create(command(session_name=ODD), at)
    store.runs.claim(runner.id, 1, at)
    store.logs.append(run.id, runner.id, 1, [LogLine(0, "stderr", ODD, 2.5)])
    created, claimed, logged = read_all(events)[1:]
    for event in (created, claimed, logged):
        lines = event.sse.split("\n")
        assert lines[:2] == [f"id: {event.id}", f"event: {event.kind}"]
        assert lines[2].startswith("data: ") and lines[3:] == ["", ""]
        assert list(event.to_json()) == [
            "id", "kind", "at", "run_id", "session_id", "session_name", "plan_id",
            "runner_id", "actor_id", "pool", "data",
        ]  # fmt: skip
        said = event.to_json()
        assert [said[key] for key in Event._fields[:-1]] == list(event[:-1])
    assert created.session_name == created.to_json()["session_name"] == ODD
    assert created.at == at and claimed.at == at and claimed.runner_id == runner.id
    assert logged.data == {"attempt": 1, "line_no": 0, "stream": "stderr", "text": ODD, "ts": 2.5}
    assert logged.to_json()["session_name"] == ODD and logged.run_id == run.id


# Any text the store takes: no NUL, no lone surrogate (``wire.problem_with`` refuses them).
STORABLE = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=STORABLE, text=STORABLE, at=st.floats(0, 4e9, allow_nan=False))
def test_whatever_the_text_and_time_an_event_is_one_message_saying_them(
    store: Store, name: str, text: str, at: float
) -> None:
    events = EventStore(store.db)
    events.number()
    after = events.latest()
    runner = register(store, name=f"r{after}", now=at)
    run = store.runs.create(command(session_name=name or None), at)
    store.runs.claim(runner.id, 1, at)
    store.logs.append(run.id, runner.id, 1, [LogLine(0, "stdout", text, at)])
    found = [e for e in read_all(events, after) if e.run_id == run.id]
    assert [e.kind for e in found] == ["run", "run", "log"]
    for event in found:
        assert event.sse.count("\n") == 4 and event.sse.endswith("\n\n")  # one message
        said = event.to_json()
        assert said["session_name"] == (name or None) and said["at"] == at
    assert found[-1].data["text"] == text


def test_a_statement_changing_many_rows_writes_each_rows_event_once(store: Store) -> None:
    """A batch created, claimed, started and finished: one event a run at each step (on
    PostgreSQL written once a statement, in the order of the runs' ids)."""
    events = EventStore(store.db)
    runner = register(store)
    first = read_all(events)[-1].id
    runs = store.runs.create_many([command() for _ in range(6)], NOW)
    claimed = store.runs.claim(runner.id, 4, NOW + 1)
    held = [(run.id, 1) for run in claimed]
    store.runs.mark_started_many(runner.id, held, NOW + 2)
    done = RunReport(RunStatus.COMPLETED, exit_code=0)
    store.runs.finish_many(runner.id, [(i, 1, done) for i, _ in held], NOW + 3)
    store.runners.heartbeat(runner.id, None, NOW + 4)  # no change that is an event

    found = read_all(events, after=first)
    steps = [("pending", runs), ("claimed", claimed), ("running", claimed)]
    steps.append(("completed", claimed))
    at = 0
    for status, changed in steps:
        step = found[at : at + len(changed)]
        assert [e.data["status"] for e in step] == [status] * len(changed)
        ids = [e.run_id for e in step]
        assert sorted(ids) == sorted(run.id for run in changed)
        if store.db.dialect == "postgres":
            assert ids == sorted(ids)
        at += len(changed)
    assert at == len(found)


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
    queries = ({"run_id": mine.id}, {"session": "alpha"}, {"kind": "runner"})
    every = read_all(events)
    for event in every:  # the store's filter and the live one agree
        for query in queries:
            wanted = EventFilter.parse(**query)
            assert wanted.matches(event) == (
                event.id in {e.id for e in read_all(events, where=wanted)}
            )
    # The pump's round, up to its bound: for each filter the events it wants, one text.
    filters = [EventFilter(), *(EventFilter.parse(**query) for query in queries)]
    until, size, texts = events.read_round(every[0].id, filters, limit=len(every) - 2)
    assert (until, size) == (every[-2].id, len(every) - 2)
    for where in filters:
        picked = [e for e in every[1:-1] if where.matches(e)]
        ends = (picked[0].id, picked[-1].id) if picked else (0, 0)
        assert texts[where] == (len(picked), *ends, "".join(e.sse for e in picked))
    assert events.read_round(every[-1].id, filters, limit=10) == (every[-1].id, 0, {})


def _some_history(store: Store) -> None:
    """Two runners, runs in two sessions (one name odd), claims, starts, ends, log lines."""
    runners = [register(store, name) for name in ("r1", "r2")]
    for n in range(12):
        run = store.runs.create(command(session_name=("alpha", ODD, None)[n % 3]), NOW + n)
        runner = runners[n % 2]
        store.runs.claim(runner.id, 1, NOW + n)
        store.runs.mark_started(run.id, runner.id, 1, NOW + n)
        store.logs.append(run.id, runner.id, 1, [LogLine(0, "stdout", f"line {n}", NOW + n)])
        if n % 4:
            report = RunReport(RunStatus.COMPLETED, exit_code=0)
            store.runs.finish(run.id, runner.id, 1, report, NOW + n)


FILTERS = st.builds(
    EventFilter,
    kinds=st.frozensets(st.sampled_from(EventKind)),
    session=st.sampled_from([None, "alpha", ODD, "nobody"]),
    runner=st.sampled_from([None, "r1", "nobody"]),
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(filters=st.sets(FILTERS, max_size=4), start=st.integers(0, 80), limit=st.integers(1, 90))
def test_a_round_read_for_any_filters_and_bounds_is_each_filters_events_in_order(
    store: Store, filters: set[EventFilter], start: int, limit: int
) -> None:
    """The pump's round (``read_round``) against the events read one by one and filtered
    here: the same bound, and for each filter exactly its events' texts, in id order."""
    events = EventStore(store.db)
    if not read_all(events):
        _some_history(store)
    every = read_all(events)
    runner_ids = {r.name: r.id for r in store.runners.list()}
    filters = {  # the runners by their ids (the strategy knows their names)
        EventFilter(f.kinds, session=f.session, runner=runner_ids.get(f.runner or "", f.runner))
        for f in filters
    }
    after = every[0].id - 1 + start
    expected = [e for e in every if e.id > after][:limit]
    until, size, texts = events.read_round(after, filters, limit)
    if not expected:
        assert (until, size, texts) == (after, 0, {})
        return
    assert (until, size) == (expected[-1].id, len(expected))
    assert texts.keys() == filters
    for where in filters:
        picked = [e for e in expected if where.matches(e)]
        ends = (picked[0].id, picked[-1].id) if picked else (0, 0)
        assert texts[where] == (len(picked), *ends, "".join(e.sse for e in picked))


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
    # In id order: an event older than the cutoff behind a newer one waits for a later pass.
    store.runs.create(command(), NOW + 300)
    store.runs.create(command(), NOW + 200)
    assert events.collect(cutoff=NOW + 250, batch=10) == 1  # the one at +101
    assert [e.at for e in read_all(events)] == [NOW + 300, NOW + 200]


def test_each_step_of_a_task_attempt_is_an_event_naming_the_steps_done(store: Store) -> None:
    events = EventStore(store.db)
    plan = store.projects.ensure("/repo", "main", NOW)
    store.tasks.add(plan.id, [TaskSpec(key="a", title="a", prompt="do a")], {}, NOW)
    runner = register(store)
    store.tasks.start(plan.id, 1, NOW)
    (run,) = store.runs.claim(runner.id, 1, NOW + 1)
    store.runs.mark_started(run.id, runner.id, run.attempts, NOW + 1)
    before = read_all(events)[-1].id
    for i, step in enumerate(("worktree", "agent", "committed")):
        store.runs.record_task_step(run.id, runner.id, run.attempts, step, {"n": i}, NOW + 2 + i)

    found = read_all(events, after=before, where=EventFilter.parse(kind="task", plan=plan.id))
    assert [e.data["steps"] for e in found] == [
        ["worktree"],
        ["worktree", "agent"],
        ["worktree", "agent", "committed"],
    ]
    assert [e.at for e in found] == [NOW + 2, NOW + 3, NOW + 4]
    assert found[-1].data["status"] == "in_progress" and found[-1].run_id == run.id


def test_an_actors_states_generations_and_placements_are_its_events(store: Store) -> None:
    events = EventStore(store.db)
    first = register(store, "first")
    store.actors.host(first.id, "default", ("echo",), 1)
    actor = store.actors.create(NewActor("echo", "k", crash_policy=CrashPolicy.RESTART), NOW)[0]
    store.actors.runner_event(first.id, actor.id, lc.Running(first.id, 1), NOW + 1)
    second = register(store, "second")
    store.actors.host(second.id, "default", ("echo",), 1)
    store.runners.set_state(first.id, RunnerState.STOPPED, NOW + 2)  # lost: placed again
    store.actors.tick(NOW + 2)

    mine = read_all(events, where=EventFilter.parse(actor=actor.id))
    assert {e.kind for e in mine} == {EventKind.ACTOR}
    seen = [(e.data["state"], e.data["generation"], e.runner_id, e.data["placed"]) for e in mine]
    assert seen == [
        ("pending", 0, None, 0),  # created, queued: no runner hosts it yet
        ("starting", 1, None, 0),  # placed: its row is saved first …
        ("starting", 1, first.id, 1),  # … then its placement on the first runner
        ("running", 1, first.id, 1),
        ("pending", 1, first.id, 1),  # its runner was lost: to be placed again …
        ("pending", 1, first.id, 0),  # … released from the first runner (the one it left)
        ("starting", 2, None, 0),
        ("starting", 2, second.id, 1),  # placed on the second, a new generation
    ]
    assert all(e.pool == "default" and e.data["name"] == "echo" for e in mine)
    assert [e.at for e in mine] == sorted(e.at for e in mine)
    on_second = read_all(events, where=EventFilter.parse(kind="actor", runner=second.id))
    assert [e.data["generation"] for e in on_second] == [2]
    assert read_all(events, where=EventFilter.parse(pool="other")) == []


def test_a_pools_settings_demand_and_errors_are_its_events(store: Store) -> None:
    events = EventStore(store.db)
    config = Serverless(url="http://127.0.0.1:9", max_runners=3)
    store.pools.put("sl", config, NOW)
    assert store.pools.record_demand("sl", 2, 2, NOW + 1)
    assert not store.pools.record_demand("sl", 2, 2, NOW + 2)  # unchanged: no write, no event
    store.pools.record_error("sl", PoolError.HTTP_ERROR, "GET /start: HTTP 500", NOW + 3)
    store.pools.lease(["sl"], "scaler-1", NOW + 30, NOW + 4)  # who scales it: no event
    store.pools.put("sl", None, NOW + 5)

    found = read_all(events, where=EventFilter.parse(pool="sl"))
    assert {(e.kind, e.pool) for e in found} == {(EventKind.POOL, "sl")}
    assert [dict(e.data) for e in found] == [
        {"serverless": found[0].data["serverless"], "wanted_slots": None, "desired_runners": None},
        {"serverless": found[0].data["serverless"], "wanted_slots": 2, "desired_runners": 2},
        {"error_kind": "http_error", "error": "GET /start: HTTP 500"},
        {"serverless": None, "wanted_slots": 2, "desired_runners": 2},
    ]
    assert found[0].data["serverless"]["url"] == "http://127.0.0.1:9"
    assert [e.at for e in found] == [NOW, NOW + 1, NOW + 3, NOW + 5]
    pool = store.pools.get("sl")
    assert (pool.wanted_slots, pool.desired_runners) == (2, 2)


@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)
@pytest.mark.parametrize("reader", ["number then read", "the pump's round"])
def test_concurrent_writers_never_make_a_resuming_reader_skip_an_event(
    store: Store, store_url: str, reader: str
) -> None:
    """Writers commit out of the order their rows were written in (each holds its
    transaction open a while); a reader numbering and resuming after the last id it saw,
    over and over, must see every event exactly once, ids without a hole — numbering and
    reading in two transactions, or in one as the coordinator's event pump does."""
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
            if reader == "the pump's round":
                after, _, texts = events.read_round(after, [EventFilter()], limit=10_000)
                text = texts[EventFilter()].sse if texts else ""
                seen.extend(int(m.split("\n")[0][4:]) for m in text.split("\n\n")[:-1])
            else:
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


@pytest.mark.parametrize("dialect", ["postgres"])
def test_ids_given_before_they_had_a_table_of_their_own_stay_theirs(store_url: str) -> None:
    """Migration 18 on PostgreSQL moves the ids out of the event rows: the events numbered
    before it keep their ids and order, those committed but not yet numbered are numbered
    after them, and a new change's event comes after both."""
    old = PostgresDatabase(store_url)
    with old.transaction() as tx:  # the schema as migration 17 left it
        tx.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT)")
        for version, sql in MIGRATIONS:
            if version < 18:
                for statement in statements(render(sql, "postgres")):
                    tx.execute(statement)
                tx.execute("INSERT INTO schema_migrations VALUES (?, 'then')", (version,))
        for run_id in ("numbered-1", "numbered-2", "unnumbered"):
            tx.execute(
                "INSERT INTO events (kind, at, run_id, data) VALUES ('run', ?, ?, '{}')",
                (NOW, run_id),
            )
        tx.execute("UPDATE events SET id = seq WHERE run_id <> 'unnumbered'")
        tx.execute("UPDATE event_log SET last_id = 2")
    old.close()

    store = Store.open(store_url)
    try:
        events = EventStore(store.db)
        assert [(e.id, e.run_id) for e in read_all(events)] == [
            (1, "numbered-1"),
            (2, "numbered-2"),
            (3, "unnumbered"),
        ]
        run = store.runs.create(command(), NOW)
        assert [(e.id, e.run_id) for e in read_all(events, after=3)] == [(4, run.id)]
        assert events.latest() == 4
    finally:
        store.close()
