"""The Store under concurrency: many claimers, racing reports, claims racing reconcile.

PostgreSQL claimers are threads, each with its own Store (its own connection pool) on
the same schema; SQLite claimers are processes (``spawn``) sharing one database file.
The claim tests assert that no run is given to two claimers, none is lost, and each is
completed exactly once on its first attempt; the race tests, that of two conflicting
operations exactly one takes effect and neither fails or strands a run.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.coordinator.link_core import _start_body
from corral.errors import CorralError, IllegalTransition, LeaseLost
from corral.events import EventFilter, EventKind
from corral.ids import RunId, RunnerId
from corral.runners import RunnerState
from corral.runs import NewRun, Run, RunReport, RunStatus, RunType
from corral.store import Reconciled, Store
from corral.store.commands import START_RUN, Command
from corral.store.events import EventStore

NOW = 1_700_000_000.0
DONE = RunReport(status=RunStatus.COMPLETED, exit_code=0, result="ok")
T = TypeVar("T")

postgres_only = pytest.mark.parametrize(
    "dialect", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def register(store: Store, name: str, now: float = NOW) -> RunnerId:
    runner, _ = store.runners.register(
        name=name, hostname=name, labels=(), slots=4, version="0", transport="http", now=now
    )
    return runner.id


def command(**kw: Any) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=("true",), **kw)


@contextmanager
def stores(url: str, count: int) -> Iterator[list[Store]]:
    """``count`` independent Stores on ``url`` (on PostgreSQL: one connection pool each)."""
    opened: list[Store] = []
    try:
        for _ in range(count):
            opened.append(Store.open(url))
        yield opened
    finally:
        for s in opened:
            s.close()


def run_threads(targets: list[Callable[[], T]], timeout: float = 60.0) -> list[T]:
    """Run each target in its own thread, started together; re-raise the first failure."""
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(i: int) -> None:
        try:
            barrier.wait()
            results[i] = targets[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]
    return results


def drain(store: Store, runner_id: RunnerId, seed: int) -> list[RunId]:
    """Claim 1–4 runs at a time and complete them until nothing is pending; the ids claimed."""
    rng = random.Random(seed)
    claimed: list[RunId] = []
    while True:
        want = rng.randint(1, 4)
        runs = store.runs.claim(runner_id, want, NOW + 1)
        assert len(runs) <= want
        if not runs:
            if not store.runs.list(statuses=[RunStatus.PENDING], limit=1):
                return claimed
            continue  # the pending ones were locked by other claimers for a moment
        for run in runs:
            assert run.runner_id == runner_id and run.status is RunStatus.CLAIMED
            claimed.append(run.id)
            store.runs.mark_started(run.id, runner_id, run.attempts, NOW + 2)
            store.runs.finish(run.id, runner_id, run.attempts, DONE, NOW + 3)


def assert_each_run_done_once(
    store: Store, created: list[Run], claims: dict[RunnerId, list[RunId]]
) -> None:
    all_claims = [run_id for ids in claims.values() for run_id in ids]
    doubles = [run_id for run_id, n in Counter(all_claims).items() if n > 1]
    assert doubles == [], f"{len(doubles)} runs were claimed twice"
    assert set(all_claims) == {r.id for r in created}, "some runs were never claimed"
    claimer = {run_id: runner for runner, ids in claims.items() for run_id in ids}
    final = store.runs.list(limit=len(created) + 1)
    assert len(final) == len(created)
    for run in final:
        assert run.status is RunStatus.COMPLETED, run
        assert run.attempts == 1, run
        assert run.runner_id == claimer[run.id]
    assert sum(1 for ids in claims.values() if ids) > 1, "only one claimer ever got work"


# ---- many claimers ---------------------------------------------------------------------------


@postgres_only
def test_postgres_concurrent_claimers_never_double_claim(store: Store, store_url: str) -> None:
    clients, total = 8, 3000
    created = store.runs.create_many([command(priority=i % 3) for i in range(total)], NOW)
    runners = [register(store, f"r{i}") for i in range(clients)]
    with stores(store_url, clients) as own:
        results = run_threads(
            [partial(drain, s, r, i) for i, (s, r) in enumerate(zip(own, runners, strict=True))]
        )
    assert_each_run_done_once(store, created, dict(zip(runners, results, strict=True)))


def _sqlite_worker(url: str, runner_id: str, seed: int, out: Any) -> None:
    """One claimer process: drain the queue and send back the ids it claimed."""
    store = Store.open(url)
    try:
        out.put((runner_id, drain(store, RunnerId(runner_id), seed), None))
    except BaseException as exc:
        out.put((runner_id, [], repr(exc)))
    finally:
        store.close()


def test_sqlite_concurrent_processes_never_double_claim(tmp_path: Path) -> None:
    url = str(tmp_path / "corral.db")
    processes, total = 4, 2000
    with stores(url, 1) as (store,):
        created = store.runs.create_many([command(priority=i % 3) for i in range(total)], NOW)
        runners = [register(store, f"p{i}") for i in range(processes)]
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_sqlite_worker, args=(url, r, i, out), daemon=True)
            for i, r in enumerate(runners)
        ]
        for p in procs:
            p.start()
        try:
            reports = [out.get(timeout=60) for _ in procs]  # before join: drain the pipe
            for p in procs:
                p.join(10)
                assert p.exitcode == 0
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
            out.close()
            out.join_thread()
        failures = [f"{r}: {err}" for r, _, err in reports if err]
        assert failures == []
        claims = {RunnerId(r): ids for r, ids, _ in reports}
        assert_each_run_done_once(store, created, claims)


# ---- racing reports --------------------------------------------------------------------------


def report_as(
    store: Store, run: Run, runner: RunnerId, report: RunReport, now: float
) -> Run | LeaseLost:
    """``runs.finish`` for ``run``'s attempt, returning a refusal instead of raising it."""
    try:
        return store.runs.finish(run.id, runner, run.attempts, report, now)
    except LeaseLost as exc:
        return exc


