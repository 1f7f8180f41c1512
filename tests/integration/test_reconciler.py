"""The reconciler: silent runners are declared lost and their runs taken back; runs past
their timeout (plus grace) are ended. Time is a FakeClock and reconciliation is called by
hand (``reconcile=False``), so nothing waits for real time to pass.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import anyio
import pytest
from api_fixtures import Api, error_code, running_api, wait_until

from corral.clock import FakeClock
from corral.coordinator.notifier import RUNS_AVAILABLE
from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio

LOST_AFTER = 30.0
GRACE = 5.0


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def runner_states(api: Api) -> dict[str, str]:
    runners = (await api.client.get("/runners")).json()["runners"]
    return {r["runner_id"]: r["state"] for r in runners}


async def start_on(api: Api, runner_id: str, run_id: str) -> None:
    assignment = await api.claim_one(runner_id)
    assert assignment["run_id"] == run_id
    await api.started(run_id, runner_id, assignment["attempts"])


async def started_on_runner_a(api: Api, **run: Any) -> tuple[str, str]:
    """A command run (``run``: its fields) started by a new runner "runner-a"; both ids."""
    run_id = await api.create_command(**run)
    runner_a = await api.register("runner-a")
    await start_on(api, runner_a, run_id)
    return run_id, runner_a


async def test_a_silent_runner_is_lost_and_its_run_goes_to_another(
    settings: CoordinatorSettings, clock: FakeClock
) -> None:
    async with running_api(settings, clock=clock) as api:
        run_id, runner_a = await started_on_runner_a(api)

        clock.advance(LOST_AFTER / 2)
        runner_b = await api.register("runner-b")
        done = await api.coordinator.reconcile_once()
        assert not done.changed  # runner-a is quiet, but not for long enough yet

        clock.advance(LOST_AFTER / 2 + 1)  # a: silent for lost_after + 1; b: half of it

        # runner-b is already waiting for work when the run comes back.
        result: dict[str, Any] = {}

        async def poll() -> None:
            result["response"] = await api.poll(runner_b, timeout=20)
            result["done_at"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await wait_until(
                lambda: RUNS_AVAILABLE in api.coordinator.notifier._events,
                what="runner-b's long-poll",
            )
            reconciled_at = time.monotonic()
            done = await api.coordinator.reconcile_once()
            await wait_until(lambda: "response" in result, what="runner-b's claim")

        assert done.lost_runners == [runner_a]
        assert done.requeued == [run_id]
        assert done.failed == done.timed_out == []
        assert await runner_states(api) == {runner_a: "lost", runner_b: "active"}

        assert result["done_at"] - reconciled_at < 2.0
        assert result["response"].status_code == 200
        (assignment,) = result["response"].json()["runs"]
        assert assignment["run_id"] == run_id
        assert assignment["attempts"] == 2
        assert assignment["runner_id"] == runner_b
        assert f"runner {runner_a} was lost" in (assignment["error"] or "")

        await api.started(run_id, runner_b, 2)
        assert (await api.complete(run_id, runner_b, 2, exit_code=0)).status_code == 200
        run = await api.run(run_id)
        assert (run["status"], run["attempts"], run["runner_id"]) == ("completed", 2, runner_b)

        # Reconciling again changes nothing more.
        clock.advance(1)
        assert not (await api.coordinator.reconcile_once()).changed


async def test_a_restarted_coordinator_gives_a_silent_runner_a_threshold_from_its_start(
    settings: CoordinatorSettings, clock: FakeClock
) -> None:
    """The only coordinator was down: no one could hear the runner, so after the restart
    it has a whole threshold to check in, even though its last heartbeat is older."""
    async with running_api(settings, clock=clock) as api:
        run_id, runner_a = await started_on_runner_a(api)
        clock.advance(10.0)  # the runner goes silent; 10 s later the coordinator stops
        assert not (await api.coordinator.reconcile_once()).changed
    clock.advance(LOST_AFTER)
    async with running_api(settings, clock=clock) as api:
        assert not (await api.coordinator.reconcile_once()).changed
        clock.advance(LOST_AFTER - 1)
        assert not (await api.coordinator.reconcile_once()).changed
        clock.advance(2.0)
        done = await api.coordinator.reconcile_once()
        assert (done.lost_runners, done.requeued) == ([runner_a], [run_id])


async def test_pings_heard_while_the_database_was_away_are_written_once_it_is_back(
    settings: CoordinatorSettings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WebSocket runner's pings are answered without the database, so it holds its runs
    on through an outage: once the database is back, it is not found silent (its runs
    would start elsewhere while it still runs them)."""
    async with running_api(settings, clock=clock) as api:
        run_id, runner_a = await started_on_runner_a(api)
        coordinator = api.coordinator
        touch = coordinator.store.runners.touch

        def away(*_: object) -> None:
            raise ConnectionError("the database is away")

        monkeypatch.setattr(coordinator.store.runners, "touch", away)
        clock.advance(LOST_AFTER / 2)
        coordinator.connections.note_ping(runner_a)  # answered; its write fails
        with pytest.raises(ConnectionError):
            await coordinator.reconcile_once()
        monkeypatch.setattr(coordinator.store.runners, "touch", touch)
        clock.advance(LOST_AFTER / 2 + 1)  # past a threshold since its registration
        assert not (await coordinator.reconcile_once()).changed
        assert (await runner_states(api))[runner_a] == "active"
        assert (await api.run(run_id))["status"] == "running"


