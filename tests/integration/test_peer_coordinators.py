"""Two coordinators on one PostgreSQL database wake each other (LISTEN/NOTIFY).

Both apps run in this process, each with its own store (its own connections, its own
node name) on one schema, and no reconciler: a waiter on one hears of a change made
through the other only by the notification the store's triggers send.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from api_fixtures import PG_URL, Api, backend_url, running_api, wait_until

from corral.clock import FakeClock
from corral.coordinator.listener import Listener
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic
from corral.coordinator.service import LEASE_S
from corral.coordinator.settings import CoordinatorSettings
from corral.store import leases
from corral.store.leases import RECONCILER
from corral.store.retention import Collected, Retention

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@contextlib.asynccontextmanager
async def two_coordinators(tmp_path: Path) -> AsyncIterator[tuple[Api, Api]]:
    with backend_url("postgres", tmp_path) as url:
        settings = CoordinatorSettings(db_url=url)
        async with running_api(settings) as a, running_api(settings) as b:
            for api in (a, b):
                await asyncio.wait_for(listener(api).listening.wait(), 10)
            yield a, b


def listener(api: Api) -> Listener:
    found: Listener = api.app.state.listener
    return found


async def test_a_run_created_through_one_reaches_a_poll_waiting_on_the_other(
    tmp_path: Path,
) -> None:
    async with two_coordinators(tmp_path) as (a, b):
        runner = await b.register("runner-b")
        poll = asyncio.create_task(b.poll(runner, timeout=30.0))
        await wait_until(
            lambda: RUNS_AVAILABLE in b.coordinator.notifier._events, what="the poll to wait"
        )
        run_id = await a.create_command("true")
        response = await asyncio.wait_for(poll, 30)
        assert response.status_code == 200, response.text
        assert [run["run_id"] for run in response.json()["runs"]] == [run_id]


async def test_a_cancel_through_one_reaches_the_runner_waiting_on_the_other(
    tmp_path: Path,
) -> None:
    async with two_coordinators(tmp_path) as (a, b):
        runner = await a.register("runner-a")
        run_id = await a.create_command("sleep", "60")
        assert (await a.claim_one(runner))["run_id"] == run_id
        control = asyncio.create_task(
            a.client.get("/runner/control", params={"runner_id": runner, "timeout": 30})
        )
        await wait_until(
            lambda: runner_topic(runner) in a.coordinator.notifier._events,
            what="the runner to wait for orders",
        )
        cancelled = await b.client.post(f"/runs/{run_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        response = await asyncio.wait_for(control, 30)
        assert response.status_code == 200, response.text
        assert response.json() == {
            "commands": [{"idx": 1, "body": {"type": "cancel_run", "run_id": run_id}}]
        }


async def test_a_coordinator_passes_over_its_own_notifications(tmp_path: Path) -> None:
    """Its own waiters were woken in process: the echo from the database is dropped."""
    async with two_coordinators(tmp_path) as (a, _):
        woken: list[str] = []
        notify = a.coordinator.notifier.notify
        a.coordinator.notifier.notify = lambda *topics: (woken.extend(topics), notify(*topics))  # type: ignore[method-assign]
        runner = await a.register("runner-a")
        await a.create_command("true")
        # A change through a plain connection (another process, no node name) is heard.
        with psycopg.connect(listener(a).url, autocommit=True) as conn:
            conn.execute("UPDATE runners SET state = 'draining' WHERE id = %s", (runner,))
        await wait_until(lambda: runner_topic(runner) in woken, what="the outside change")
        assert woken.count(RUNS_AVAILABLE) == 2  # register, create: each once, in process


async def test_a_listener_that_lost_its_connection_reconnects_and_wakes_every_waiter(
    tmp_path: Path,
) -> None:
    """A notification sent while it was away is lost: every waiter looks again instead."""
    async with two_coordinators(tmp_path) as (a, b):
        runner = await b.register("runner-b")
        poll = asyncio.create_task(b.poll(runner, timeout=30.0))
        # The poll has looked (the claim board's read of its round is back: B has no
        # socket waiting, so it is the poll's) and found nothing: it waits.
        board = b.coordinator.claims
        await wait_until(
            lambda: (
                board._round is not None
                and board._round.read.done()
                and board._round.event is b.coordinator.notifier._events.get(RUNS_AVAILABLE)
            ),
            what="the poll to wait",
        )
        b_listener = listener(b)
        connects, own = b_listener.connects, b_listener.node
        b_listener.node = listener(a).node  # B takes A's notifications for its own echo
        heard: list[str] = []
        notify = b.coordinator.notifier.notify
        b.coordinator.notifier.notify = lambda *topics: (heard.extend(topics), notify(*topics))  # type: ignore[method-assign]
        run_id = await a.create_command("true")
        # Notifications come in commit order: once this one is heard, the run's was dropped.
        with psycopg.connect(b_listener.url, autocommit=True) as conn:
            conn.execute("SELECT corral_wake('probe')")
        await wait_until(lambda: "probe" in heard, what="the probe")
        assert not poll.done()
        b_listener.node = own
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (b_listener.application_name,),
            )
        response = await asyncio.wait_for(poll, 30)
        assert b_listener.connects > connects
        assert response.status_code == 200, response.text
        assert [run["run_id"] for run in response.json()["runs"]] == [run_id]


async def test_two_coordinators_racing_reconcile_never_both_act(tmp_path: Path) -> None:
    """One holds the reconciler's lease and acts; the other acts only once it expired."""
    clock = FakeClock()
    with backend_url("postgres", tmp_path) as url:
        settings = CoordinatorSettings(db_url=url, lost_after_s=30.0)
        async with running_api(settings, clock=clock) as a, running_api(settings, clock=clock) as b:
            runners = [await a.register(f"runner-{i}") for i in range(3)]
            for runner in runners:
                await a.create_command("sleep", "60")
                await a.claim_one(runner)
            clock.advance(60.0)  # every runner silent: lost, and its run taken back
            passes = await asyncio.gather(
                *(api.coordinator.reconcile_once() for _ in range(5) for api in (a, b))
            )
            lost = sorted(r for done in passes for r in done.lost_runners)
            requeued = [r for done in passes for r in done.requeued]
            assert lost == sorted(runners)  # each once, by one coordinator
            assert len(requeued) == len(set(requeued)) == 3
            acted = {i % 2 for i, done in enumerate(passes) if done.changed}
            assert len(acted) == 1

            # The holder dies (it renews no more): the other takes over once its lease ends.
            other = b if acted == {0} else a
            db, node = other.coordinator.store.db, other.coordinator.node
            clock.advance(LEASE_S / 2)
            assert not leases.hold(db, RECONCILER, node, clock.now(), LEASE_S)
            late = await other.register("runner-late")
            clock.advance(60.0)
            assert (await other.coordinator.reconcile_once()).lost_runners == [late]