def held_run(store: Store, runner: RunnerId, spec: NewRun) -> Run:
    """A run created, claimed by ``runner`` and started (nothing else is pending)."""
    store.runs.create(spec, NOW)
    (run,) = store.runs.claim(runner, 1, NOW)
    store.runs.mark_started(run.id, runner, run.attempts, NOW)
    return store.runs.get(run.id)


@postgres_only
def test_postgres_the_same_report_twice_at_once_is_one_transition(
    store: Store, store_url: str
) -> None:
    runner = register(store, "r")
    with stores(store_url, 2) as (a, b):
        for i in range(25):
            run = held_run(store, runner, command(session_name=f"s{i}"))
            report = RunReport(
                status=RunStatus.COMPLETED, result="ok", cost_usd=1.0, session_id=f"sess-{i}"
            )
            first, second = run_threads(
                [
                    partial(report_as, a, run, runner, report, NOW + 10),
                    partial(report_as, b, run, runner, report, NOW + 20),
                ]
            )
            assert first == second  # the later one saw the first's transition: a repeat
            assert isinstance(first, Run) and first.status is RunStatus.COMPLETED
            assert first.finished_at in (NOW + 10, NOW + 20)
            assert store.runs.get(run.id) == first
            session = store.sessions.get(f"sess-{i}")
            assert (session.runs, session.cost_usd) == (1, 1.0)  # finished once


@postgres_only
def test_postgres_reports_from_two_runners_at_once_one_wins(store: Store, store_url: str) -> None:
    holder, other = register(store, "holder"), register(store, "other")
    with stores(store_url, 2) as (a, b):
        for i in range(25):
            run = held_run(store, holder, command())
            racers = [(a, holder), (b, other)] if i % 2 else [(b, other), (a, holder)]
            results = run_threads([partial(report_as, s, run, r, DONE, NOW + 5) for s, r in racers])
            by_runner = dict(zip([r for _, r in racers], results, strict=True))
            assert isinstance(by_runner[other], LeaseLost)
            won = by_runner[holder]
            assert isinstance(won, Run) and won.status is RunStatus.COMPLETED
            assert store.runs.get(run.id) == won


