"""Sub-agent sessions through the API, on SQLite and PostgreSQL: a child names its parent
session; depth and fan-out over the coordinator's limits are refused with their codes and
nothing stored changes; an async_callback child that ends resumes its parent once."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
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


async def test_a_callback_is_delivered_at_the_childs_end_not_at_the_reconcilers_next_pass(
    db_url: str,
) -> None:
    """The reconciler passes once, at start, and then not for an hour: the parent's resume
    comes from the child's end report itself — and, for a busy parent, from the end of
    the parent's own run."""
    settings = CoordinatorSettings(db_url=db_url, poll_timeout_s=1.0, reconcile_interval_s=3600)
    async with running_api(settings, reconcile=True) as api:
        runner = await api.register("runner-a")
        await ended_session(api, runner, "lead", session_name="lead")

        async def resumes() -> list[dict[str, Any]]:
            listed = await api.client.get("/runs", params={"session": "lead"})
            return [r for r in listed.json()["runs"] if r["type"] == "resume_session"]

        child = {"type": "start_session", "prompt": "sub", "parent_session": "lead"}
        kid = await ended_session(api, runner, "kid", **child, callback="async_callback")
        seen: list[dict[str, Any]] = []

        async def resumed(count: int) -> bool:
            seen[:] = await resumes()
            return len(seen) == count

        await _eventually(lambda: resumed(1), what="the parent's resume after the child's end")
        assert (await api.run(kid))["callback_run_id"] == seen[0]["run_id"]

        # The parent is busy (its resume holds): a second child's callback waits for it.
        busy = await api.claim_one(runner)
        await api.started(busy["run_id"], runner)
        kid_2 = await ended_session(api, runner, "kid-2", **child, callback="async_callback")
        assert (await api.run(kid_2))["callback_state"] == "pending"
        assert len(await resumes()) == 1
        done = await api.complete(busy["run_id"], runner, 1, exit_code=0, session_id="lead")
        assert done.status_code == 200, done.text
        await _eventually(lambda: resumed(2), what="the resume after the parent's run ended")
        assert (await api.run(kid_2))["callback_run_id"] in {r["run_id"] for r in seen}


async def _eventually(check: Callable[[], Awaitable[bool]], *, what: str) -> None:
    deadline = time.monotonic() + 10
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await anyio.sleep(0.01)


async def test_a_command_child_resumes_its_parent_with_its_exit_code_and_output(
    settings: CoordinatorSettings,
) -> None:
    async with running_api(settings) as api:
        runner = await api.register("runner-a")
        await ended_session(api, runner, "lead", session_name="lead")
        child = {"type": "start_session", "prompt": "sub", "parent_session": "lead"}
        await ended_session(api, runner, "kid", **child)
        # kid is at the depth limit (1): it may start no session, but it may run a command.
        body = {"type": "command", "command": ["make", "test"], "parent_session": "kid"}
        assert await refused(api, {**child, "parent_session": "kid"}) == (422, "depth_exceeded")
        command = await api.create(**body, callback="async_callback")
        assert (await api.claim_one(runner))["run_id"] == command
        await api.started(command, runner)
        await api.log(command, runner, 1, *(f"line {n}" for n in range(30)))
        failed = await api.fail(command, runner, 1, exit_code=3, error="exit code 3")
        assert failed.status_code == 200, failed.text

        await api.coordinator.deliver_callbacks(time.time())
        listed = (await api.client.get("/runs", params={"session": "kid"})).json()["runs"]
        (resume,) = [r for r in listed if r["type"] == "resume_session"]
        assert resume["prompt"].splitlines() == [
            "Sub-agent sessions and commands you started have ended:",
            "",
            f"## command `make test` (failed, exit code 3; run {command})",
            *(f"line {n}" for n in range(10, 30)),  # the last 20
        ]
        assert (await api.run(command))["callback_run_id"] == resume["run_id"]
