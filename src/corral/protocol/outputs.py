"""What the protocol's state machines ask their pump to do: tagged dataclasses, one per effect.

    RunnerConnection → Send[ToServerMessage] · Execute · Connected · Disconnected · Reconnect
                       · StopAllWork · DrainRequested · Closed · KvAnswered · TunnelReceived
                       · TunnelAcked
    ServerSession    → Send[ToClientMessage] · Close · Register · Apply · CommandsAcked
                       · Alive · Stopping · KvRequested · Tunnelled

The pump carries them out in list order: an ``Apply`` before a ``Send`` means store first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from corral.ids import RunnerId
from corral.protocol.messages import (
    Indexed,
    ToClientMessage,
    ToClientRequestAbort,
    ToClientRequestChunk,
    ToClientRequestEnd,
    ToClientRequestStart,
    ToServerInit,
    ToServerMessage,
    ToServerTunnel,
)

M = TypeVar("M", covariant=True)


@dataclass(frozen=True, slots=True)
class Send(Generic[M]):
    """Write ``message`` (encoded with ``messages.encode``) to the socket."""

    message: M


# ---- the runner's end ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Execute:
    command: Indexed  # a new command for the app; each index is executed once


@dataclass(frozen=True, slots=True)
class Connected:
    runner_id: RunnerId
    fresh: bool  # a new identity: the first connect, or the coordinator replaced our id
    # Late reports carried over from the former identity: (its event index, the new one).
    # Every other event of the former identity is dropped.
    carried: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Disconnected:
    pass  # no usable link now; a Reconnect follows after the backoff


@dataclass(frozen=True, slots=True)
class Reconnect:
    pass  # time to open a socket again, then call ``connect``


@dataclass(frozen=True, slots=True)
class StopAllWork:
    pass  # the coordinator has reclaimed our runs: stop them so that no run runs twice


@dataclass(frozen=True, slots=True)
class DrainRequested:
    grace_s: float  # the coordinator asks for a forced shutdown within this grace


@dataclass(frozen=True, slots=True)
class Closed:
    reason: str
    reconnect: bool  # False: evicted, stopped or shut down, this connection is over


@dataclass(frozen=True, slots=True)
class KvAnswered:
    """The answer to ``kv_request(...)`` number ``request_id`` (``{"ok": bool, ...}``)."""

    request_id: int
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TunnelReceived:
    """A new tunnel message for the runner's tunnel (each exactly once, in order)."""

    message: ToClientRequestStart | ToClientRequestChunk | ToClientRequestEnd | ToClientRequestAbort


@dataclass(frozen=True, slots=True)
class TunnelAcked:
    request_id: str  # the coordinator consumed some of it: there may be room to send more


@dataclass(frozen=True, slots=True)
class TunnelDropped:
    """The runner connected to another coordinator than the last (``wire.TUNNEL_WITH``): the
    last one's tunnelled requests are over here (their answers could not reach who asked)."""


RunnerOutput = (
    Send[ToServerMessage]
    | Execute
    | Connected
    | Disconnected
    | Reconnect
    | StopAllWork
    | DrainRequested
    | Closed
    | KvAnswered
    | TunnelReceived
    | TunnelAcked
    | TunnelDropped
)


# ---- the coordinator's end -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Close:
    code: int  # WebSocket close code: 1000 normal, 1001 going away, 1008 policy violation
    reason: str


@dataclass(frozen=True, slots=True)
class Register:
    """Look up or create the runner, then call ``ServerSession.registered``."""

    init: ToServerInit


@dataclass(frozen=True, slots=True)
class Apply:
    """Commit these new events (in order), then call ``ServerSession.applied``."""

    events: tuple[Indexed, ...]


@dataclass(frozen=True, slots=True)
class CommandsAcked:
    last_command_idx: int  # persist: commands up to here need not be sent again


@dataclass(frozen=True, slots=True)
class Alive:
    now: float  # a ping arrived: the runner's heartbeat


@dataclass(frozen=True, slots=True)
class Stopping:
    pass  # the runner shuts down gracefully: mark it draining


@dataclass(frozen=True, slots=True)
class KvRequested:
    """Do this KV operation, then call ``ServerSession.kv_answered`` with its result."""

    request_id: int
    actor_id: str
    op: dict[str, Any]
    generation: int | None = None  # the generation that asked, if the runner said


@dataclass(frozen=True, slots=True)
class Tunnelled:
    """A tunnel message from the runner, for the coordinator's tunnel (which orders them:
    its numbering spans the runner's sockets)."""

    message: ToServerTunnel


ServerOutput = (
    Send[ToClientMessage]
    | Close
    | Register
    | Apply
    | CommandsAcked
    | Alive
    | Stopping
    | KvRequested
    | Tunnelled
)