# ---- racing the reconciler -------------------------------------------------------------------

LATER = NOW + 100  # a runner silent since NOW is lost by then


def reconcile(store: Store) -> Reconciled:
    return store.reconcile(LATER, lost_after_s=30, timeout_grace_s=5)


@postgres_only
def test_postgres_a_claim_racing_reconcile_never_strands_a_run(
    store: Store, store_url: str
) -> None:
    """A runner declared lost while it claims: the run must not stay with the lost runner
    (it would never be taken back: the reconciler only looks at live runners). Either the
    reconciler wins (the runner is lost, the claim refused, the run still pending), or the
    claim does (a claim is a heartbeat: the runner is heard, not silent, and holds the run)."""
    with stores(store_url, 2) as (claimer, reconciler):
        for i in range(40):
            runner = register(store, f"r{i}", now=NOW)
            run = store.runs.create(command(), NOW)
            run_threads(
                [partial(claim_unless_lost, claimer, runner), partial(reconcile, reconciler)]
            )
            state = store.runners.get(runner).state
            after = store.runs.get(run.id)
            if state is RunnerState.LOST:
                assert after.status is RunStatus.PENDING, f"iteration {i}: {after}"
                assert after.runner_id is None
            else:
                assert state is RunnerState.ACTIVE
                assert after.status is RunStatus.CLAIMED, f"iteration {i}: {after}"
                assert after.runner_id == runner
            store.runs.request_cancel(run.id, LATER)


def claim_unless_lost(claimer: Store, runner: RunnerId) -> list[Run]:
    """Claim; if the reconciler won the race, the runner is told it was lost."""
    try:
        return claimer.runs.claim(runner, 1, LATER)
    except LeaseLost as exc:
        assert exc.code == "runner_lost"
        return []


@postgres_only
def test_postgres_a_report_racing_reconcile_is_one_or_the_other(
    store: Store, store_url: str
) -> None:
    """A silent runner reports just as it is declared lost: the run is completed either
    way — the report first (and the reconciler leaves it), or taken back first and then
    ended by the report, late (nobody claimed it in between) — once, and neither side
    fails (no "changed under us", no deadlock over the session's runner)."""
    with stores(store_url, 2) as (reporter, reconciler):
        for i in range(40):
            runner = register(store, f"r{i}", now=NOW)
            run = held_run(store, runner, command(session_name=f"s{i}"))
            report = RunReport(status=RunStatus.COMPLETED, session_id=f"sess-{i}", cost_usd=1.0)
            finished, reconciled = run_threads(
                [
                    partial(report_as, reporter, run, runner, report, LATER),
                    partial(reconcile, reconciler),
                ]
            )
            after = store.runs.get(run.id)
            assert isinstance(finished, Run), f"iteration {i}: {finished}"
            assert after == finished and after.status is RunStatus.COMPLETED
            assert reconciled.requeued in ([], [run.id])
            assert store.sessions.get(f"sess-{i}").runs == 1


@postgres_only
def test_postgres_two_reconcilers_at_once_take_each_run_back_once(
    store: Store, store_url: str
) -> None:
    """Two coordinators reconciling together: no deadlock, each change made once."""
    with stores(store_url, 2) as (a, b):
        for i in range(10):
            runners = [register(store, f"r{i}-{j}", now=NOW) for j in range(4)]
            runs = [held_run(store, r, command()) for r in runners for _ in range(2)]
            first, second = run_threads([partial(reconcile, a), partial(reconcile, b)])
            lost = first.lost_runners + second.lost_runners
            requeued = first.requeued + second.requeued
            assert sorted(lost) == sorted(runners)
            assert sorted(requeued) == sorted(r.id for r in runs)
            for run in runs:
                store.runs.request_cancel(run.id, LATER)


