"""``GET /metrics`` after real activity, on SQLite and PostgreSQL: the figures move with
what happened (runs created, claimed by a long-poll runner, finished; store calls), a
reader token may scrape, no token may not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from api_fixtures import Api, running_api
from prometheus_client.parser import text_string_to_metric_families

from corral.coordinator.settings import CoordinatorSettings
from corral.tokens import Role

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Api]:
    async with running_api(CoordinatorSettings(db_url=db_url, poll_timeout_s=0.5)) as found:
        yield found


async def scrape(api: Api, headers: dict[str, str] | None = None) -> dict[tuple[str, str], float]:
    """Every sample as ``(name, 'label=value,…') → value``."""
    response = await api.client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[(sample.name, labels)] = sample.value
    return samples


async def test_the_figures_move_with_runs_claims_and_store_calls(api: Api) -> None:
    before = await scrape(api)
    assert before[("corral_claims_total", "transport=poll")] == 0
    assert before[("corral_dispatch_latency_seconds_count", "")] == 0
    assert before[("corral_runs", "state=pending")] == 0

    runner_id = await api.register()
    run_ids = [await api.create_command("echo", str(i)) for i in range(3)]
    queued = await scrape(api)
    assert queued[("corral_runs", "state=pending")] == 3
    assert queued[("corral_runners", "state=active")] == 1

    for _ in run_ids:
        run = await api.claim_one(runner_id)
        await api.started(run["run_id"], runner_id)
    running = await scrape(api)
    assert running[("corral_runs", "state=running")] == 3
    assert running[("corral_runs", "state=pending")] == 0
    assert running[("corral_claims_total", "transport=poll")] == 3
    assert running[("corral_dispatch_latency_seconds_count", "")] == 3
    assert running[("corral_dispatch_latency_seconds_sum", "")] > 0

    for run_id in run_ids[:2]:
        assert (await api.complete(run_id, runner_id, exit_code=0)).status_code == 200
    assert (await api.fail(run_ids[2], runner_id, exit_code=3)).status_code == 200
    after = await scrape(api)
    assert after[("corral_runs_finished", "outcome=completed")] == 2
    assert after[("corral_runs_finished", "outcome=failed")] == 1
    assert after[("corral_runs", "state=running")] == 0
    # Every store call is timed by operation: three claims, six reports (started, ended).
    assert after[("corral_store_seconds_count", "operation=runs.claim")] >= 3
    assert after[("corral_store_seconds_count", "operation=apply_reports")] == 6
    assert after[("corral_event_subscribers", "")] == 0


async def test_a_waiting_long_poll_is_an_open_runner_link(api: Api) -> None:
    runner_id = await api.register()
    params = {"runner_id": runner_id, "max_runs": 1, "timeout": 30}
    waiting = [asyncio.ensure_future(api.client.get("/runner/runs", params=params)) for _ in "ab"]

    async def links() -> float:
        return (await scrape(api))[("corral_runner_links", "transport=poll")]

    deadline = asyncio.get_running_loop().time() + 10
    while await links() != 2:
        assert asyncio.get_running_loop().time() < deadline, "the waiting polls never counted"
        await asyncio.sleep(0.01)
    run_ids = {await api.create_command(), await api.create_command()}
    answered = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert all(r.status_code == 200 for r in answered), [r.text for r in answered]
    assert {r.json()["runs"][0]["run_id"] for r in answered} == run_ids
    samples = await scrape(api)
    assert samples[("corral_runner_links", "transport=poll")] == 0
    assert samples[("corral_claims_total", "transport=poll")] == 2


async def test_a_reader_may_scrape_and_a_caller_without_a_token_may_not(api: Api) -> None:
    response = await api.client.post("/tokens", json={"role": Role.READER})
    assert response.status_code == 201, response.text
    reader = {"Authorization": f"Bearer {response.json()['token']}"}
    assert ("corral_runs", "state=pending") in await scrape(api, reader)
    refused = await api.client.get("/metrics", headers={"Authorization": ""})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
