"""The dashboard's page and assets (served without a token, locked to their own origin),
its chart series, and the actions it offers on runs: retry, and cancel of a finished run
(clear errors, nothing stored changes). On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from api_fixtures import Api, error_code, running_api

from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio
NO_TOKEN = {"Authorization": ""}


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Api]:
    async with running_api(CoordinatorSettings(db_url=db_url)) as found:
        yield found


async def finished_run(api: Api, *argv: str, exit_code: int = 0) -> str:
    run_id = await api.create_command(*argv)
    runner_id = await api.register()
    await api.claim_one(runner_id)
    await api.started(run_id, runner_id)
    if exit_code:
        response = await api.fail(run_id, runner_id, exit_code=exit_code, error="exit")
    else:
        response = await api.complete(run_id, runner_id, exit_code=0)
    assert response.status_code == 200, response.text
    return run_id


async def test_the_page_and_its_modules_need_no_token_and_load_only_their_own_scripts(
    api: Api,
) -> None:
    page = await api.client.get("/", headers=NO_TOKEN)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/ui/app.js">' in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    for asset, kind in (("/ui/app.js", "javascript"), ("/ui/style.css", "text/css")):
        response = await api.client.get(asset, headers=NO_TOKEN)
        assert response.status_code == 200, asset
        assert kind in response.headers["content-type"]
        assert response.headers["x-content-type-options"] == "nosniff"
    missing = await api.client.get("/ui/nothing.js", headers=NO_TOKEN)
    assert missing.status_code == 404
    # Only the page and its assets: the data behind them still needs the token.
    assert (await api.client.get("/runs", headers=NO_TOKEN)).status_code == 401
    assert (await api.client.get("/uix", headers=NO_TOKEN)).status_code == 401


async def test_the_page_is_refused_under_a_host_name_the_coordinator_does_not_have(
    api: Api,
) -> None:
    rebound = await api.client.get("/", headers={**NO_TOKEN, "Host": "evil.example:8765"})
    assert rebound.status_code == 403
    assert error_code(rebound) == "host_not_allowed"


async def test_chart_series_count_finished_runs_by_outcome(api: Api) -> None:
    await finished_run(api, "true")
    await finished_run(api, "false", exit_code=1)
    await api.create_command("sleep", "1")  # pending: in no chart
    response = await api.client.get("/stats/charts", params={"minutes": 5, "days": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["runs_read"] == 3 and body["truncated"] is False
    assert len(body["runs_per_minute"]) == 5 and len(body["cost_per_day"]) == 2
    finished = {o: sum(m[o] for m in body["runs_per_minute"]) for o in body["outcomes"]}
    assert finished == {"completed": 1, "failed": 1, "cancelled": 0, "timed_out": 0}
    assert sum(b["count"] for b in body["durations"]) == 2
    assert body["cost_per_agent"] == [{"agent": "command", "cost_usd": 0.0, "runs": 2}]
    refused = await api.client.get("/stats/charts", params={"minutes": 0})
    assert refused.status_code == 422
    assert (await api.client.get("/stats/charts", headers=NO_TOKEN)).status_code == 401


async def test_retry_makes_a_new_run_with_the_same_spec(api: Api) -> None:
    run_id = await finished_run(api, "sh", "-c", "exit 3", exit_code=3)
    response = await api.client.post(f"/runs/{run_id}/retry")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["retry_of"] == run_id and body["status"] == "pending"
    assert body["run_id"] != run_id
    new, old = await api.run(body["run_id"]), await api.run(run_id)
    assert new["command"] == old["command"] == ["sh", "-c", "exit 3"]
    assert (new["max_attempts"], new["labels"], new["attempts"]) == (old["max_attempts"], [], 0)


async def test_a_run_not_finished_is_not_retried_and_a_finished_one_not_cancelled(
    api: Api,
) -> None:
    done = await finished_run(api, "true")
    pending = await api.create_command("sleep", "1")
    before = (await api.client.get("/runs", params={"limit": 500})).json()["runs"]

    refused = await api.client.post(f"/runs/{pending}/retry")
    assert refused.status_code == 409
    assert error_code(refused) == "run_not_finished"
    cancelled = await api.client.post(f"/runs/{done}/cancel")
    assert cancelled.status_code == 409
    assert error_code(cancelled) == "illegal_transition"
    unknown = await api.client.post("/runs/run_000000000000/retry")
    assert unknown.status_code == 404
    assert error_code(unknown) == "run_not_found"

    after = (await api.client.get("/runs", params={"limit": 500})).json()["runs"]
    assert after == before  # nothing created, nothing changed