async def test_a_lost_run_without_attempts_left_fails_naming_the_runner(
    settings: CoordinatorSettings, clock: FakeClock
) -> None:
    async with running_api(settings, clock=clock) as api:
        run_id, runner_a = await started_on_runner_a(api, max_attempts=1)

        clock.advance(LOST_AFTER + 1)
        runner_b = await api.register("runner-b")
        done = await api.coordinator.reconcile_once()

        assert done.lost_runners == [runner_a]
        assert (done.waiting, done.failed, done.requeued) == ([run_id], [], [])
        run = await api.run(run_id)
        assert (run["status"], run["finished_at"]) == ("lost", None)  # its grace
        # Which counts from the loss, by runner-a's threshold (the coordinator's here).
        lost_at = datetime.fromisoformat(run["lost_at"]).timestamp()
        assert lost_at == pytest.approx(clock.now(), abs=1e-3)
        lost_until = datetime.fromisoformat(run["lost_until"]).timestamp()
        assert lost_until == pytest.approx(lost_at + LOST_AFTER, abs=1e-3)
        assert await api.claim(runner_b) == []

        clock.advance(LOST_AFTER + 1)  # runner-a's threshold again: the grace is over
        await api.heartbeat(runner_b)
        done = await api.coordinator.reconcile_once()
        assert done.failed == [run_id]
        run = await api.run(run_id)
        assert run["status"] == "failed"
        assert run["lost_until"] is None
        assert run["attempts"] == 1
        assert run["finished_at"] is not None
        assert runner_a in run["error"]
        assert "no attempts left" in run["error"]
        assert await api.claim(runner_b) == []
        # Its runner's report, later still, is refused: the run stays failed.
        assert (await api.complete(run_id, runner_a)).status_code == 409
        assert (await api.run(run_id))["status"] == "failed"


