"""Agent tokens, on SQLite and PostgreSQL: a runner mints one for the attempt of a run it
holds; the agent that gets it starts, resumes and cancels only its own session's children
(``corral.coordinator.scope``), may write nothing else, and is refused once the attempt no
longer holds the run."""

from __future__ import annotations

from typing import Any

import pytest
from api_fixtures import Api, error_code, running_api

from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    # No cache of tokens found: the refusal after the run ended is seen at once.
    return CoordinatorSettings(db_url=db_url, poll_timeout_s=1.0, token_cache_s=0)


def as_(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def holding(api: Api, runner: str, **body: Any) -> str:
    """A start_session run that ``runner`` claimed and started."""
    run_id = await api.create(type="start_session", prompt="work", **body)
    assert (await api.claim_one(runner))["run_id"] == run_id
    await api.started(run_id, runner)
    return run_id


async def announce(api: Api, runner: str, run_id: str, session_id: str) -> None:
    body = {"runner_id": runner, "attempt": 1, "session_id": session_id}
    answer = await api.client.post(f"/runner/runs/{run_id}/session", json=body)
    assert answer.status_code == 200, answer.text


async def ended(api: Api, runner: str, session_id: str, **body: Any) -> str:
    run_id = await holding(api, runner, **body)
    done = await api.complete(run_id, runner, 1, exit_code=0, session_id=session_id)
    assert done.status_code == 200, done.text
    return run_id


async def mint(api: Api, run_id: str, runner: str, attempt: int = 1) -> Any:
    return await api.client.post(
        f"/runner/runs/{run_id}/agent-token", json={"runner_id": runner, "attempt": attempt}
    )


async def test_an_agent_token_acts_only_for_its_own_session(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        runner = await api.register("runner-a")
        await ended(api, runner, "other", session_name="other")
        lead = await holding(api, runner, session_name="lead")
        assert error_code(await mint(api, lead, runner, attempt=2)) == "lease_lost"
        minted = await mint(api, lead, runner)
        assert minted.status_code == 200, minted.text
        agent = as_(minted.json()["token"])

        async def refused(method: str, path: str, **kwargs: Any) -> tuple[int, str]:
            before = api.snapshot()
            answer = await api.client.request(method, path, headers=agent, **kwargs)
            assert api.snapshot() == before
            return answer.status_code, error_code(answer)

        child = {"type": "start_session", "prompt": "sub"}
        assert await refused("POST", "/runs", json=child) == (409, "session_not_ready")
        await announce(api, runner, lead, "lead")

        created = await api.client.post("/runs", json=child, headers=agent)
        assert created.status_code == 201, created.text
        kid = created.json()["run_id"]
        assert (await api.run(kid))["parent_session_id"] == "lead"  # not asked: given
        assert await refused("POST", "/runs", json={**child, "parent_session": "other"}) == (
            403,
            "not_your_session",
        )
        resume_other = {"type": "resume_session", "session_id": "other", "prompt": "hi"}
        assert await refused("POST", "/runs", json=resume_other) == (403, "not_your_session")
        other_run = (await api.client.get("/runs", params={"session": "other"})).json()["runs"]
        assert await refused("POST", f"/runs/{other_run[0]['run_id']}/cancel") == (
            403,
            "not_your_session",
        )
        assert await refused("POST", "/projects", json={"repo_path": "/r"}) == (403, "forbidden")
        assert (await api.client.get("/runs", headers=agent)).status_code == 200

        # Its child ended: the agent may resume it, and cancel that resume.
        assert (await api.claim_one(runner))["run_id"] == kid
        await api.started(kid, runner)
        done = await api.complete(kid, runner, 1, exit_code=0, session_id="kid")
        assert done.status_code == 200, done.text
        resume_kid = {"type": "resume_session", "session_id": "kid", "prompt": "more"}
        resumed = await api.client.post("/runs", json=resume_kid, headers=agent)
        assert resumed.status_code == 201, resumed.text
        cancel = f"/runs/{resumed.json()['run_id']}/cancel"
        assert (await api.client.post(cancel, headers=agent)).status_code == 200

        # The agent's run ended: its token is refused.
        done = await api.complete(lead, runner, 1, exit_code=0, session_id="lead")
        assert done.status_code == 200, done.text
        gone = await api.client.get("/runs", headers=agent)
        assert (gone.status_code, error_code(gone)) == (401, "invalid_token")
        assert error_code(await mint(api, lead, runner)) == "lease_lost"


async def test_an_agent_token_is_minted_not_made(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        before = (await api.client.get("/tokens")).json()
        made = await api.client.post("/tokens", json={"role": "agent"})
        assert (made.status_code, error_code(made)) == (422, "invalid_request")
        assert (await api.client.get("/tokens")).json() == before
