"""Group commit (``coordinator/writer.py``) on SQLite and PostgreSQL: the calls of a group
share one transaction — flat when nobody refuses, else each as it would run alone: a
refused one undoes only its own writes, a flat one joins its own savepoint, a runner's
refused report undoes only itself — and a call that fails otherwise makes them all run
again one by one, none applied twice.
A group runs its calls in the order of their runners (the order row locks are taken in);
on PostgreSQL, a group ended as a deadlock's victim runs again call by call."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from api_fixtures import PG_URL, backend_url

from corral.coordinator.link_core import Outcome, apply_reports, parse_events
from corral.coordinator.writer import StoreWriter, answer, run_group
from corral.errors import LeaseLost, Unavailable
from corral.protocol.messages import Indexed
from corral.runs import NewRun, RunStatus, RunType
from corral.store import Store
from corral.store.actors import Changes

NOW = 1_700_000_000.0


def create(store: Store, name: str) -> Callable[[], str]:
    return lambda: store.runs.create(NewRun(type=RunType.COMMAND, command=(name,)), NOW).id


def commands(store: Store) -> list[str]:
    return sorted(run.command[0] for run in store.runs.list(limit=100))


def test_a_refused_call_undoes_only_its_own_writes(store: Store) -> None:
    def refused() -> None:
        with store.db.transaction():
            store.runs.create(NewRun(type=RunType.COMMAND, command=("b",)), NOW)
            raise LeaseLost("refused")

    answers = run_group(store.db, [create(store, "a"), refused, create(store, "c")])
    errors = [error for error, _ in answers]
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], LeaseLost)
    assert commands(store) == ["a", "c"]


def test_a_group_nobody_refuses_runs_each_call_once(store: Store) -> None:
    ran: list[str] = []

    def counted(name: str) -> Callable[[], str]:
        return lambda: (ran.append(name), create(store, name)())[1]

    answers = run_group(store.db, [counted("a"), counted("b")])
    assert [error for error, _ in answers] == [None, None]
    assert ran == ["a", "b"]  # flat: one try
    assert commands(store) == ["a", "b"]


def test_a_call_that_fails_otherwise_makes_each_run_alone_and_none_twice(store: Store) -> None:
    ran: list[str] = []

    def counted(name: str) -> Callable[[], str]:
        def call() -> str:
            ran.append(name)
            return create(store, name)()

        return call

    def broken() -> None:
        with store.db.transaction():
            store.runs.create(NewRun(type=RunType.COMMAND, command=("b",)), NOW)
            raise RuntimeError("a bug")

    answers = run_group(store.db, [counted("a"), broken, counted("c")])
    assert answers[0][0] is None and answers[2][0] is None
    assert isinstance(answers[1][0], RuntimeError)
    assert ran == ["a", "a", "c"]  # the group's try was rolled back: "a" ran again alone
    assert commands(store) == ["a", "c"]


def test_a_call_that_ends_the_groups_transaction_makes_each_run_alone(store: Store) -> None:
    def ends_it() -> None:
        with store.db.transaction() as tx:
            tx.execute("ROLLBACK")  # the group's transaction is gone: its own rollback fails
            raise RuntimeError("a bug")

    answers = run_group(store.db, [create(store, "a"), ends_it, create(store, "c")])
    assert answers[0][0] is None and answers[2][0] is None
    assert answers[1][0] is not None
    assert commands(store) == ["a", "c"]


def test_a_flat_call_joins_its_own_savepoint_and_is_undone_whole(store: Store) -> None:
    run_id = create(store, "x")()

    def flat_then_refused() -> None:
        with store.db.transaction(flat=True):
            store.runs.request_cancel(run_id, NOW)  # joins the call's savepoint
            raise LeaseLost("a later report is refused")

    answers = run_group(store.db, [flat_then_refused, create(store, "a")])
    assert isinstance(answers[0][0], LeaseLost) and answers[1][0] is None
    assert store.runs.get(run_id).status is RunStatus.PENDING
    assert commands(store) == ["a", "x"]


def test_a_refused_report_in_a_group_undoes_only_itself(store: Store) -> None:
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=[], slots=2, version="t", transport="websocket", now=NOW
    )
    for _ in range(2):
        store.runs.create(NewRun(type=RunType.COMMAND, command=("true",)), NOW)
    a, b = (run.id for run in store.runs.claim(runner.id, 2, NOW))
    bodies: list[dict[str, Any]] = [
        {"type": "started", "run_id": a, "attempt": 1},
        {"type": "finished", "run_id": b, "attempt": 7, "status": "failed"},  # not its lease
        {"type": "finished", "run_id": a, "attempt": 1, "status": "completed", "exit_code": 0},
    ]
    batch = parse_events([Indexed(i, body) for i, body in enumerate(bodies, 1)])

    def then(outcomes: list[Outcome], _: Changes) -> None:
        store.commands.events_applied(runner.id, 3)

    answers = run_group(
        store.db,
        [
            create(store, "before"),
            lambda: apply_reports(store, runner.id, batch, NOW + 1, then),
            create(store, "after"),
        ],
    )
    assert [error for error, _ in answers] == [None, None, None]
    outcomes = answers[1][1].outcomes
    assert outcomes[0][0] is None and outcomes[2][0] is None
    assert isinstance(outcomes[1][0], LeaseLost)
    assert store.runs.get(a).status is RunStatus.COMPLETED
    assert store.runs.get(b).status is RunStatus.CLAIMED  # untouched
    assert store.commands.state(runner.id).last_event_idx == 3
    assert "before" in commands(store) and "after" in commands(store)


@pytest.mark.anyio
async def test_callers_are_answered_once_their_group_committed(store: Store) -> None:
    answered: list[int] = []
    writer = StoreWriter(store.db, lambda: answered.append(1))
    try:
        ids = await asyncio.gather(*(writer.call(create(store, str(n))) for n in range(10)))
        assert sorted(store.runs.get(i).command[0] for i in ids) == [str(n) for n in range(10)]
        with pytest.raises(LeaseLost):
            await writer.call(lambda: (_ for _ in ()).throw(LeaseLost("refused")))
        assert answered  # once a group: the calls may have written events
    finally:
        await writer.close()
    with pytest.raises(Unavailable):
        await writer.call(create(store, "late"))


@pytest.mark.anyio
async def test_a_cancelled_caller_waits_until_its_call_has_run(store: Store) -> None:
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> None:
        started.set()
        release.wait(30)
        ran.append("slow")

    writer = StoreWriter(store.db, lambda: None)
    try:
        task = asyncio.create_task(writer.call(slow))
        await asyncio.to_thread(started.wait, 30)
        task.cancel()
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done()  # it waits for the call, as a worker thread's caller does
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ran == ["slow"]
    finally:
        release.set()
        await writer.close()


@pytest.mark.anyio
async def test_a_group_runs_its_calls_in_runners_order_each_runners_in_turn(store: Store) -> None:
    ran: list[str] = []

    def call(name: str) -> Callable[[], None]:
        return lambda: ran.append(name)

    writer = StoreWriter(store.db, lambda: None)
    try:
        queued = [("b", "b1"), ("a", "a1"), ("c", "c1"), ("b", "b2"), ("a", "a2")]
        await asyncio.gather(*(writer.call(call(name), runner) for runner, name in queued))
    finally:
        await writer.close()
    assert ran == ["a1", "a2", "b1", "b2", "c1"]


@pytest.mark.anyio
async def test_calls_submitted_in_one_turn_share_a_group_and_runners_hear_first(
    store: Store,
) -> None:
    """A client's create and the claims it woke commit together; the claims' sockets are
    answered first (their starts go out before the create's HTTP answer)."""
    groups: list[int] = []
    heard: list[str] = []
    writer = StoreWriter(store.db, lambda: groups.append(1))
    try:
        created = writer.submit(create(store, "a"))
        claimed = writer.submit(lambda: "claimed", "rnr_1")
        created.add_done_callback(lambda _: heard.append("client"))
        claimed.add_done_callback(lambda _: heard.append("runner"))
        assert await answer(claimed) == "claimed"
        assert commands(store) == ["a"] and await answer(created)
    finally:
        await writer.close()
    assert groups == [1]
    assert heard == ["runner", "client"]


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    """A fresh PostgreSQL schema's URL."""
    with backend_url("postgres", tmp_path) as url:
        yield url


@pytest.mark.postgres
def test_a_group_ended_as_a_deadlock_victim_runs_call_by_call(pg_url: str) -> None:
    store = Store.open(pg_url)
    a, b = two_runners(store)
    lock = "SELECT id FROM runners WHERE id = %s FOR NO KEY UPDATE"
    # Another transaction holds b, then waits for a, which the group's first call holds:
    # the group's second call waiting for b closes the cycle. The group's backend looks for
    # a deadlock first (100 ms, the other's 10 s): the group is the victim.
    other = psycopg.connect(pg_url)
    other.execute("SET deadlock_timeout = '10s'")
    other.execute(lock, (b,))
    other_waits = threading.Thread(target=lambda: (other.execute(lock, (a,)), other.commit()))
    ran: list[str] = []

    def lock_a() -> None:
        with store.db.transaction() as tx:
            tx.execute("SET LOCAL deadlock_timeout = '100ms'")
            tx.execute(lock.replace("%s", "?"), (a,))
            ran.append("a")
            if len(ran) == 1:
                other_waits.start()
                blocked(other.info.backend_pid)

    def lock_b() -> None:
        with store.db.transaction() as tx:
            tx.execute(lock.replace("%s", "?"), (b,))
            ran.append("b")

    try:
        answers = run_group(store.db, [lock_a, lock_b])
        other_waits.join(30)
    finally:
        other.close()
        store.close()
    assert answers == [(None, None), (None, None)]
    assert ran == ["a", "a", "b"]  # the group's try was undone; then each call alone


def two_runners(store: Store) -> tuple[str, str]:
    a, b = (
        store.runners.register(
            name=name, hostname="h", labels=[], slots=1, version="t", transport="websocket", now=NOW
        )[0].id
        for name in ("a", "b")
    )
    return a, b


def blocked(pid: int) -> None:
    """Return once the backend ``pid`` waits for a lock."""
    deadline = time.monotonic() + 30
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        while not conn.execute("SELECT pg_blocking_pids(%s) <> '{}'", (pid,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the other transaction never waited"
            time.sleep(0.01)


@pytest.mark.postgres
@pytest.mark.anyio
async def test_groups_side_by_side_lock_runners_in_one_order_never_deadlocking(
    pg_url: str,
) -> None:
    store = Store.open(pg_url)
    a, b = two_runners(store)
    both_began, one_began = threading.Barrier(2, timeout=30), threading.Event()
    ran: list[str] = []

    def begin() -> None:
        one_began.set()
        both_began.wait()

    def lock(runner: str) -> Callable[[], None]:
        def call() -> None:
            with store.db.transaction() as tx:
                tx.execute("SELECT id FROM runners WHERE id = ? FOR NO KEY UPDATE", (runner,))
                ran.append(runner)

        return call

    def group(runners: list[str]) -> list[Awaitable[None]]:
        # Its first call ("" comes before any runner) waits until the other group began.
        calls = [("", begin), *((r, lock(r)) for r in runners)]
        return [writer.call(call, runner) for runner, call in calls]

    writer = StoreWriter(store.db, lambda: None)
    try:
        first = asyncio.gather(*group([a, b]))
        await asyncio.to_thread(one_began.wait, 30)  # a writer thread took the first group
        await asyncio.gather(first, *group([b, a]))  # the other thread takes this one
    finally:
        await writer.close()
        store.close()
    # Taken in the order they came, a then b beside b then a would deadlock: one group
    # would be undone and run again.
    assert sorted(ran) == sorted([a, a, b, b])