async def test_a_lost_last_attempt_its_runner_reports_done_in_its_grace_completes(
    settings: CoordinatorSettings, clock: FakeClock
) -> None:
    """The runner finished the run's only attempt while it was cut off past its lease: it
    registers again (a long-poll runner keeps its id) and reports it, within the run's
    grace. The run ends completed, as reported, and is not claimed again."""
    async with running_api(settings, clock=clock) as api:
        run_id, runner_a = await started_on_runner_a(api, max_attempts=1)
        clock.advance(LOST_AFTER + 1)
        assert (await api.coordinator.reconcile_once()).waiting == [run_id]

        clock.advance(LOST_AFTER / 2)
        assert await api.register("runner-a", runner_id=runner_a) == runner_a
        response = await api.complete(run_id, runner_a, result="done", exit_code=0)
        assert response.status_code == 200, response.text
        run = await api.run(run_id)
        assert (run["status"], run["result"], run["runner_id"]) == ("completed", "done", runner_a)
        assert run["error"] is None and run["attempts"] == 1

        clock.advance(LOST_AFTER)  # past the grace: nothing is left to fail
        assert not (await api.coordinator.reconcile_once()).failed
        assert (await api.run(run_id))["status"] == "completed"
        assert await api.claim(runner_a) == []


async def test_a_run_past_its_timeout_and_grace_times_out(
    settings: CoordinatorSettings, clock: FakeClock
) -> None:
    async with running_api(settings, clock=clock) as api:
        started_run = await api.create_command("sleep", "100", timeout_s=10, priority=2)
        claimed_run = await api.create_command("sleep", "100", timeout_s=10, priority=1)
        untimed_run = await api.create_command("sleep", "100")
        runner_id = await api.register("runner-a", slots=3)
        await start_on(api, runner_id, started_run)
        assert (await api.claim_one(runner_id))["run_id"] == claimed_run  # never started
        assert (await api.claim_one(runner_id))["run_id"] == untimed_run

        clock.advance(10 + GRACE)  # exactly at the limit: not yet
        held = [{"run_id": r, "attempt": 1} for r in (started_run, claimed_run, untimed_run)]
        assert (await api.heartbeat(runner_id, held)).json() == {"abandon": []}
        assert not (await api.coordinator.reconcile_once()).changed

        clock.advance(1)
        done = await api.coordinator.reconcile_once()
        assert sorted(done.timed_out) == sorted([started_run, claimed_run])
        assert done.lost_runners == []  # the runner itself is fine
        for run_id in (started_run, claimed_run):
            run = await api.run(run_id)
            assert run["status"] == "timed_out"
            assert run["finished_at"] is not None
            assert "timeout" in run["error"]
        assert (await api.run(untimed_run))["status"] == "claimed"

        # The runner's own report comes too late to change the outcome.
        late = await api.complete(started_run, runner_id, 1, exit_code=0)
        assert late.status_code == 409
        assert error_code(late) == "illegal_transition"
        assert (await api.run(started_run))["status"] == "timed_out"


async def test_a_lost_runner_must_register_again_and_abandon_its_run(
    settings: CoordinatorSettings, clock: FakeClock
) -> None:
    async with running_api(settings, clock=clock) as api:
        run_id, runner_a = await started_on_runner_a(api)
        clock.advance(LOST_AFTER + 1)
        runner_b = await api.register("runner-b")
        await api.coordinator.reconcile_once()
        await start_on(api, runner_b, run_id)

        # runner-a comes back from a network cut, still running attempt 1.
        held = [{"run_id": run_id, "attempt": 1}]
        beat = await api.heartbeat(runner_a, held)
        assert beat.status_code == 409
        assert error_code(beat) == "runner_lost"

        poll = await api.poll(runner_a, timeout=0)
        assert poll.status_code == 409
        assert error_code(poll) == "runner_lost"

        late = await api.complete(run_id, runner_a, 1, exit_code=0)
        assert late.status_code == 409
        assert error_code(late) == "lease_lost"

        again = await api.client.post(
            "/runner/register",
            json={"name": "runner-a", "runner_id": runner_a, "held": held},
        )
        assert again.status_code == 200, again.text
        body = again.json()
        assert body["runner_id"] == runner_a
        assert body["state"] == "active"
        assert body["abandon"] == [run_id]
        assert (await api.heartbeat(runner_a)).status_code == 200

        run = await api.run(run_id)
        assert (run["status"], run["runner_id"], run["attempts"]) == ("running", runner_b, 2)
        assert await runner_states(api) == {runner_a: "active", runner_b: "active"}
