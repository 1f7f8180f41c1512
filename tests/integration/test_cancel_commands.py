"""A cancel is a stored command to the runner (``RunStore.request_cancel``), on SQLite and
PostgreSQL: numbered after the runner's earlier commands, sent once per socket by the push
loop and again after a reconnect until acknowledged, read by the agent-runner's wire
until its run ends; and on PostgreSQL, a cancel racing the reconciler or a final report
deadlocks with neither (the runner's row is locked first, then the run's)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from corral.coordinator.link_core import LinkCore, PushRequest
from corral.coordinator.schemas import FinishedEvent
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import IllegalTransition
from corral.ids import RunId, RunnerId
from corral.protocol.messages import PROTOCOL_VERSION, Indexed, ToServerInit
from corral.runs import NewRun, Run, RunReport, RunStatus, RunType
from corral.store import Store

NOW = 1_700_000_000.0
LATER = NOW + 100  # a runner silent since NOW is lost by then
T = TypeVar("T")

postgres_only = pytest.mark.parametrize(
    "dialect", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def init(runner_id: RunnerId | None = None, last_command_idx: int = 0) -> ToServerInit:
    return ToServerInit("r", "1", PROTOCOL_VERSION, 2, last_command_idx, runner_id, (), {})


def push(core: LinkCore, runner_id: RunnerId, after: int, now: float = NOW) -> list[Indexed]:
    """One round of a socket's push loop: claims into start commands, then what is stored
    after ``after``."""
    return core.push_work(runner_id, now, PushRequest(True, after, frozenset())).commands


def cancel_of(run_id: str) -> dict[str, Any]:
    return {"type": "cancel_run", "run_id": run_id}


def command() -> NewRun:
    return NewRun(type=RunType.COMMAND, command=("true",))


def test_a_cancel_goes_out_on_the_socket_once_and_again_after_a_reconnect(store: Store) -> None:
    core = LinkCore(store, CoordinatorSettings())
    runner_id = core.register(init(), NOW).runner_id
    run = store.runs.create(command(), NOW)
    (start,) = push(core, runner_id, after=0)
    assert (start.idx, start.body["type"]) == (1, "start_run")

    assert store.runs.request_cancel(run.id, NOW + 1).cancel_requested
    assert push(core, runner_id, after=1) == [Indexed(2, cancel_of(run.id))]
    assert push(core, runner_id, after=2) == []  # sent on this socket: not again
    store.runs.request_cancel(run.id, NOW + 2)  # asked again: no second command
    assert push(core, runner_id, after=2) == []

    # A new socket of the same runner (it had the start only): the cancel is sent again.
    again = core.register(init(runner_id, last_command_idx=1), NOW + 3)
    assert again.missed == [Indexed(2, cancel_of(run.id))]
    core.acknowledge(runner_id, 2)
    assert core.register(init(runner_id, last_command_idx=2), NOW + 4).missed == []


def test_a_cancel_of_a_pending_run_stores_no_command(store: Store) -> None:
    core = LinkCore(store, CoordinatorSettings())
    runner_id = core.register(init(), NOW).runner_id
    run = store.runs.create(command(), NOW)
    assert store.runs.request_cancel(run.id, NOW + 1).status is RunStatus.CANCELLED
    assert push(core, runner_id, after=0) == []
    assert store.commands.unacknowledged(runner_id, 0) == []


def test_the_agent_runner_is_told_of_a_cancel_until_its_run_ends(store: Store) -> None:
    """Its wire acknowledges nothing: a cancel command is done once its run has ended."""
    runner, _ = store.runners.register(
        name="ao", hostname="h", labels=(), slots=2, version="0", transport="http", now=NOW
    )
    first, second = (store.runs.create(command(), NOW) for _ in range(2))
    assert {r.id for r in store.runs.claim(runner.id, 2, NOW)} == {first.id, second.id}
    for run in (first, second):
        store.runs.request_cancel(run.id, NOW + 1)
    assert store.commands.cancels_to_stop(runner.id) == [first.id, second.id]
    assert store.commands.cancels_to_stop(runner.id) == [first.id, second.id]  # told again

    report_cancelled(store, store.runs.get(first.id), runner.id)
    assert store.commands.cancels_to_stop(runner.id) == [second.id]
    assert [c.body for c in store.commands.unacknowledged(runner.id, 0)] == [cancel_of(second.id)]
    report_cancelled(store, store.runs.get(second.id), runner.id)
    assert store.commands.cancels_to_stop(runner.id) == []
    assert store.commands.unacknowledged(runner.id, 0) == []


def report_cancelled(store: Store, run: Run, runner_id: str) -> None:
    store.runs.finish(run.id, runner_id, run.attempts, RunReport(RunStatus.CANCELLED), NOW + 2)


# ---- PostgreSQL: a cancel racing the reconciler and a final report ----------------------------


@contextmanager
def stores(url: str, count: int) -> Iterator[list[Store]]:
    """``count`` Stores on ``url``, each with its own connection pool."""
    opened = [Store.open(url) for _ in range(count)]
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


def run_threads(targets: list[Callable[[], T]], timeout: float = 60.0) -> list[T | Exception]:
    """Each target in its own thread, started together; what each returned or raised."""
    results: list[Any] = [None] * len(targets)
    barrier = threading.Barrier(len(targets))

    def wrap(i: int) -> None:
        barrier.wait()
        try:
            results[i] = targets[i]()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker thread hung"
    return results


def cancel_unless_ended(store: Store, run_id: RunId) -> Run | None:
    """Cancel; None if the run had ended first (a cancel of an ended run is refused)."""
    try:
        return store.runs.request_cancel(run_id, LATER)
    except IllegalTransition:
        return None


@postgres_only
def test_postgres_a_cancel_racing_the_reconciler_and_a_final_report_never_deadlocks(
    store: Store, store_url: str
) -> None:
    """A socket runner's failure report, a cancel of that run and the reconciler declaring
    the runner lost, all at once: none fails (a deadlock would surface as ``Unavailable``),
    and the run ends as one order of the three says."""
    with stores(store_url, 3) as (canceller, reporter, reconciler):
        core = LinkCore(reporter, CoordinatorSettings())
        for i in range(30):
            runner_id = core.register(init(), NOW).runner_id
            run = store.runs.create(command(), NOW)
            assert [c.body["type"] for c in push(core, runner_id, after=0)] == ["start_run"]
            failed = FinishedEvent(type="finished", run_id=run.id, attempt=1, status="failed")
            cancelled, applied, reconciled = run_threads(
                [
                    lambda run=run: cancel_unless_ended(canceller, run.id),
                    lambda rid=runner_id, e=failed: core.apply(rid, 1, [e], LATER),
                    lambda: reconciler.reconcile(LATER, lost_after_s=30, timeout_grace_s=5),
                ]
            )
            for result in (cancelled, applied, reconciled):
                assert not isinstance(result, Exception), f"iteration {i}: {result!r}"
            after = store.runs.get(run.id)
            if cancelled is None:  # the report (failed) came first; nothing to cancel
                assert after.status is RunStatus.FAILED, f"iteration {i}: {after}"
            else:
                # Cancelled: by the report of a failure after it, by the reconciler taking
                # back a run a cancel was asked of, or at once (the run was pending again).
                assert after.status is RunStatus.CANCELLED, f"iteration {i}: {after}"
            assert store.runners.get(runner_id).state == "lost"


@postgres_only
def test_postgres_cancels_racing_reports_of_the_same_socket_runner(
    store: Store, store_url: str
) -> None:
    """Two runs of one socket runner: one reports its failure while the other is cancelled,
    and the other way round, at once — the runner's row is locked first by both."""
    with stores(store_url, 2) as (canceller, reporter):
        core = LinkCore(reporter, CoordinatorSettings())
        runner_id = core.register(init(), NOW).runner_id
        sent = 0
        for i in range(30):
            a, b = store.runs.create(command(), NOW), store.runs.create(command(), NOW)
            starts = push(core, runner_id, after=sent)
            assert {c.body["run"]["run_id"] for c in starts} == {a.id, b.id}
            sent = max(c.idx for c in starts)
            events = [
                FinishedEvent(type="finished", run_id=r.id, attempt=1, status="failed")
                for r in (a, b)
            ]
            cancelled, applied = run_threads(
                [
                    lambda a=a, b=b: [cancel_unless_ended(canceller, r.id) for r in (b, a)],
                    lambda events=events, i=i: core.apply(runner_id, i + 1, events, LATER),
                ]
            )
            assert not isinstance(cancelled, Exception), f"iteration {i}: {cancelled!r}"
            assert not isinstance(applied, Exception), f"iteration {i}: {applied!r}"
            for run in (a, b):
                assert store.runs.get(run.id).status.is_terminal
            sent = max([sent, *(c.idx for c in store.commands.unacknowledged(runner_id, sent))])
