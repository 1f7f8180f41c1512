"""The seed's runner wire (seed 001) spoken exactly as the seed document shows it:
``GET /runner/runs?runner_id=…`` answers ``{"run": {...}}`` or 204; reports are
``{runner_id}`` / ``{runner_id, error}`` with no attempt; heartbeats are ``{runner_id}``.
A runner speaking only this gets corral's guarantees. Time is a FakeClock.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_fixtures import Api, error_code, running_api

from corral.clock import FakeClock
from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio

LOST_AFTER = 120.0


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url, lost_after_s=LOST_AFTER)


async def seed_poll(api: Api, runner_id: str) -> dict[str, Any] | None:
    """The seed's poll (no ``max_runs``): the run, or None on 204."""
    response = await api.client.get("/runner/runs", params={"runner_id": runner_id, "timeout": 0})
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"run"}, body
    run: dict[str, Any] = body["run"]
    return run


async def seed_report(api: Api, run_id: str, what: str, **body: Any) -> httpx.Response:
    return await api.client.post(f"/runner/runs/{run_id}/{what}", json=body)


async def test_a_seed_runner_runs_command_and_agent_runs(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        runner_id = await api.register("seed-runner")
        assert await seed_poll(api, runner_id) is None

        agent_run = await api.create(
            type="start_session",
            session_name="research-task",
            agent_name="claude",
            prompt="Research quantum computing advances",
            project_dir="/path/to/project",
        )
        run = await seed_poll(api, runner_id)
        assert run is not None
        assert run["run_id"] == agent_run
        assert (run["type"], run["session_name"], run["agent_name"]) == (
            "start_session",
            "research-task",
            "claude",
        )
        assert (run["prompt"], run["project_dir"]) == (
            "Research quantum computing advances",
            "/path/to/project",
        )
        assert "session_id" in run

        started = await seed_report(api, agent_run, "started", runner_id=runner_id)
        assert started.status_code == 200, started.text
        assert started.json()["ok"] is True
        assert (await api.run(agent_run))["status"] == "running"
        done = await seed_report(api, agent_run, "completed", runner_id=runner_id)
        assert done.status_code == 200, done.text
        assert done.json()["ok"] is True
        assert (await api.run(agent_run))["status"] == "completed"

        command_run = await api.create_command("false")
        run = await seed_poll(api, runner_id)
        assert run is not None and run["run_id"] == command_run
        assert (await seed_report(api, command_run, "started", runner_id=runner_id)).is_success
        error = "Process exited with code 1"
        failed = await seed_report(api, command_run, "failed", runner_id=runner_id, error=error)
        assert failed.status_code == 200, failed.text
        run = await api.run(command_run)
        assert (run["status"], run["error"], run["attempts"]) == ("failed", error, 1)


async def test_repeated_seed_reports_are_idempotent(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        runner_id = await api.register("seed-runner")
        run_id = await api.create_command("true")
        await seed_poll(api, runner_id)
        for _ in range(2):  # the first answer was lost: the runner says it again
            response = await seed_report(api, run_id, "started", runner_id=runner_id)
            assert response.status_code == 200, response.text
        before = api.snapshot()
        for _ in range(2):
            response = await seed_report(api, run_id, "completed", runner_id=runner_id)
            assert response.status_code == 200, response.text
        after = api.snapshot()
        assert after["runs"][0]["status"] == "completed"
        assert after["runs"][0]["finished_at"] is not None
        assert before["runs"][0]["status"] == "running"
        again = await seed_report(api, run_id, "completed", runner_id=runner_id)
        assert again.status_code == 200
        assert api.snapshot() == after  # the repeat changed nothing


async def test_a_runner_that_does_not_hold_the_run_is_refused(
    settings: CoordinatorSettings,
) -> None:
    async with running_api(settings) as api:
        holder = await api.register("holder")
        other = await api.register("other")
        run_id = await api.create_command("true")
        await seed_poll(api, holder)
        before = api.snapshot()
        for what, body in (("started", {}), ("completed", {}), ("failed", {"error": "no"})):
            response = await seed_report(api, run_id, what, runner_id=other, **body)
            assert response.status_code == 409, response.text
            assert error_code(response) == "lease_lost"
        assert api.snapshot() == before


async def test_a_lost_started_report_does_not_strand_the_run(
    settings: CoordinatorSettings,
) -> None:
    """The seed runner does not retry ``started``: its completion still counts."""
    async with running_api(settings) as api:
        runner_id = await api.register("seed-runner")
        run_id = await api.create_command("true")
        await seed_poll(api, runner_id)
        response = await seed_report(api, run_id, "completed", runner_id=runner_id)
        assert response.status_code == 200, response.text
        run = await api.run(run_id)
        assert (run["status"], run["attempts"]) == ("completed", 1)
        assert run["started_at"] is not None


async def test_a_claim_whose_answer_was_lost_goes_back_on_the_next_poll(
    settings: CoordinatorSettings,
) -> None:
    clock = FakeClock()
    async with running_api(settings, clock=clock) as api:
        runner_id = await api.register("seed-runner")
        started_run = await api.create_command("sleep", "100", priority=1)
        lost_answer = await api.create_command("true")
        assert (await seed_poll(api, runner_id) or {})["run_id"] == started_run
        assert (await seed_report(api, started_run, "started", runner_id=runner_id)).is_success
        # This claim commits, but its answer never reaches the runner.
        await api.poll(runner_id, timeout=0)
        assert (await api.run(lost_answer))["status"] == "claimed"

        clock.advance(LOST_AFTER - 1)  # a runner may still be spawning it
        assert await seed_poll(api, runner_id) is None
        assert (await api.run(lost_answer))["status"] == "claimed"

        clock.advance(2)
        run = await seed_poll(api, runner_id)
        assert run is not None and run["run_id"] == lost_answer
        assert (await api.run(lost_answer))["attempts"] == 2
        assert (await api.run(started_run))["status"] == "running"  # left alone


async def test_a_silent_seed_runner_is_lost_and_its_runs_go_to_another(
    settings: CoordinatorSettings,
) -> None:
    clock = FakeClock()
    async with running_api(settings, clock=clock) as api:
        gone = await api.register("gone")
        run_id = await api.create_command("sleep", "100")
        await seed_poll(api, gone)
        assert (await seed_report(api, run_id, "started", runner_id=gone)).is_success

        clock.advance(LOST_AFTER + 1)
        alive = await api.register("alive")
        done = await api.coordinator.reconcile_once()
        assert done.lost_runners == [gone]
        assert done.requeued == [run_id]
        run = await seed_poll(api, alive)
        assert run is not None and run["run_id"] == run_id
        late = await seed_report(api, run_id, "completed", runner_id=gone)
        assert late.status_code == 409
        assert error_code(late) == "lease_lost"