# ---- the grace of a lost last attempt ------------------------------------------------------

GRACE_OVER = LATER + 31  # a run lost at LATER waits its runner's threshold (30 s)


def lost_last_attempts(store: Store, count: int) -> list[Run]:
    """``count`` runs, each the only attempt of a runner lost at LATER: waiting lost."""
    runners = [register(store, f"r{i}", now=NOW) for i in range(count)]
    runs = [held_run(store, r, command(max_attempts=1, session_name=f"s-{r}")) for r in runners]
    assert sorted(reconcile(store).waiting) == sorted(r.id for r in runs)
    return runs


def fail_lost(store: Store) -> Reconciled:
    return store.reconcile(GRACE_OVER, lost_after_s=30, timeout_grace_s=5)


def run_statuses(store: Store, run_id: str) -> list[str]:
    """The statuses the run's events tell, in order."""
    events = EventStore(store.db)
    events.number()
    where = EventFilter(kinds=frozenset({EventKind.RUN}), run_id=run_id)
    return [str(e.data["status"]) for e in events.read(0, where, 1_000)]


@postgres_only
def test_postgres_two_reconcilers_at_the_graces_end_fail_each_run_once(
    store: Store, store_url: str
) -> None:
    runs = lost_last_attempts(store, 8)
    with stores(store_url, 2) as (a, b):
        first, second = run_threads([partial(fail_lost, a), partial(fail_lost, b)])
    assert sorted(first.failed + second.failed) == sorted(r.id for r in runs)
    for run in runs:
        assert store.runs.get(run.id).status is RunStatus.FAILED
        assert run_statuses(store, run.id).count("failed") == 1


def report_unless_ended(store: Store, run: Run, report: RunReport) -> Run | CorralError:
    assert run.runner_id is not None
    try:
        return store.runs.finish(run.id, run.runner_id, run.attempts, report, GRACE_OVER)
    except CorralError as exc:
        return exc


@postgres_only
def test_postgres_a_late_report_racing_the_graces_end_is_one_or_the_other(
    store: Store, store_url: str
) -> None:
    """The report first (completed, and the reconciler leaves it), or the reconciler first
    (failed, and the report refused as too late): one end, one event, the session's run
    counted once."""
    with stores(store_url, 2) as (reporter, reconciler):
        for i in range(20):
            (run,) = lost_last_attempts(store, 1)
            report = RunReport(status=RunStatus.COMPLETED, session_id=f"sess-{i}", cost_usd=1.0)
            finished, reconciled = run_threads(
                [
                    partial(report_unless_ended, reporter, run, report),
                    partial(fail_lost, reconciler),
                ]
            )
            after = store.runs.get(run.id)
            if isinstance(finished, Run):
                assert after == finished and after.status is RunStatus.COMPLETED, i
                assert reconciled.failed == []
                assert store.sessions.get(f"sess-{i}").runs == 1
            else:
                assert isinstance(finished, IllegalTransition), finished
                assert after.status is RunStatus.FAILED and reconciled.failed == [run.id]
            statuses = run_statuses(store, run.id)
            assert statuses[-2] == "lost" and statuses[-1] == after.status


def test_closing_a_sqlite_store_waits_for_a_write_in_another_thread(tmp_path: Path) -> None:
    """A worker thread still writing when its app closes the store (a retention pass told to
    stop) finishes and commits; its connection is not closed under it."""
    db = Store.open(str(tmp_path / "corral.db")).db
    in_write, may_commit = threading.Event(), threading.Event()
    order: list[str] = []
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            with db.transaction() as tx:
                tx.execute("CREATE TABLE scratch (x INTEGER)")
                in_write.set()
                may_commit.wait(30)
                tx.execute("INSERT INTO scratch VALUES (1)")
            order.append("committed")
        except BaseException as exc:
            failures.append(exc)

    def closer() -> None:
        db.close()
        order.append("closed")

    threads = [threading.Thread(target=writer), threading.Thread(target=closer)]
    threads[0].start()
    assert in_write.wait(30)
    threads[1].start()
    threads[1].join(0.2)  # room for a close that does not wait to close under the writer
    may_commit.set()
    for t in threads:
        t.join(30)
    assert failures == []
    assert order == ["committed", "closed"]


