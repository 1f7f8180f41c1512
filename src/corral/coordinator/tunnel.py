"""The coordinator's end of the tunnel: the gateway's requests to runners, across their sockets.

One ``TunnelLedger`` per runner (its numbering spans the runner's sockets, so it lives
here, not in a socket's session). A request's messages go out through the runner's
current socket, one flush at a time (each request's messages stay in order); a socket
that breaks loses nothing: when the runner's next socket registers, ``resume`` sends
again whatever it had not acknowledged. The gateway (``gateway.py``) holds a
``TunnelRequest``: it sends the request's parts and takes the response's as they come.

That holds while the runner's sockets follow one another on this coordinator. A runner
that was connected to another one in between (or to this one before a restart) dropped
our requests when it got there (``wire.TUNNEL_WITH``), and sent the answers it still had
there: when it comes back, every request it may have taken is lost (``TunnelRequest.lost``:
503 ``tunnel_lost``, the actor may have run it) rather than left waiting for an answer that
will never come; a request it never saw goes now, as usual.

    gateway ──open/send──▶ TunnelHub ──flush──▶ LiveLink (the runner's newest socket)
    gateway ◀──take/wait── replies ◀──receive── SocketPump's read loop (Tunnelled)

The acknowledgement of a response's end goes to a runner at ``TUNNEL_WHOLE`` a little
later (``ACK_DELAY_S``), with the others of that moment in one ``ToClientTunnelAcks``:
nothing waits for it but the runner's memory of the response, and one frame then serves
many requests. Lost with a socket, it is made good as any lost acknowledgement is: the
runner sends the response again, and its duplicate is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.actors.model import Placement
from corral.errors import Unavailable
from corral.ids import new_request_id
from corral.protocol import messages as wire
from corral.protocol.limits import MAX_TUNNEL_ACKS, TUNNEL_WINDOW_BYTES
from corral.protocol.tunnel import Receipt, TunnelLedger, cost

if TYPE_CHECKING:
    from corral.coordinator.connections import Connections, LiveLink

log = logging.getLogger("corral.coordinator")

ACK_DELAY_S = 0.01  # a response's last acknowledgement waits this long for others
MAX_STARTS = 10_000  # start commands remembered (one an actor: the last one sent)

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
    acks: list[tuple[str, int]] = field(default_factory=list)  # to send in a while
    acks_due: asyncio.TimerHandle | None = None

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
        self._replies: deque[Reply] = deque()
        self._waiter: asyncio.Future[None] | None = None  # ``wait``'s, while it waits
        self.acked = asyncio.Event()  # the runner consumed some of what we sent
        self.lost: str | None = None  # why no more of it will come (see the top)
        self.on_a_socket = False  # some of it went out on a socket: the runner may have it

    def take(self) -> Reply | None:
        """The next reply, if one came."""
        return self._replies.popleft() if self._replies else None

    @property
    def has_reply(self) -> bool:
        return bool(self._replies)

    async def wait(self, timeout: float) -> None:
        """Until a reply comes, ``wake`` is called, or ``timeout`` seconds have passed
        (one future and one timer: no task per reply)."""
        if self._replies or self.lost is not None:
            return
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def deliver(self, reply: Reply) -> None:
        self._replies.append(reply)
        self.wake()

    def wake(self) -> None:
        """Wake ``wait`` now (the client went away)."""
        if self._waiter is not None:
            _resolve(self._waiter)

    def lose(self, reason: str) -> None:
        """The runner no longer holds the request: nothing more of it comes or goes."""
        self.lost = reason
        self.acked.set()  # a ``send`` waiting for room sees it
        self.wake()

    def check(self) -> None:
        """Raise ``tunnel_lost`` if the request is lost."""
        if self.lost is not None:
            raise Unavailable(self.lost, code="tunnel_lost")

    async def send(self, *parts: TunnelPart) -> None:
        """Send ``parts`` (numbered here), each after waiting for room in the window, in one
        flush (a request without a body goes as its start and its end together)."""
        runner = self._hub.runner(self.runner_id)
        for part in parts:
            self.check()
            while runner.ledger.room(self.request_id) < cost(part):
                self.acked.clear()
                await self.acked.wait()
                self.check()
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
        if ack is None:
            return
        if final and runner.version >= wire.TUNNEL_WHOLE:
            self._hub.acknowledge_soon(self.runner_id, ack)
        else:
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
        self.end = secrets.token_hex(8)  # this process's end of the tunnels (wire.TUNNEL_END)
        self._connections = connections
        self._window = window
        self._runners: dict[str, _Runner] = {}
        self._sending: set[asyncio.Future[None]] = set()  # acknowledgements on their way
        self.placements = PlacementCache()
        # The last start command sent for each actor: (runner, generation, socket).
        self._starts: OrderedDict[str, tuple[str, int, LiveLink]] = OrderedDict()

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

    # ---- actors starting: a request may go before they run (``wire.TUNNEL_STARTING``) ------

    def start_sent(self, link: LiveLink, actor_id: str, generation: int) -> None:
        """``link`` has sent its runner the command to start that generation of the actor."""
        assert link.runner_id is not None
        self._starts[actor_id] = (link.runner_id, generation, link)
        self._starts.move_to_end(actor_id)
        while len(self._starts) > MAX_STARTS:
            self._starts.popitem(last=False)

    def starting(self, placement: Placement) -> bool:
        """May a request for ``placement``, an actor still starting, go now? Yes once its
        start command went out on the socket the request would take (the runner reads it
        first), to a runner that holds such a request until the actor accepts connections."""
        entry = self._starts.get(placement.actor_id)
        if entry is None or entry[:2] != (placement.runner_id, placement.generation):
            return False
        runner = self._runners.get(placement.runner_id)
        return (
            runner is not None
            and runner.version >= wire.TUNNEL_STARTING
            and self._link(placement.runner_id) is entry[2]
        )

    # ---- the runner's sockets (called by socket.py) ----------------------------------------

    async def resume(
        self, runner_id: str, link: LiveLink, *, version: int = 1, elsewhere: bool = False
    ) -> None:
        """A socket of the runner registered: from now on messages go there, beginning with
        everything the runner has not acknowledged (the last socket may have lost it).
        ``elsewhere``: its last socket was with another end (``wire.TUNNEL_WITH``): the
        requests it may have taken are lost (see the top)."""
        runner = self.runner(runner_id)
        async with runner.flushing:
            runner.link = link
            runner.version = version
            if elsewhere:
                self._lose_taken(runner, f"runner {runner_id} was connected elsewhere meanwhile")
            runner.ledger.rewind()
            for ack in runner.ledger.acks():
                await link.send_message(ack)
        await self.flush(runner_id)

    def _lose_taken(self, runner: _Runner, reason: str) -> None:
        """Every request of ``runner`` it may have seen is lost; it is sent none of it again."""
        for request_id, request in list(runner.requests.items()):
            if request.on_a_socket:
                runner.ledger.forget(request_id)
                request.lose(reason)

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
            runner.requests[reply.request_id].deliver(reply)
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
                if request := runner.requests.get(part.request_id):
                    request.on_a_socket = True
                await link.send_message(part)

    async def send_now(self, runner_id: str, message: wire.ToClientTunnelAck) -> None:
        """An acknowledgement: lost with a socket, it is repeated by ``resume``."""
        link = self._link(runner_id)
        if link is not None:
            with contextlib.suppress(Exception):
                await link.send_message(message)

    def acknowledge_soon(self, runner_id: str, ack: wire.ToClientTunnelAck) -> None:
        """Send ``ack`` within ``ACK_DELAY_S``, with the others of the runner then."""
        runner = self.runner(runner_id)
        runner.acks.append((ack.request_id, ack.seq))
        if runner.acks_due is None:
            loop = asyncio.get_running_loop()
            runner.acks_due = loop.call_later(ACK_DELAY_S, self._acks_due, runner_id)

    def _acks_due(self, runner_id: str) -> None:
        runner = self._runners.get(runner_id)
        if runner is None:
            return
        runner.acks_due = None
        acks, runner.acks = runner.acks, []
        link = self._link(runner_id)
        if link is None or not acks:
            return  # lost with the socket: the runner sends again, its duplicate is acked
        task = asyncio.ensure_future(self._send_acks(link, acks))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_acks(self, link: LiveLink, acks: list[tuple[str, int]]) -> None:
        for at in range(0, len(acks), MAX_TUNNEL_ACKS):
            batch = wire.ToClientTunnelAcks(tuple(acks[at : at + MAX_TUNNEL_ACKS]))
            with contextlib.suppress(Exception):
                await link.send_message(batch)

    def _link(self, runner_id: str) -> LiveLink | None:
        runner = self._runners.get(runner_id)
        current = self._connections.by_runner.get(runner_id)
        if runner is None or current is None or current is not runner.link:
            return None
        return None if current.closed.is_set() else current


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
