"""Sub-agent sessions through the API, on SQLite and PostgreSQL: a child names its parent
session; depth and fan-out over the coordinator's limits are refused with their codes and
nothing stored changes; an async_callback child that ends resumes its parent once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from api_fixtures import Api, error_code, running_api

from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(
        db_url=db_url, poll_timeout_s=1.0, max_subagent_depth=1, max_subagent_children=1
    )


async def ended_session(api: Api, runner: str, session_id: str, **body: Any) -> str:
    """A start_session run that ran on ``runner`` and ended with ``session_id``."""
    run_id = await api.create(**{"type": "start_session", "prompt": "work", **body})
    assert (await api.claim_one(runner))["run_id"] == run_id
    await api.started(run_id, runner)
    done = await api.complete(
        run_id, runner, 1, exit_code=0, session_id=session_id, result=f"result of {session_id}"
    )
    assert done.status_code == 200, done.text
    return run_id


async def refused(api: Api, body: dict[str, Any]) -> tuple[int, str]:
    before = api.snapshot()
    response = await api.client.post("/runs", json=body)
    assert api.snapshot() == before
    return response.status_code, error_code(response)


async def test_limits_are_refused_and_a_callback_child_resumes_its_parent_once(
    settings: CoordinatorSettings,
) -> None:
    async with running_api(settings) as api:
        runner = await api.register("runner-a")
        await ended_session(api, runner, "lead", session_name="lead")
        child = {"type": "start_session", "prompt": "sub", "parent_session": "lead"}
        kid = await ended_session(api, runner, "kid", **child, callback="async_callback")
        assert (await api.run(kid))["parent_session_id"] == "lead"

        # kid is at depth 1, the limit: its own child would be deeper.
        assert await refused(api, {**child, "parent_session": "kid"}) == (
            422,
            "depth_exceeded",
        )
        # One unfinished child of lead at most.
        await api.create(**child)
        assert await refused(api, child) == (409, "fan_out_exceeded")

        await api.coordinator.deliver_callbacks(time.time())
        await api.coordinator.deliver_callbacks(time.time())
        listed = (await api.client.get("/runs", params={"session": "lead"})).json()["runs"]
        resumes = [r for r in listed if r["type"] == "resume_session"]
        assert len(resumes) == 1
        assert "result of kid" in resumes[0]["prompt"]
        delivered = await api.run(kid)
        assert (delivered["callback_state"], delivered["callback_run_id"]) == (
            "delivered",
            resumes[0]["run_id"],
        )
