"""The coordinator's end of the tunnel without sockets: a fake runner link records what the
hub sends. The ends of responses are acknowledged together, a little later, to a runner
at TUNNEL_WHOLE (one frame for many requests), at once to an older one, and dropped with
a socket that went away (the runner's duplicate is acknowledged then)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from corral.actors.model import Placement
from corral.coordinator.connections import Connections
from corral.coordinator.tunnel import TunnelHub
from corral.errors import Unavailable
from corral.ids import ActorId
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


async def test_a_request_may_go_to_a_starting_actor_once_its_start_went_out_on_the_socket() -> None:
    """Only to the generation the socket was told to start, through that same socket (the
    runner reads the command first), and only to a runner that holds such a request until
    the actor accepts connections."""
    hub, link = await connected(wire.TUNNEL_STARTING)
    starting = Placement(ActorId("act_1"), RUNNER, 2)
    assert not hub.starting(starting)  # no start command sent yet
    hub.start_sent(link, "act_1", 2)  # type: ignore[arg-type]
    assert hub.starting(starting)
    assert not hub.starting(replace(starting, generation=3))
    assert not hub.starting(replace(starting, runner_id="rnr_000000000002"))
    newer = FakeLink()  # the runner's next socket: the command may have been lost
    hub._connections.by_runner[RUNNER] = newer  # type: ignore[assignment]
    await hub.resume(RUNNER, newer, version=wire.TUNNEL_STARTING)  # type: ignore[arg-type]
    assert not hub.starting(starting)
    older, old_link = await connected(wire.TUNNEL_WHOLE)  # it would answer 503 at once
    older.start_sent(old_link, "act_1", 2)  # type: ignore[arg-type]
    assert not older.starting(starting)


def bodiless(request_id: str) -> wire.ToClientRequestStart:
    return wire.ToClientRequestStart(request_id, 0, "act_1", 1, "GET", "/", (), False, end=True)


async def reconnected(hub: TunnelHub, *, elsewhere: bool = False) -> FakeLink:
    """The runner's next socket, registered; ``elsewhere``: it was with another end."""
    link = FakeLink()
    hub._connections.by_runner[RUNNER] = link  # type: ignore[assignment]
    await hub.resume(RUNNER, link, version=wire.TUNNEL_WHOLE, elsewhere=elsewhere)  # type: ignore[arg-type]
    return link


async def test_a_runner_back_from_another_coordinator_ends_the_requests_it_may_have_taken() -> None:
    """There it dropped them (and its answers went there): they are lost (503 tunnel_lost),
    at once and not sent again; a request it never saw goes on the new socket as usual."""
    hub, _ = await connected(wire.TUNNEL_WHOLE)
    taken = hub.open(RUNNER)
    await taken.send(bodiless(taken.request_id))
    hub._connections.by_runner.pop(RUNNER)  # its socket broke: what is opened now waits
    unseen = hub.open(RUNNER)
    start = bodiless(unseen.request_id)
    await unseen.send(start)
    waiting = asyncio.ensure_future(taken.wait(60))
    back = await reconnected(hub, elsewhere=True)
    await asyncio.wait_for(waiting, 10)  # woken at once
    assert taken.take() is None and taken.lost is not None
    with pytest.raises(Unavailable) as lost:
        taken.check()
    assert lost.value.code == "tunnel_lost"
    assert back.sent == [start]  # the one it never saw, and nothing of the lost one
    with pytest.raises(Unavailable):
        await taken.send(wire.ToClientRequestEnd(taken.request_id, 0))
    unseen.check()  # not lost


async def test_a_runner_back_from_this_coordinators_own_socket_keeps_its_requests() -> None:
    hub, _ = await connected(wire.TUNNEL_WHOLE)
    request = hub.open(RUNNER)
    start = bodiless(request.request_id)
    await request.send(start)
    again = await reconnected(hub)
    assert again.sent == [start]  # unacknowledged: sent again, the runner drops a duplicate
    assert request.lost is None
