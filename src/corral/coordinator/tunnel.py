"""The coordinator's end of the tunnel: the gateway's requests to runners, across their sockets.

One ``TunnelLedger`` per runner (its numbering spans the runner's sockets, so it lives
here, not in a socket's session). A request's messages go out through the runner's
current socket, one flush at a time (each request's messages stay in order); a socket
that breaks loses nothing: when the runner's next socket registers, ``resume`` sends
again whatever it had not acknowledged. The gateway (``gateway.py``) holds a
``TunnelRequest``: it sends the request's parts and takes the response's as they come.

    gateway ──open/send──▶ TunnelHub ──flush──▶ LiveLink (the runner's newest socket)
    gateway ◀──next()──── inbox ◀──receive── SocketPump's read loop (Tunnelled)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.actors.model import Placement
from corral.ids import new_request_id
from corral.protocol import messages as wire
from corral.protocol.limits import TUNNEL_WINDOW_BYTES
from corral.protocol.tunnel import Receipt, TunnelLedger, cost

if TYPE_CHECKING:
    from corral.coordinator.connections import Connections, LiveLink

log = logging.getLogger("corral.coordinator")

# What the gateway sends (acknowledgements are not kept: they are repeated instead).
TunnelPart = (
    wire.ToClientRequestStart
    | wire.ToClientRequestChunk
    | wire.ToClientRequestEnd
    | wire.ToClientRequestAbort
)
Reply = (
    wire.ToServerResponseStart
    | wire.ToServerResponseChunk
    | wire.ToServerResponseEnd
    | wire.ToServerResponseAbort
)


@dataclass
class _Runner:
    ledger: TunnelLedger[TunnelPart, wire.ToClientTunnelAck]
    requests: dict[str, TunnelRequest] = field(default_factory=dict)
    flushing: asyncio.Lock = field(default_factory=asyncio.Lock)
    link: LiveLink | None = None  # the socket resumed last; messages go there
    version: int = 1  # what its Init says in ``metadata.tunnel`` (``wire.TUNNEL_…``)

    @property
    def joins_parts(self) -> bool:
        """It joins a WebSocket message sent in parts, and takes a request without a body
        as its start alone."""
        return self.version >= wire.TUNNEL_PARTS


class TunnelRequest:
    """One tunnelled request, as the gateway sees it."""

    def __init__(self, hub: TunnelHub, runner_id: str, request_id: str) -> None:
        self._hub = hub
        self.runner_id = runner_id
        self.request_id = request_id
        self.replies: asyncio.Queue[Reply] = asyncio.Queue()
        self.acked = asyncio.Event()  # the runner consumed some of what we sent

    async def send(self, *parts: TunnelPart) -> None:
        """Send ``parts`` (numbered here), each after waiting for room in the window, in one
        flush (a request without a body goes as its start and its end together)."""
        runner = self._hub.runner(self.runner_id)
        for part in parts:
            while runner.ledger.room(self.request_id) < cost(part):
                self.acked.clear()
                await self.acked.wait()
            runner.ledger.send(part)
        await self._hub.flush(self.runner_id)

    @property
    def joins_parts(self) -> bool:
        """May a WebSocket message go to the runner in several chunks (``more``), and a
        request without a body as its start alone (``end``)?"""
        return self._hub.runner(self.runner_id).joins_parts

    def started(self) -> bool:
        """Has the runner taken the request start (its actor's port answered)?"""
        runner = self._hub.runner(self.runner_id)
        kept = runner.ledger.kept(self.request_id)
        return runner.ledger.sent_count(self.request_id) > 0 and (not kept or kept[0].seq > 0)

    async def consumed(self, reply: Reply, nbytes: int) -> None:
        """``reply`` was handed to the client: acknowledge it (a quarter window at a time)."""
        runner = self._hub.runner(self.runner_id)
        final = isinstance(reply, wire.ToServerResponseEnd | wire.ToServerResponseAbort) or (
            isinstance(reply, wire.ToServerResponseStart) and reply.end
        )
        ack = runner.ledger.consumed(self.request_id, reply.seq, nbytes, final=final)
        if ack is not None:
            await self._hub.send_now(self.runner_id, ack)

    def close(self) -> None:
        """The request is over here: nothing more of it is sent, what comes is dropped."""
        self._hub.close(self)


class PlacementCache:
    """Where the gateway last found each actor connectable, until the actor changes: a warm
    request then needs no store read. Each entry holds the actor's change event taken
    before the look that found it (``notifier.py``'s rule): once set, the entry is stale.
    A placement stale for another reason (another coordinator moved the actor) is met by
    the runner's 503, and the gateway forgets it and looks again."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._entries: OrderedDict[str, tuple[asyncio.Event, Placement]] = OrderedDict()

    def get(self, actor_id: str) -> Placement | None:
        entry = self._entries.get(actor_id)
        if entry is None:
            return None
        changed, placement = entry
        if changed.is_set():
            del self._entries[actor_id]
            return None
        self._entries.move_to_end(actor_id)
        return placement

    def put(self, actor_id: str, changed: asyncio.Event, placement: Placement) -> None:
        self._entries[actor_id] = (changed, placement)
        self._entries.move_to_end(actor_id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def forget(self, actor_id: str) -> None:
        self._entries.pop(actor_id, None)


class TunnelHub:
    def __init__(self, connections: Connections, *, window: int = TUNNEL_WINDOW_BYTES) -> None:
        self._connections = connections
        self._window = window
        self._runners: dict[str, _Runner] = {}
        self.placements = PlacementCache()

    def runner(self, runner_id: str) -> _Runner:
        runner = self._runners.get(runner_id)
        if runner is None:
            ledger: TunnelLedger[TunnelPart, wire.ToClientTunnelAck] = TunnelLedger(
                wire.ToClientTunnelAck, window=self._window
            )
            runner = self._runners[runner_id] = _Runner(ledger)
        return runner

    def reachable(self, runner_id: str) -> bool:
        """Has the runner a socket that takes tunnel messages now?"""
        return self._link(runner_id) is not None

    def open(self, runner_id: str) -> TunnelRequest:
        request = TunnelRequest(self, runner_id, new_request_id())
        runner = self.runner(runner_id)
        runner.ledger.open(request.request_id)
        runner.requests[request.request_id] = request
        return request

    def close(self, request: TunnelRequest) -> None:
        runner = self._runners.get(request.runner_id)
        if runner is None:
            return
        runner.ledger.forget(request.request_id)
        runner.requests.pop(request.request_id, None)
        if not runner.requests and self._link(request.runner_id) is None:
            # Nothing open and no socket (a serverless runner gone for good, maybe): what
            # comes of its requests later is an orphan, acknowledged and dropped.
            del self._runners[request.runner_id]

    # ---- the runner's sockets (called by socket.py) ----------------------------------------

    async def resume(self, runner_id: str, link: LiveLink, *, version: int = 1) -> None:
        """A socket of the runner registered: from now on messages go there, beginning with
        everything the runner has not acknowledged (the last socket may have lost it)."""
        runner = self.runner(runner_id)
        async with runner.flushing:
            runner.link = link
            runner.version = version
            runner.ledger.rewind()
            for ack in runner.ledger.acks():
                await link.send_message(ack)
        await self.flush(runner_id)

    async def receive(self, link: LiveLink, reply: wire.ToServerTunnel) -> None:
        """A tunnel message from ``link``'s runner (the socket's read loop)."""
        runner_id = link.runner_id
        assert runner_id is not None  # tunnel messages come only after registration
        runner = self.runner(runner_id)
        if isinstance(reply, wire.ToServerTunnelAck):
            runner.ledger.acknowledge(reply.request_id, reply.seq)
            if request := runner.requests.get(reply.request_id):
                request.acked.set()
            return
        receipt = runner.ledger.receive(reply.request_id, reply.seq)
        if receipt is Receipt.NEW:
            runner.requests[reply.request_id].replies.put_nowait(reply)
        elif receipt is Receipt.GAP:
            # Lost on a socket that still looks open: drop it; the runner sends the rest
            # again on its next socket.
            gap = wire.ProtocolError(wire.TUNNEL_GAP, f"tunnel message {reply.seq} skipped one")
            log.warning("runner %s: %s", runner_id, gap.reason)
            await link.protocol_error(gap)
        elif receipt is Receipt.ORPHAN:  # given up here: stop the runner sending it
            await link.send_message(runner.ledger.orphan_ack(reply.request_id, reply.seq))
        elif ack := runner.ledger.duplicate_ack(reply.request_id):
            await link.send_message(ack)

    # ---- sending ---------------------------------------------------------------------------

    async def flush(self, runner_id: str) -> None:
        """Send what is waiting, in order, on the runner's socket (if it has one now)."""
        runner = self.runner(runner_id)
        async with runner.flushing:
            link = self._link(runner_id)
            if link is None:
                return  # kept: the next socket's ``resume`` sends it
            for part in runner.ledger.take_unsent():
                await link.send_message(part)

    async def send_now(self, runner_id: str, message: wire.ToClientTunnelAck) -> None:
        """An acknowledgement: lost with a socket, it is repeated by ``resume``."""
        link = self._link(runner_id)
        if link is not None:
            with contextlib.suppress(Exception):
                await link.send_message(message)

    def _link(self, runner_id: str) -> LiveLink | None:
        runner = self._runners.get(runner_id)
        current = self._connections.by_runner.get(runner_id)
        if runner is None or current is None or current is not runner.link:
            return None
        return None if current.closed.is_set() else current
