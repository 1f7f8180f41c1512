"""No one else in, on the WebSocket runner link: the upgrade needs a runner (or admin) token,
a browser page of another origin cannot open it, and a socket cannot take over the runner
id of another token's runner (issue 9 §2)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from api_fixtures import HEADERS, wait_until
from test_socket_frames import STEP_S, Peer, Served, serve
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from corral.protocol import messages as m

pytestmark = pytest.mark.anyio


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(str(tmp_path / "corral.db")) as found:
        yield found


async def token(served: Served, role: str) -> str:
    response = await served.http.post("/tokens", json={"role": role})
    assert response.status_code == 201, response.text
    secret: str = response.json()["token"]
    return secret


async def open_as(served: Served, secret: str, **headers: str) -> Peer:
    ws = await connect(
        f"{served.ws_url}/runner/socket",
        open_timeout=STEP_S,
        additional_headers={"Authorization": f"Bearer {secret}", **headers},
    )
    return Peer(ws)


async def refused(served: Served, headers: dict[str, str]) -> tuple[int, str | None]:
    """The HTTP status (and error code) an upgrade with ``headers`` is answered with."""
    with pytest.raises(InvalidStatus) as caught:
        await connect(
            f"{served.ws_url}/runner/socket", open_timeout=STEP_S, additional_headers=headers
        )
    response = caught.value.response
    code = json.loads(response.body)["error"]["code"] if response.body else None
    return response.status_code, code


async def test_the_upgrade_needs_a_runner_token(served: Served) -> None:
    assert await refused(served, {}) == (401, "unauthorized")
    assert await refused(served, {"Authorization": "Bearer crl_nope"}) == (401, "invalid_token")
    for role in ("reader", "client"):
        secret = await token(served, role)
        status, _ = await refused(served, {"Authorization": f"Bearer {secret}"})
        assert status == 403, role
    for secret in (await token(served, "runner"), HEADERS["Authorization"].split()[1]):
        peer = await open_as(served, secret)
        await peer.init("allowed")
        await peer.close()


async def test_a_page_of_another_origin_cannot_open_the_socket(served: Served) -> None:
    headers = {**HEADERS, "Origin": "http://evil.example"}
    assert await refused(served, headers) == (403, "origin_not_allowed")
    own = served.ws_url.replace("ws://", "http://")
    peer = await open_as(served, HEADERS["Authorization"].split()[1], Origin=own)
    await peer.init("same-origin")
    await peer.close()


async def test_another_token_cannot_take_over_a_runner_id(served: Served) -> None:
    real = await open_as(served, await token(served, "runner"))
    runner_id = (await real.init("real")).runner_id

    thief = await open_as(served, await token(served, "runner"))
    await thief.send(
        m.ToServerInit(
            name="thief",
            version="test",
            protocol_version=m.PROTOCOL_VERSION,
            total_slots=1,
            last_command_idx=0,
            runner_id=runner_id,
            labels=(),
            metadata={},
        )
    )
    assert await thief.closed_with() == (m.CLOSE_POLICY_VIOLATION, "corral.runner_not_yours")

    # The real runner was not evicted: it still answers, and is the only one registered.
    await real.nothing_pending()
    runners = await served.runners()
    assert [(r["runner_id"], r["name"], r["state"]) for r in runners] == [
        (runner_id, "real", "active")
    ]
    # Its commands still go to it alone.
    run_id = await served.create_run("true")
    commands = await real.expect(m.ToClientCommands)
    assert commands.commands[0].body["run"]["run_id"] == run_id
    await real.close()


async def test_revoking_a_token_closes_its_sockets(served: Served) -> None:
    response = await served.http.post("/tokens", json={"role": "runner"})
    secret, token_id = response.json()["token"], response.json()["token_id"]
    peer = await open_as(served, secret)
    await peer.init("soon-revoked")
    revoked = await served.http.post(f"/tokens/{token_id}/revoke")
    assert revoked.status_code == 200
    assert await peer.closed_with() == (m.CLOSE_POLICY_VIOLATION, "corral.token_revoked")
    assert await refused(served, {"Authorization": f"Bearer {secret}"}) == (401, "invalid_token")
    await wait_until(
        lambda: not served.coordinator.connections.by_runner, what="the socket to be forgotten"
    )