def waits_for_a_lock(store: Store, statement: str) -> bool:
    """Is a backend running ``statement`` (a part of its text) waiting for a lock?"""
    with store.db.transaction(write=False) as tx:
        row = tx.one(
            "SELECT 1 AS x FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE ? AND pid <> pg_backend_pid()",
            (f"%{statement}%",),
        )
    return row is not None


@postgres_only
def test_postgres_a_fill_that_waited_for_its_runner_counts_the_claim_it_waited_for(
    store: Store, store_url: str
) -> None:
    """A fill (the claim into a socket runner's free slots) counts the runs its runner holds
    in the statement that locks the runner's row. A claim for the same runner that commits
    while the fill waits for that lock took slots after the fill's snapshot: the fill must
    count them all the same, and not give the runner more runs than it has slots."""
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=(), slots=2, version="0", transport="websocket", now=NOW
    )
    store.runs.create_many([command() for _ in range(4)], NOW)
    claimed, may_commit = threading.Event(), threading.Event()
    with stores(store_url, 2) as (holder, filler):

        def hold_a_claim() -> list[Run]:
            with holder.db.transaction():
                runs = holder.runs.claim(runner.id, 2, NOW + 1)
                claimed.set()
                assert may_commit.wait(30)
            return runs

        def fill() -> int:
            commands, free = filler.commands.claim_into_commands(
                runner.id, NOW + 2, lambda run: {"type": "start_run", "run_id": run.id}
            )
            assert commands == []
            return free

        held: list[list[Run]] = []
        holding = threading.Thread(target=lambda: held.append(hold_a_claim()))
        holding.start()
        assert claimed.wait(30)
        free: list[int] = []
        filling = threading.Thread(target=lambda: free.append(fill()))
        filling.start()
        while not waits_for_a_lock(store, "last_heartbeat_at"):
            assert filling.is_alive()
        may_commit.set()
        for thread in (holding, filling):
            thread.join(30)
    assert len(held[0]) == 2
    assert free == [0]
    assert len(store.runs.list(statuses=[RunStatus.CLAIMED], limit=10)) == 2


@postgres_only
def test_postgres_a_fill_that_waited_numbers_its_starts_after_the_commands_it_waited_for(
    store: Store, store_url: str
) -> None:
    """The claim's statement stores the start commands itself (``START_RUN``), numbered on
    from the runner's row. A claim and a command for the same runner that commit while the
    fill waits for that row moved it: the fill claims into the one slot still free, and
    numbers its start after that command (the row as locked, not as its snapshot saw it)."""
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=(), slots=2, version="0", transport="websocket", now=NOW
    )
    store.runs.create_many([command() for _ in range(3)], NOW)
    claimed, may_commit = threading.Event(), threading.Event()
    with stores(store_url, 2) as (holder, filler):

        def hold_a_claim() -> None:
            with holder.db.transaction():
                holder.runs.claim(runner.id, 1, NOW + 1)
                holder.commands.push(runner.id, [{"type": "x"}], NOW + 1)
                claimed.set()
                assert may_commit.wait(30)

        filled: list[tuple[list[Command], int]] = []
        holding = threading.Thread(target=hold_a_claim)
        holding.start()
        assert claimed.wait(30)
        filling = threading.Thread(
            target=lambda: filled.append(
                filler.commands.claim_into_commands(runner.id, NOW + 2, _start_body, (), START_RUN)
            )
        )
        filling.start()
        while not waits_for_a_lock(store, "last_heartbeat_at"):
            assert filling.is_alive()
        may_commit.set()
        for thread in (holding, filling):
            thread.join(30)
    ((started,), free) = filled[0]
    assert (started.idx, free) == (2, 0)
    assert [c.idx for c in store.commands.unacknowledged(runner.id, 0)] == [1, 2]
    assert len(store.runs.list(statuses=[RunStatus.CLAIMED], limit=10)) == 2


