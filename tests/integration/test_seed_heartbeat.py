"""The seed's heartbeat, ``POST /runner/heartbeat {"runner_id": …}``, says nothing about the
runs a runner holds. It must keep the runner's leases alive and take nothing back: read as
"holds nothing", it requeued runs that were still executing, and another runner started
them again (issue 10 §1). Time is a FakeClock; reconciliation is called by hand.
"""

from __future__ import annotations

import pytest
from api_fixtures import Api, running_api

from corral.clock import FakeClock
from corral.coordinator.settings import CoordinatorSettings
from corral.store.reconcile import UNREPORTED_CLAIM_GRACE_S

pytestmark = pytest.mark.anyio

LOST_AFTER = 120.0


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url, lost_after_s=LOST_AFTER)


async def seed_heartbeat(api: Api, runner_id: str) -> dict[str, object]:
    """Exactly the seed runner's body: no ``held``."""
    response = await api.client.post("/runner/heartbeat", json={"runner_id": runner_id})
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


async def test_a_heartbeat_without_held_keeps_claimed_and_running_runs(
    settings: CoordinatorSettings,
) -> None:
    clock = FakeClock()
    async with running_api(settings, clock=clock) as api:
        running_run = await api.create_command("sleep", "40", priority=1)
        claimed_run = await api.create_command("sleep", "40")
        runner_a = await api.register("runner-a", slots=2)
        first = await api.claim_one(runner_a)
        assert first["run_id"] == running_run
        await api.started(running_run, runner_a, 1)
        assert (await api.claim_one(runner_a))["run_id"] == claimed_run
        runner_b = await api.register("runner-b")

        # Well past the grace for unreported claims, and past the lost threshold in total:
        # only the seed's heartbeats tell the coordinator runner-a is alive.
        for _ in range(3):
            clock.advance(UNREPORTED_CLAIM_GRACE_S + LOST_AFTER / 3)
            assert await seed_heartbeat(api, runner_a) == {"abandon": []}
            await api.heartbeat(runner_b, [])
            done = await api.coordinator.reconcile_once()
            assert not done.changed, done

        for run_id, status in ((running_run, "running"), (claimed_run, "claimed")):
            run = await api.run(run_id)
            assert (run["status"], run["runner_id"], run["attempts"]) == (status, runner_a, 1)
        # Nothing went back to the queue: the other runner gets nothing to run twice.
        assert await api.claim(runner_b) == []


async def test_an_explicit_list_still_releases_what_the_runner_no_longer_reports(
    settings: CoordinatorSettings,
) -> None:
    clock = FakeClock()
    async with running_api(settings, clock=clock) as api:
        forgotten = await api.create_command("sleep", "40")
        runner_a = await api.register("runner-a", slots=2)
        await api.claim_one(runner_a)

        # Claimed moments ago (its answer may still be on the way): not taken back.
        clock.advance(UNREPORTED_CLAIM_GRACE_S - 1)
        assert (await api.heartbeat(runner_a, [])).json() == {"abandon": []}
        assert (await api.run(forgotten))["status"] == "claimed"

        # Long claimed and still not in the runner's explicit list: given back.
        clock.advance(2)
        await api.heartbeat(runner_a, [])
        run = await api.run(forgotten)
        assert (run["status"], run["runner_id"]) == ("pending", None)
