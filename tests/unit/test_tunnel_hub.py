"""The coordinator's end of the tunnel without sockets: a fake runner link records what the
hub sends. The ends of responses are acknowledged together, a little later, to a runner
at TUNNEL_WHOLE (one frame for many requests), at once to an older one, and dropped with
a socket that went away (the runner's duplicate is acknowledged then)."""

from __future__ import annotations

import asyncio

import pytest

from corral.coordinator.connections import Connections
from corral.coordinator.tunnel import TunnelHub
from corral.protocol import messages as wire

pytestmark = pytest.mark.anyio
RUNNER = "rnr_000000000001"


class FakeLink:
    def __init__(self) -> None:
        self.runner_id = RUNNER
        self.closed = asyncio.Event()
        self.sent: list[object] = []
        self.arrived = asyncio.Event()

    async def send_message(self, message: object) -> None:
        self.sent.append(message)
        self.arrived.set()


async def connected(version: int) -> tuple[TunnelHub, FakeLink]:
    connections = Connections()
    hub = TunnelHub(connections)
    link = FakeLink()
    connections.by_runner[RUNNER] = link  # type: ignore[assignment]
    await hub.resume(RUNNER, link, version=version)  # type: ignore[arg-type]
    return hub, link


async def answered(hub: TunnelHub, count: int) -> list[str]:
    """``count`` requests, each answered whole and handed to its client."""
    ids = []
    for _ in range(count):
        request = hub.open(RUNNER)
        whole = wire.ToServerResponseStart(request.request_id, 0, 200, (), b"ok", end=True)
        await hub.receive(hub._link(RUNNER), whole)  # type: ignore[arg-type]
        reply = request.take()
        assert reply == whole
        await request.consumed(reply, 2)
        request.close()
        ids.append(request.request_id)
    return ids


async def test_ends_of_responses_go_to_the_runner_together_a_little_later() -> None:
    hub, link = await connected(wire.TUNNEL_WHOLE)
    ids = await answered(hub, 3)
    assert link.sent == []  # not yet: in ACK_DELAY_S
    await asyncio.wait_for(link.arrived.wait(), 10)
    assert link.sent == [wire.ToClientTunnelAcks(tuple((i, 0) for i in ids))]


async def test_an_older_runner_has_each_end_acknowledged_at_once() -> None:
    hub, link = await connected(wire.TUNNEL_PARTS)
    ids = await answered(hub, 2)
    assert link.sent == [wire.ToClientTunnelAck(i, 0) for i in ids]


async def test_acknowledgements_due_on_a_socket_that_went_away_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub, link = await connected(wire.TUNNEL_WHOLE)
    came, due = asyncio.Event(), hub._acks_due

    def acks_due(runner_id: str) -> None:
        due(runner_id)
        came.set()

    monkeypatch.setattr(hub, "_acks_due", acks_due)
    await answered(hub, 2)
    link.closed.set()
    await asyncio.wait_for(came.wait(), 10)  # their time came
    assert link.sent == [] and hub.runner(RUNNER).acks == []
