"""No one else in: tokens and roles on every route, runner identities bound to their token,
reports only from the lease holder, and the Host and Origin checks (issue 9 §2).

The route tests walk ``app.routes``: a route added later is covered without a change here,
and one that states no access (``require``) fails ``test_every_route_states_its_access``."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from api_fixtures import TOKEN, Api, error_code, running_api
from fastapi.routing import APIRoute, APIWebSocketRoute, RouteContext, iter_route_contexts

from corral.coordinator.auth import GRANTS, PUBLIC_PATHS, Access, route_access
from corral.coordinator.settings import CoordinatorSettings
from corral.tokens import Role

pytestmark = pytest.mark.anyio
ROLES = list(Role)
STARTED = {"type": "started", "run_id": "run_000000000000", "attempt": 1}


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Api]:
    async with running_api(CoordinatorSettings(db_url=db_url, poll_timeout_s=0.5)) as found:
        yield found


async def make_token(api: Api, role: Role, **body: object) -> str:
    response = await api.client.post("/tokens", json={"role": role, **body})
    assert response.status_code == 201, response.text
    secret: str = response.json()["token"]
    return secret


async def agent_token(api: Api) -> str:
    """An agent token (minted, not made): for the run a runner has claimed."""
    runner = await api.register("agent-host")
    run_id = await api.create(type="start_session", prompt="work")
    assert (await api.claim_one(runner))["run_id"] == run_id
    minted = await api.client.post(
        f"/runner/runs/{run_id}/agent-token", json={"runner_id": runner, "attempt": 1}
    )
    assert minted.status_code == 200, minted.text
    secret: str = minted.json()["token"]
    return secret


def as_(secret: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {"Authorization": ""}


def api_routes(api: Api) -> list[RouteContext]:
    """Every route of the app's API (HTTP and WebSocket), included routers' too."""
    return [
        route
        for route in iter_route_contexts(api.app.routes)
        if isinstance(route.original_route, APIRoute | APIWebSocketRoute)
    ]


def http_routes(api: Api) -> list[tuple[str, str, RouteContext]]:
    """(method, a concrete path, route) for every HTTP route of the app."""
    found = []
    for route in api_routes(api):
        if route.methods:
            path = re.sub(r"\{[^}]+\}", "x", str(route.path))
            found += [(method, path, route) for method in sorted(route.methods)]
    return found


# ---- every route ----------------------------------------------------------------------------


async def test_every_route_states_its_access(api: Api) -> None:
    routes = api_routes(api)
    for route in routes:
        needs = route_access(route)
        if route.path in PUBLIC_PATHS:
            assert not needs, route.path
        else:
            assert len(needs) == 1, f"{route.path} states no access (or several): {needs}"
    assert {r.path for r in routes} & PUBLIC_PATHS == {"/health", "/oauth/token"}
    assert "/runner/socket" in {r.path for r in routes}


async def test_every_route_but_health_refuses_a_missing_or_unknown_token(api: Api) -> None:
    routes = http_routes(api)
    assert len(routes) > 30
    for method, path, _ in routes:
        for headers, code in ((as_(None), "unauthorized"), (as_("crl_nope"), "invalid_token")):
            response = await api.client.request(method, path, headers=headers, json={})
            if path == "/health":
                assert response.status_code == 200
                continue
            if path == "/oauth/token":  # takes its secret in the body (test_compat_ao.py)
                assert response.status_code == 422
                continue
            assert response.status_code == 401, (method, path, response.text)
            if method != "HEAD":  # an answer to HEAD has no body
                assert error_code(response) == code
            assert response.headers["www-authenticate"] == "Bearer"


async def test_every_route_refuses_the_roles_that_may_not_use_it(api: Api) -> None:
    tokens = {
        role: await (agent_token(api) if role is Role.AGENT else make_token(api, role))
        for role in ROLES
    }
    checked = 0
    for method, path, route in http_routes(api):
        needs = route_access(route)
        if not needs:
            continue
        (access,) = needs
        for role in ROLES:
            # A body the route cannot accept: an allowed caller gets past the door (4xx of
            # its own), a refused one is stopped there (403), before anything is read.
            # GET /events would stream until the client hangs up: a kind it refuses ends it.
            params = {"kind": "none"} if path == "/events" else None
            response = await api.client.request(
                method, path, headers=as_(tokens[role]), json={}, params=params
            )
            if role in GRANTS[access]:
                assert response.status_code not in (401, 403), (role, method, path, response.text)
            else:
                assert response.status_code == 403, (role, method, path, response.text)
                if method != "HEAD":
                    assert error_code(response) == "forbidden"
            checked += 1
    assert checked > 100


async def test_what_each_role_may_do(api: Api) -> None:
    assert GRANTS[Access.ADMIN] == {Role.ADMIN}
    assert GRANTS[Access.WRITE] == {Role.ADMIN, Role.CLIENT}
    assert GRANTS[Access.RUNS] == {Role.ADMIN, Role.CLIENT, Role.AGENT}  # test_agent_tokens.py
    assert GRANTS[Access.READ] == {Role.ADMIN, Role.CLIENT, Role.READER, Role.AGENT}
    assert GRANTS[Access.RUNNER] == {Role.ADMIN, Role.RUNNER}
    client, reader = await make_token(api, Role.CLIENT), await make_token(api, Role.READER)
    created = await api.client.post(
        "/runs", json={"type": "command", "command": ["true"]}, headers=as_(client)
    )
    assert created.status_code == 201
    run_id = created.json()["run_id"]
    assert (await api.client.get(f"/runs/{run_id}", headers=as_(reader))).status_code == 200
    refused = await api.client.post(f"/runs/{run_id}/cancel", headers=as_(reader))
    assert (refused.status_code, error_code(refused)) == (403, "forbidden")
    assert (await api.run(run_id))["status"] == "pending"


# ---- tokens ---------------------------------------------------------------------------------


async def test_tokens_are_stored_hashed_listed_without_secret_and_revoked(api: Api) -> None:
    created = await api.client.post("/tokens", json={"role": "client", "name": "ci"})
    assert created.status_code == 201
    body = created.json()
    secret, token_id = body["token"], body["token_id"]
    assert len(secret) > 40 and body["role"] == "client" and body["name"] == "ci"

    with api.coordinator.store.db.transaction(write=False) as tx:
        (row,) = tx.execute("SELECT * FROM tokens WHERE id = ?", (token_id,))
    assert row["token_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(row)

    listed = (await api.client.get("/tokens")).json()["tokens"]
    assert [t["token_id"] for t in listed] == [token_id]
    assert secret not in str(listed) and "token" not in listed[0]

    assert (await api.client.get("/runs", headers=as_(secret))).status_code == 200
    revoked = await api.client.post(f"/tokens/{token_id}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = await api.client.get("/runs", headers=as_(secret))
    assert (refused.status_code, error_code(refused)) == (401, "invalid_token")

    missing = await api.client.post("/tokens/tok_missing/revoke")
    assert (missing.status_code, error_code(missing)) == (404, "token_not_found")
    bad_role = await api.client.post("/tokens", json={"role": "root"})
    assert bad_role.status_code == 422
    labelled = await api.client.post("/tokens", json={"role": "client", "labels": ["gpu"]})
    assert labelled.status_code == 422


async def test_a_token_is_never_logged(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = await make_token(api, Role.RUNNER)
    runner_id = await register_as(api, secret, "r")
    await api.client.get("/runs", headers=as_(secret))  # refused
    await api.client.get("/runs", headers=as_(secret + "x"))  # unknown
    assert runner_id
    for record in caplog.records:
        assert secret not in record.getMessage() and TOKEN not in record.getMessage()


# ---- runner identity ------------------------------------------------------------------------


async def register_as(api: Api, secret: str, name: str, **body: object) -> str:
    response = await api.client.post(
        "/runner/register", json={"name": name, **body}, headers=as_(secret)
    )
    assert response.status_code == 200, response.text
    runner_id: str = response.json()["runner_id"]
    return runner_id


async def test_another_token_cannot_take_over_a_runner_id(api: Api) -> None:
    mine, theirs = await make_token(api, Role.RUNNER), await make_token(api, Role.RUNNER)
    runner_id = await register_as(api, mine, "real")
    before = api.snapshot()

    takeover = await api.client.post(
        "/runner/register", json={"name": "evil", "runner_id": runner_id}, headers=as_(theirs)
    )
    assert (takeover.status_code, error_code(takeover)) == (403, "runner_not_yours")
    assert runner_id not in takeover.text  # the message does not confirm whose id it is
    for method, path, body in (
        ("POST", "/runner/heartbeat", {"runner_id": runner_id, "held": []}),
        ("POST", "/runner/deregister", {"runner_id": runner_id}),
        ("POST", "/runner/events", {"runner_id": runner_id, "events": [STARTED]}),
        ("GET", f"/runner/runs?runner_id={runner_id}&max_runs=1&timeout=0", None),
        ("GET", f"/runner/control?runner_id={runner_id}&timeout=0", None),
    ):
        refused = await api.client.request(method, path, json=body, headers=as_(theirs))
        assert (refused.status_code, error_code(refused)) == (403, "runner_not_yours"), path
    # The admin token is another token too.
    refused = await api.client.post("/runner/heartbeat", json={"runner_id": runner_id})
    assert (refused.status_code, error_code(refused)) == (403, "runner_not_yours")
    assert api.snapshot() == before

    # Its own token may come back under the same id.
    assert await register_as(api, mine, "real", runner_id=runner_id) == runner_id


async def test_a_forged_completion_is_refused(api: Api) -> None:
    runner_token, other_runner = (
        await make_token(api, Role.RUNNER),
        await make_token(api, Role.RUNNER),
    )
    client_token = await make_token(api, Role.CLIENT)
    run_id = await api.create_command("sleep", "100")
    runner_id = await register_as(api, runner_token, "real")
    polled = await api.client.get(
        "/runner/runs",
        params={"runner_id": runner_id, "max_runs": 1, "timeout": 0},
        headers=as_(runner_token),
    )
    assert polled.status_code == 200
    started = await api.client.post(
        f"/runner/runs/{run_id}/started",
        json={"runner_id": runner_id, "attempt": 1},
        headers=as_(runner_token),
    )
    assert started.status_code == 200
    # Everything a forger needs is public to any reader.
    public = await api.run(run_id)
    assert (public["runner_id"], public["attempts"]) == (runner_id, 1)

    forged = {"runner_id": runner_id, "attempt": 1, "exit_code": 0}
    for secret, code in ((other_runner, "runner_not_yours"), (client_token, "forbidden")):
        for what in ("completed", "failed"):
            refused = await api.client.post(
                f"/runner/runs/{run_id}/{what}", json=forged, headers=as_(secret)
            )
            assert (refused.status_code, error_code(refused)) == (403, code)
        batch = await api.client.post(
            "/runner/events",
            json={
                "runner_id": runner_id,
                "events": [
                    {"type": "finished", "run_id": run_id, "attempt": 1, "status": "completed"}
                ],
            },
            headers=as_(secret),
        )
        assert (batch.status_code, error_code(batch)) == (403, code)
    assert (await api.run(run_id))["status"] == "running"

    done = await api.client.post(
        f"/runner/runs/{run_id}/completed", json=forged, headers=as_(runner_token)
    )
    assert done.status_code == 200
    assert (await api.run(run_id))["status"] == "completed"


async def test_a_runner_token_limited_to_labels(api: Api) -> None:
    gpu = await make_token(api, Role.RUNNER, labels=["gpu"])
    assert await register_as(api, gpu, "a", labels=["gpu"])
    refused = await api.client.post(
        "/runner/register", json={"name": "b", "labels": ["gpu", "prod"]}, headers=as_(gpu)
    )
    assert (refused.status_code, error_code(refused)) == (403, "labels_not_allowed")


# ---- Host and Origin ------------------------------------------------------------------------


async def test_a_host_not_allowed_is_refused(api: Api) -> None:
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example"):
        refused = await api.client.get("/runs", headers={"Host": host})
        assert (refused.status_code, error_code(refused)) == (403, "host_not_allowed"), host
        health = await api.client.get("/health", headers={"Host": host})
        assert health.status_code == 403
    for host in ("localhost:8765", "127.0.0.1", "[::1]:8765", "LOCALHOST"):
        assert (await api.client.get("/runs", headers={"Host": host})).status_code == 200, host


async def test_allowed_hosts_adds_names(tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        db_url=str(tmp_path / "c.db"), host="10.1.2.3", allowed_hosts=("corral.internal",)
    )
    async with running_api(settings) as api:
        for host, status in (
            ("corral.internal:8765", 200),
            ("10.1.2.3:8765", 200),
            ("other.internal", 403),
        ):
            assert (await api.client.get("/runs", headers={"Host": host})).status_code == status


async def test_a_request_from_another_origin_is_refused(api: Api) -> None:
    refused = await api.client.post(
        "/runs",
        json={"type": "command", "command": ["true"]},
        headers={"Origin": "http://evil.example"},
    )
    assert (refused.status_code, error_code(refused)) == (403, "origin_not_allowed")
    same = await api.client.get("/runs", headers={"Origin": "http://localhost"})
    assert same.status_code == 200
    assert (await api.client.get("/runs", headers={"Origin": "null"})).status_code == 403


async def test_httpx_client_without_token_gets_a_clear_message(api: Api) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api.app), base_url="http://localhost"
    ) as bare:
        response = await bare.get("/runs")
    assert response.status_code == 401
    assert "CORRAL_TOKEN" in response.json()["error"]["message"]


async def test_a_refusal_does_not_name_the_runner_holding_the_run(api: Api) -> None:
    run_id = await api.create_command("sleep", "100")
    holder = await api.register("holder")
    await api.claim_one(holder)
    other = await api.register("other")
    refused = await api.complete(run_id, other, 1)
    assert (refused.status_code, error_code(refused)) == (409, "lease_lost")
    assert holder not in refused.text