@postgres_only
def test_postgres_starts_recording_the_events_applied_lock_the_runner_before_any_run(
    store: Store, store_url: str
) -> None:
    """A batch's start reports on PostgreSQL record the runner's events applied in the same
    statement: the runner's row is still locked before any run's, the order a cancel and
    the reconciler take them (the other way round they could deadlock). So a start held up
    by a run another transaction has locked already holds its runner's row."""
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=(), slots=2, version="0", transport="websocket", now=NOW
    )
    store.runs.create_many([command(), command()], NOW)
    a, b = store.runs.claim(runner.id, 2, NOW + 1)
    locked, may_commit = threading.Event(), threading.Event()
    with stores(store_url, 2) as (locker, starter):

        def lock_a_run() -> None:
            with locker.db.transaction() as tx:
                tx.execute("SELECT id FROM runs WHERE id = ? FOR NO KEY UPDATE", (b.id,))
                locked.set()
                assert may_commit.wait(30)

        started: list[set[tuple[str, int]]] = []
        locking = threading.Thread(target=lock_a_run)
        locking.start()
        assert locked.wait(30)
        starting = threading.Thread(
            target=lambda: started.append(
                starter.runs.mark_started_many(
                    runner.id, [(a.id, 1), (b.id, 1)], NOW + 2, applied=5
                )
            )
        )
        starting.start()
        while not waits_for_a_lock(store, "applied"):
            assert starting.is_alive()
        with store.db.transaction() as tx:
            runner_locked = tx.one(
                "SELECT id FROM runners WHERE id = ? FOR NO KEY UPDATE SKIP LOCKED", (runner.id,)
            )
        may_commit.set()
        for thread in (locking, starting):
            thread.join(30)
    assert runner_locked is None
    assert started == [{(a.id, 1), (b.id, 1)}]
    assert store.commands.state(runner.id).last_event_idx == 5


@postgres_only
def test_postgres_heartbeats_lock_runners_in_the_order_of_their_ids(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pings' heartbeats (``touch``) lock the runners' rows in the order of their ids,
    as a store writer's group does, whatever order the table holds them in: a group that
    holds the first and waits for the second never waits on them (a deadlock, found only
    after PostgreSQL's deadlock_timeout). So while they wait for the first, the second is
    not locked yet."""
    ids = iter([RunnerId("rnr_bbbbbbbbbbbb"), RunnerId("rnr_aaaaaaaaaaaa")])
    monkeypatch.setattr("corral.store.runners.new_runner_id", lambda: next(ids))
    later, first = register(store, "b"), register(store, "a")  # in the table: b, then a
    assert first < later
    locked, may_commit = threading.Event(), threading.Event()
    with stores(store_url, 2) as (locker, toucher):

        def lock_the_first() -> None:
            with locker.db.transaction() as tx:
                tx.execute("SELECT id FROM runners WHERE id = ? FOR NO KEY UPDATE", (first,))
                locked.set()
                assert may_commit.wait(30)

        locking = threading.Thread(target=lock_the_first)
        locking.start()
        assert locked.wait(30)
        touching = threading.Thread(target=lambda: toucher.runners.touch([later, first], NOW + 5))
        touching.start()
        while not waits_for_a_lock(store, "last_heartbeat_at"):
            assert touching.is_alive()
        with store.db.transaction() as tx:
            free = tx.one(
                "SELECT id FROM runners WHERE id = ? FOR NO KEY UPDATE SKIP LOCKED", (later,)
            )
        may_commit.set()
        for thread in (locking, touching):
            thread.join(30)
    assert free is not None
    assert store.runners.get(first).last_heartbeat_at == store.runners.get(later).last_heartbeat_at
    assert store.runners.get(first).last_heartbeat_at == NOW + 5
