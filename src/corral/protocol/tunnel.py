"""The tunnel's bookkeeping at one end of a runner link: ``TunnelLedger``, pure.

A tunnelled request (seed 002: the gateway forwards a client's request to an actor through
its runner's socket) is two streams of messages, one each way, each numbered from 0
(``seq``). Each end keeps what it sent until the other acknowledges it, and a socket may
break at any moment, so:

    send ──▶ kept [0 1 2 3] ──take_unsent──▶ socket        ack(1) ──▶ kept [2 3]
    new socket: rewind ──▶ unsent again [2 3] ──▶ the new socket (duplicates dropped by seq)

    receive(seq): the next one ──▶ NEW · an old one ──▶ DUPLICATE · a later one ──▶ GAP
                  a request this end does not hold (never opened, or long over) ──▶ ORPHAN
    consumed(seq, bytes) ──▶ an ack once a quarter window has been consumed (or at the end)

A sender stays within a window of unacknowledged bytes (``room``): a slow client slows the
actor down instead of filling the coordinator's memory. A GAP means a message was lost
on a socket that still looks open; the endpoint drops that socket, and the peer's rewind on
the next one fills the gap. Acknowledgements are cumulative and idempotent, so a lost
one is made good by the next, and ``acks`` repeats the last of every stream on a new socket.

A request that is over is remembered a while (``MAX_FINISHED`` of them): a request start
sent again because its acknowledgement was lost is then a duplicate, never run twice. An
orphan is acknowledged and dropped, so that its sender stops sending it.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from corral.protocol.limits import TUNNEL_WINDOW_BYTES

_MESSAGE_BYTES = 256  # what a message without a body counts against the window
MAX_FINISHED = 4096


class _Numbered(Protocol):
    @property
    def request_id(self) -> str: ...

    @property
    def seq(self) -> int: ...


Out = TypeVar("Out", bound=_Numbered)
Ack = TypeVar("Ack")


class Receipt(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    GAP = "gap"
    ORPHAN = "orphan"


def cost(message: object) -> int:
    """What a message counts against the window: its body, or a small constant (a
    response's start without one, too)."""
    data = getattr(message, "data", None)
    return len(data) if isinstance(data, bytes) and data else _MESSAGE_BYTES


@dataclass
class _Outgoing(Generic[Out]):
    next_seq: int = 0
    kept: deque[Out] | None = None
    unacked_bytes: int = 0


@dataclass
class _Incoming:
    expected: int = 0  # the next seq to accept
    consumed: int = -1  # consumed up to here
    acked: int = -1  # acknowledged up to here
    since_ack: int = 0  # bytes consumed since the last ack


class TunnelLedger(Generic[Out, Ack]):
    """The requests one end of a link is tunnelling, across every socket of the link.
    ``make_ack(request_id, seq)`` builds this end's acknowledgement message."""

    def __init__(
        self, make_ack: Callable[[str, int], Ack], *, window: int = TUNNEL_WINDOW_BYTES
    ) -> None:
        self._make_ack = make_ack
        self.window = window
        self._out: dict[str, _Outgoing[Out]] = {}
        self._in: dict[str, _Incoming] = {}
        # Requests that are over: how many of their messages this end had taken.
        self._finished: OrderedDict[str, int] = OrderedDict()
        self._unsent: deque[tuple[str, int]] = deque()  # (request, seq) in the order sent

    @property
    def requests(self) -> frozenset[str]:
        return frozenset(self._out) | frozenset(self._in)

    # ---- sending ---------------------------------------------------------------------------

    def send(self, message: Out) -> Out:
        """Number ``message`` (its ``seq`` is replaced) and keep it until acknowledged."""
        out = self._out.setdefault(message.request_id, _Outgoing(kept=deque()))
        assert out.kept is not None
        numbered = replace(message, seq=out.next_seq)  # type: ignore[type-var]
        out.next_seq += 1
        out.kept.append(numbered)
        out.unacked_bytes += cost(numbered)
        self._unsent.append((message.request_id, numbered.seq))
        return numbered

    def take_unsent(self) -> list[Out]:
        """What was sent (or rewound) and has not been handed to a socket, in order."""
        taken: list[Out] = []
        while self._unsent:
            request_id, seq = self._unsent.popleft()
            out = self._out.get(request_id)
            if out is None or out.kept is None:
                continue  # forgotten meanwhile
            taken.extend(m for m in out.kept if m.seq == seq)  # gone if acknowledged
        return taken

    def rewind(self) -> None:
        """A new socket: everything unacknowledged goes again (the old socket may have lost it)."""
        self._unsent = deque(
            (request_id, m.seq) for request_id, out in self._out.items() for m in out.kept or ()
        )

    def acknowledge(self, request_id: str, seq: int) -> None:
        out = self._out.get(request_id)
        if out is None or out.kept is None:
            return
        while out.kept and out.kept[0].seq <= seq:
            out.unacked_bytes -= cost(out.kept.popleft())

    def room(self, request_id: str) -> int:
        """How many more bytes may be sent before the receiver acknowledges some."""
        out = self._out.get(request_id)
        return self.window - (out.unacked_bytes if out else 0)

    def kept(self, request_id: str) -> tuple[Out, ...]:
        out = self._out.get(request_id)
        return tuple(out.kept or ()) if out else ()

    def sent_count(self, request_id: str) -> int:
        out = self._out.get(request_id)
        return out.next_seq if out else 0

    # ---- receiving -------------------------------------------------------------------------

    def open(self, request_id: str) -> None:
        """This end will take messages of ``request_id`` (the gateway opens its requests)."""
        self._in.setdefault(request_id, _Incoming())

    def receive(self, request_id: str, seq: int, *, opening: bool = False) -> Receipt:
        """Where message ``seq`` of ``request_id`` stands; ``opening``: it may open the
        request (the runner, for a request start)."""
        incoming = self._in.get(request_id)
        if incoming is None:
            taken = self._finished.get(request_id)
            if taken is not None:
                return Receipt.DUPLICATE if seq < taken else Receipt.ORPHAN
            if not (opening and seq == 0):
                return Receipt.ORPHAN
            incoming = self._in[request_id] = _Incoming()
        if seq < incoming.expected:
            return Receipt.DUPLICATE
        if seq > incoming.expected:
            return Receipt.GAP
        incoming.expected += 1
        return Receipt.NEW

    def consumed(
        self, request_id: str, seq: int, nbytes: int, *, final: bool = False
    ) -> Ack | None:
        """The message ``seq`` has been consumed (written on, read by the client): an ack
        to send when a quarter window has been consumed since the last one, or ``final``."""
        incoming = self._in.get(request_id)
        if incoming is None or seq <= incoming.consumed:
            return None
        incoming.consumed = seq
        incoming.since_ack += nbytes
        if not final and incoming.since_ack < self.window // 4:
            return None
        incoming.acked, incoming.since_ack = seq, 0
        return self._make_ack(request_id, seq)

    def acks(self) -> list[Ack]:
        """The last acknowledgement of every incoming stream, again (on a new socket)."""
        return [
            self._make_ack(request_id, incoming.acked)
            for request_id, incoming in self._in.items()
            if incoming.acked >= 0
        ]

    def duplicate_ack(self, request_id: str) -> Ack | None:
        """A duplicate came: the peer may have missed our ack; repeat it."""
        incoming = self._in.get(request_id)
        last = self._finished.get(request_id, 0) - 1 if incoming is None else incoming.acked
        return None if last < 0 else self._make_ack(request_id, last)

    def orphan_ack(self, request_id: str, seq: int) -> Ack:
        return self._make_ack(request_id, seq)

    # ---- the end ---------------------------------------------------------------------------

    def forget(self, request_id: str) -> None:
        """The request is over at this end: nothing of it is kept or sent any more, and what
        still comes of it is a duplicate."""
        self._out.pop(request_id, None)
        incoming = self._in.pop(request_id, None) or _Incoming()
        self._finished[request_id] = incoming.expected
        self._finished.move_to_end(request_id)
        while len(self._finished) > MAX_FINISHED:
            self._finished.popitem(last=False)

    def clear(self) -> None:
        """A new identity: every request of the old one is over."""
        for request_id in list(self.requests):
            self.forget(request_id)
        self._unsent.clear()