async def test_after_a_restart_a_runner_the_other_coordinator_could_hear_is_lost_in_time(
    tmp_path: Path,
) -> None:
    """A is restarted while B stays up: a runner silent since before the restart is lost a
    threshold after it fell silent (B was up to hear it), not a threshold after A's
    restart — even when the restarted A holds the reconciler's lease."""
    clock = FakeClock()
    with backend_url("postgres", tmp_path) as url:
        settings = CoordinatorSettings(db_url=url, lost_after_s=30.0)
        async with running_api(settings, clock=clock) as b:
            async with running_api(settings, clock=clock) as a:
                runner = await a.register("runner")
                run_id = await a.create_command("sleep", "60")
                await a.claim_one(runner)
                await a.coordinator.reconcile_once()
                clock.advance(20.0)  # the runner went silent; A stops and starts again
            async with running_api(settings, clock=clock) as a:
                clock.advance(LEASE_S + 6.0)  # the runner is silent for 31 s, A up for 11 s
                assert not (await a.coordinator.reconcile_once()).changed
                assert a.coordinator.reconciling  # B said nothing since it started
                await b.coordinator.reconcile_once()  # B says it is up (it holds no lease)
                assert not b.coordinator.reconciling
                done = await a.coordinator.reconcile_once()
                assert (done.lost_runners, done.requeued) == ([runner], [run_id])


async def test_retention_is_done_by_the_coordinator_holding_the_reconcilers_lease(
    tmp_path: Path,
) -> None:
    """One pass of retention for the database, not one per coordinator: the lease holder
    collects, the other skips; when the holder stops, the other collects."""
    clock = FakeClock()
    with backend_url("postgres", tmp_path) as url:
        settings = CoordinatorSettings(db_url=url, retention=Retention(runners_s=60.0))
        async with running_api(settings, clock=clock) as a, running_api(settings, clock=clock) as b:
            await a.coordinator.reconcile_once()
            await b.coordinator.reconcile_once()
            assert (a.coordinator.reconciling, b.coordinator.reconciling) == (True, False)
            gone = await a.register("gone")
            await a.coordinator.stop_runner(gone)
            clock.advance(120.0)  # the stopped runner is past its retention
            assert await b.coordinator.collect_once() is None  # not the holder: nothing
            assert (await a.coordinator.collect_once()) == Collected(runners=1)

            await a.coordinator.leave()  # a deploy: it gives the lease up at once
            await b.coordinator.reconcile_once()
            assert b.coordinator.reconciling
            assert await b.coordinator.collect_once() == Collected()
