"""The seed system's own runner (claude-agent-orchestrator's agent-runner) against corral:
every request below is one that runner, its gateway or its executors send, with their
exact bodies, and every answer is read the way that runner reads it."""

from __future__ import annotations

from typing import Any

import pytest
from api_fixtures import Api, error_code, running_api

from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio

PROJECT = "/srv/project"
REGISTRATION = {
    "hostname": "build-7",
    "project_dir": PROJECT,
    "executor_profile": "coding",
    "executor": {"type": "autonomous", "command": "executors/x/ao-x-exec", "config": {}},
    "tags": ["python", "docker"],
}


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url, poll_timeout_s=0.2)


async def ao_register(api: Api, **changes: Any) -> str:
    response = await api.client.post("/runner/register", json={**REGISTRATION, **changes})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {
        "runner_id",
        "poll_endpoint",
        "poll_timeout_seconds",
        "heartbeat_interval_seconds",
    }
    assert body["poll_endpoint"] == "/runner/runs"
    assert isinstance(body["poll_timeout_seconds"], int)
    runner_id: str = body["runner_id"]
    return runner_id


async def ao_poll(api: Api, runner_id: str) -> dict[str, Any] | None:
    response = await api.client.get("/runner/runs", params={"runner_id": runner_id})
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def ok(api: Api, method: str, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await api.client.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["ok"] is True
    return response.json()


async def test_register_poll_bind_result_complete_and_resume(
    settings: CoordinatorSettings,
) -> None:
    async with running_api(settings) as api:
        runner_id = await ao_register(api)
        (listed,) = (await api.client.get("/runners")).json()["runners"]
        assert (listed["runner_id"], listed["transport"], listed["hostname"]) == (
            runner_id,
            "ao",
            "build-7",
        )
        assert {"python", "docker", "ao-profile:coding"} <= set(listed["labels"])
        assert await ao_poll(api, runner_id) is None  # 204 after the poll timeout

        run_id = await api.create(type="start_session", prompt="Summarise the README")
        answer = await ao_poll(api, runner_id)
        assert answer is not None and set(answer) == {"run"}
        run = answer["run"]
        session = run["session_id"]
        assert session.startswith("ses_")
        assert (run["run_id"], run["type"]) == (run_id, "start_session")
        assert run["parameters"] == {"prompt": "Summarise the README"}
        assert run["parent_session_id"] is None
        assert "agent_name" in run and "project_dir" in run

        await ok(api, "POST", f"/runner/runs/{run_id}/started", {"runner_id": runner_id})
        # What the runner's gateway forwards for its executor.
        bound = await ok(
            api,
            "POST",
            f"/sessions/{session}/bind",
            {
                "executor_session_id": "claude-uuid-1",
                "hostname": "build-7",
                "executor_profile": "coding",
                "project_dir": PROJECT,
            },
        )
        assert bound["session"]["session_id"] == session
        event = {"session_id": session, "timestamp": "2026-03-09T10:00:00+00:00"}
        await ok(
            api,
            "POST",
            f"/sessions/{session}/events",
            {**event, "event_type": "message", "role": "user", "content": [{"type": "text"}]},
            status=201,
        )
        await ok(
            api,
            "POST",
            f"/sessions/{session}/events",
            {
                **event,
                "event_type": "result",
                "result_text": "It is a README.",
                "result_data": None,
            },
            status=201,
        )
        await ok(
            api,
            "POST",
            f"/runner/runs/{run_id}/completed",
            {"runner_id": runner_id, "status": "success", "session_status": "finished"},
        )
        finished = await api.run(run_id)
        assert (finished["status"], finished["result"]) == ("completed", "It is a README.")
        assert finished["session_id"] == "claude-uuid-1"
        result = (await api.client.get("/sessions/claude-uuid-1/result")).json()
        assert result["result"] == "It is a README."

        affinity = (await api.client.get(f"/sessions/{session}/affinity")).json()["affinity"]
        assert affinity == {
            "hostname": "build-7",
            "project_dir": None,
            "executor_profile": "coding",
            "executor_session_id": "claude-uuid-1",
        }

        # A resume carries the session id the runner knows its executor by.
        resume_id = await api.create(
            type="resume_session", session_id="claude-uuid-1", prompt="And the tests?"
        )
        answer = await ao_poll(api, runner_id)
        assert answer is not None
        assert (answer["run"]["run_id"], answer["run"]["type"]) == (resume_id, "resume_session")
        assert answer["run"]["session_id"] == session
        await ok(api, "POST", f"/runner/runs/{resume_id}/started", {"runner_id": runner_id})
        patched = await api.client.patch(
            f"/sessions/{session}/metadata", json={"last_resumed_at": "2026-03-09T10:05:00Z"}
        )
        assert patched.status_code == 200, patched.text
        await ok(
            api,
            "POST",
            f"/sessions/{session}/events",
            {**event, "event_type": "result", "result_text": "They pass."},
            status=201,
        )
        body = {"runner_id": runner_id, "status": "success", "session_status": "idle"}
        for _ in range(2):  # repeated: the first answer was lost
            await ok(api, "POST", f"/runner/runs/{resume_id}/completed", body)
        resumed = await api.run(resume_id)
        assert (resumed["status"], resumed["result"]) == ("completed", "They pass.")
        # The persistent executor ends between runs.
        await ok(
            api,
            "POST",
            f"/runner/sessions/{session}/status",
            {"runner_id": runner_id, "status": "finished"},
        )


async def test_cancel_is_a_stop_order_and_stopped_reports_it(
    settings: CoordinatorSettings,
) -> None:
    async with running_api(settings) as api:
        runner_id = await ao_register(api)
        run_id = await api.create(type="start_session", prompt="a long job")
        answer = await ao_poll(api, runner_id)
        assert answer is not None
        session = answer["run"]["session_id"]
        await ok(api, "POST", f"/runner/runs/{run_id}/started", {"runner_id": runner_id})

        assert (await api.client.post(f"/runs/{run_id}/cancel")).status_code == 200
        assert await ao_poll(api, runner_id) == {"stop_sessions": [session]}
        assert await ao_poll(api, runner_id) is None  # sent once, not in a tight loop
        body = {"runner_id": runner_id, "signal": "SIGTERM"}
        await ok(api, "POST", f"/runner/runs/{run_id}/stopped", body)
        assert (await api.run(run_id))["status"] == "cancelled"


async def test_a_run_stopped_unasked_goes_to_another_runner(
    settings: CoordinatorSettings,
) -> None:
    """The runner stops its runs when it shuts down: their attempts are given back."""
    async with running_api(settings) as api:
        runner_id = await ao_register(api)
        run_id = await api.create(type="start_session", prompt="work")
        await ao_poll(api, runner_id)
        await ok(api, "POST", f"/runner/runs/{run_id}/started", {"runner_id": runner_id})
        body = {"runner_id": runner_id, "signal": "SIGTERM"}
        await ok(api, "POST", f"/runner/runs/{run_id}/stopped", body)
        assert (await api.run(run_id))["status"] == "pending"
        deleted = await api.client.delete(f"/runners/{runner_id}", params={"self": "true"})
        assert deleted.status_code == 200
        assert deleted.json()["initiated_by"] == "self"

        other = await ao_register(api, hostname="build-8")
        answer = await ao_poll(api, other)
        assert answer is not None and answer["run"]["run_id"] == run_id


async def test_one_identity_is_one_runner(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        runner_id = await ao_register(api)
        twin = await api.client.post("/runner/register", json=REGISTRATION)
        assert twin.status_code == 409
        detail = twin.json()["detail"]
        assert detail["error"] == "duplicate_runner"
        assert twin.json()["error"]["code"] == "duplicate_runner"  # corral's error body too
        assert (detail["runner_id"], detail["hostname"]) == (runner_id, "build-7")
        assert (detail["project_dir"], detail["executor_profile"]) == (PROJECT, "coding")

        # Another directory is another runner.
        assert await ao_register(api, project_dir="/srv/other") != runner_id

        # Sent away from outside: its next poll says so, and it may come back as itself.
        assert (await api.client.delete(f"/runners/{runner_id}")).status_code == 200
        assert await ao_poll(api, runner_id) == {"deregistered": True}
        assert await ao_register(api) == runner_id
        states = {r["runner_id"]: r["state"] for r in await runners(api)}
        assert states[runner_id] == "active"


async def test_session_calls_without_a_run_are_refused(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        unknown = await api.client.post(
            "/sessions/ses_000000000000/bind",
            json={"executor_session_id": "x", "hostname": "h", "executor_profile": "p"},
        )
        assert unknown.status_code == 404
        assert error_code(unknown) == "session_not_found"
        affinity = await api.client.get("/sessions/ses_000000000000/affinity")
        assert affinity.status_code == 404
        mismatch = await api.client.post(
            "/sessions/ses_000000000000/events",
            json={"event_type": "result", "session_id": "ses_other", "result_text": "r"},
        )
        assert mismatch.status_code == 422


async def runners(api: Api) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api.client.get("/runners")).json()["runners"]
    return found


async def test_its_runner_trades_a_runner_token_as_it_would_with_auth0(
    settings: CoordinatorSettings,
) -> None:
    """It gets its bearer token by client credentials at ``https://{AUTH0_DOMAIN}/oauth/token``:
    with that domain pointing at the coordinator, the client secret is a corral token."""
    async with running_api(settings) as api:
        tokens = {}
        for role in ("runner", "client"):
            made = await api.client.post("/tokens", json={"role": role})
            assert made.status_code == 201, made.text
            tokens[role] = made.json()["token"]

        def credentials(secret: str) -> dict[str, str]:
            return {
                "grant_type": "client_credentials",
                "client_id": "agent-runner",
                "client_secret": secret,
                "audience": "https://corral",
            }

        no_token = {"Authorization": ""}
        answer = await api.client.post(
            "/oauth/token", json=credentials(tokens["runner"]), headers=no_token
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["access_token"], body["token_type"]) == (tokens["runner"], "Bearer")
        assert body["expires_in"] > 60
        as_runner = {"Authorization": f"Bearer {body['access_token']}"}
        registered = await api.client.post("/runner/register", json=REGISTRATION, headers=as_runner)
        assert registered.status_code == 200, registered.text

        for secret in (tokens["client"], "crl_unknown"):  # not a runner's; not a token
            refused = await api.client.post(
                "/oauth/token", json=credentials(secret), headers=no_token
            )
            assert refused.status_code == 401
            assert refused.json()["error"] == "access_denied"
