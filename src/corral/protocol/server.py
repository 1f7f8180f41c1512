"""The coordinator's end of one runner socket: ``ServerSession``, a pure state machine.

    awaiting_init ──ToServerInit──▶ registering ──registered()──▶ active
          │                              │                          │ ToServerStopping
          │                              │                          ▼
          │                              │                        draining
          │                              │                          │
          └──────────────────────────────┴──────────────────────────┴──▶ closed
      init timeout, protocol error (anything but Init first, a second Init), evict(), stop(),
      leave(), runner lost (no frame for the lost threshold)

The session never touches the store: it asks (``Register``, ``Apply``, ``CommandsAcked``,
``Alive``, ``Stopping``) and the pump reports back (``registered``, ``applied``). Events are
acknowledged only once their effect is committed, so a crash between the two makes the
runner replay them, and the index check drops whatever was already applied. To a runner
whose Init says ``acks_in_commands`` the acknowledgement may ride in the Commands frame the
pump sends in the same step (``applied(hold=True)``, then ``release_ack``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, assert_never

from corral.errors import IllegalTransition
from corral.ids import RunnerId
from corral.protocol import messages as wire
from corral.protocol.outputs import (
    Alive,
    Apply,
    Close,
    CommandsAcked,
    KvRequested,
    Register,
    Send,
    ServerOutput,
    Stopping,
    Tunnelled,
)


class SessionState(enum.StrEnum):
    AWAITING_INIT = "awaiting_init"
    REGISTERING = "registering"  # the pump is looking the runner up in the store
    ACTIVE = "active"
    DRAINING = "draining"
    CLOSED = "closed"


S = SessionState
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    S.AWAITING_INIT: frozenset({S.REGISTERING, S.CLOSED}),
    S.REGISTERING: frozenset({S.ACTIVE, S.CLOSED}),
    S.ACTIVE: frozenset({S.DRAINING, S.CLOSED}),
    S.DRAINING: frozenset({S.CLOSED}),
    S.CLOSED: frozenset(),
}
_OPEN = (S.ACTIVE, S.DRAINING)  # registered: commands and events flow
_STARTING = (S.AWAITING_INIT, S.REGISTERING)
del S
_TUNNEL = (
    wire.ToServerResponseStart,
    wire.ToServerResponseChunk,
    wire.ToServerResponseEnd,
    wire.ToServerResponseAbort,
    wire.ToServerTunnelAck,
)


def _by_idx(items: Sequence[wire.Indexed], above: int) -> list[wire.Indexed]:
    """Items with idx > ``above``, once each, in idx order."""
    return sorted({item.idx: item for item in items if item.idx > above}.values(), key=_idx)


def _idx(item: wire.Indexed) -> int:
    return item.idx


class ServerSession:
    """A ``ProtocolError`` from ``decode`` goes to ``receive_error``; a ``Close`` output means
    close the socket with that code and reason once the ``Send`` outputs before it are out."""

    def __init__(
        self,
        now: float,
        *,
        init_timeout_s: float = 5.0,
        lost_threshold_s: float = 15.0,
        ping_interval_s: float = 3.0,
        ack_interval_s: float = 300.0,
        tunnel_end: str | None = None,
    ) -> None:
        self._state = SessionState.AWAITING_INIT
        self._init_deadline = now + init_timeout_s
        self._lost_threshold_s = lost_threshold_s
        self.metadata: dict[str, object] = {
            "runner_lost_threshold": lost_threshold_s,
            "ping_interval": ping_interval_s,
            "ack_interval": ack_interval_s,
            # It joins a WebSocket message sent in parts, takes a response whole in its start.
            "tunnel": wire.TUNNEL_WHOLE,
            # It takes reports of attempts a former identity of the runner held
            # (``former_runner_id``): finished work reported late is not run again.
            wire.LATE_REPORTS: 1,
        }
        if tunnel_end is not None:  # this coordinator's end of its runners' tunnels
            self.metadata[wire.TUNNEL_END] = tunnel_end
        self._init: wire.ToServerInit | None = None
        self._runner_id: RunnerId | None = None
        self._last_seen = now
        self._applied_idx = 0  # events committed by the pump (``applied``)
        self._handed_out_idx = 0  # highest event idx in an ``Apply``; >= _applied_idx
        self._acked_command_idx = 0
        # Events committed whose acknowledgement waits for the Commands frame about to go
        # (``applied(hold=True)``): 0 when none does. Only for a runner that reads one there.
        self._ack_held = 0
        self._acks_in_commands = False
        # Until ``registered``, pushes and a drain wait here: the pump's store lookup may
        # have missed a command stored after it.
        self._queued: list[wire.Indexed] = []
        self._queued_drain: float | None = None
        self.gaps = 0  # events that skipped an index (a runner that restarted its numbering)

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def runner_id(self) -> RunnerId | None:
        return self._runner_id

    @property
    def init(self) -> wire.ToServerInit | None:
        return self._init

    @property
    def last_applied_event_idx(self) -> int:
        return self._applied_idx

    def receive(self, message: wire.ToServerMessage, now: float) -> list[ServerOutput]:
        if self._state is SessionState.CLOSED:
            return []  # frames still in flight after we decided to close
        # Any frame shows the runner is alive; only pings are reported as heartbeats.
        self._last_seen = now
        if self._state is SessionState.AWAITING_INIT:
            if not isinstance(message, wire.ToServerInit):
                return self._protocol_error(wire.EXPECTED_INIT)
            if not 1 <= message.protocol_version <= wire.PROTOCOL_VERSION:
                return self._protocol_error(wire.UNSUPPORTED_VERSION)
            self._init = message
            self._acks_in_commands = message.metadata.get(wire.ACKS_IN_COMMANDS) == 1
            self._move(SessionState.REGISTERING)
            return [Register(message)]
        if isinstance(message, wire.ToServerInit):
            return self._protocol_error(wire.DUPLICATE_INIT)
        if self._state is SessionState.REGISTERING:
            # The runner sends nothing before our ToClientInit: it does not know its id yet.
            return self._protocol_error(wire.UNEXPECTED_MESSAGE)
        if isinstance(message, wire.ToServerEvents):
            return self._on_events(message)
        if isinstance(message, wire.ToServerAckCommands):
            if message.last_command_idx <= self._acked_command_idx:
                return []
            self._acked_command_idx = message.last_command_idx
            return [CommandsAcked(message.last_command_idx)]
        if isinstance(message, wire.ToServerPing):
            return [Send(wire.ToClientPong(message.ts)), Alive(now)]
        if isinstance(message, wire.ToServerStopping):
            if self._state is SessionState.DRAINING:
                return []
            self._move(SessionState.DRAINING)
            return [Stopping()]
        if isinstance(message, wire.ToServerKvRequest):
            return [
                KvRequested(message.request_id, message.actor_id, message.op, message.generation)
            ]
        if isinstance(message, _TUNNEL):
            return [Tunnelled(message)]
        assert_never(message)

    def receive_error(self, error: wire.ProtocolError) -> list[ServerOutput]:
        return [] if self._state is SessionState.CLOSED else self._protocol_error(error.code)

    def registered(
        self,
        runner_id: RunnerId,
        last_event_idx: int,
        unacked_commands: Sequence[wire.Indexed],
        now: float,
    ) -> list[ServerOutput]:
        """The store knows the runner: greet it, then send what it has not acknowledged."""
        if self._state is SessionState.CLOSED:
            return []  # closed while the store was busy (timeout, eviction)
        self._move(SessionState.ACTIVE)
        assert self._init is not None  # set on the way to REGISTERING
        self._runner_id = runner_id
        self._applied_idx = self._handed_out_idx = last_event_idx
        self._last_seen = now
        # Commands the runner says it already has are skipped, if it keeps its identity.
        same = self._init.runner_id == runner_id
        floor = self._init.last_command_idx if same else 0
        commands = _by_idx([*unacked_commands, *self._queued], floor)
        self._queued = []
        out: list[ServerOutput] = [
            Send(wire.ToClientInit(runner_id, last_event_idx, dict(self.metadata)))
        ]
        if commands:
            out.append(Send(wire.ToClientCommands(tuple(commands))))
        if self._queued_drain is not None:
            out.append(Send(wire.ToClientDrain(self._queued_drain)))
            self._queued_drain = None
        return out

    def applied(self, last_idx: int, *, hold: bool = False) -> list[ServerOutput]:
        """Events up to ``last_idx`` are committed: now (and only now) acknowledge them.

        ``hold``: the pump is about to send commands (``push``) in this same step: if the
        runner reads acknowledgements there, this one goes in that frame, not a frame of its
        own. The pump then calls ``release_ack``, which sends it alone if no commands took
        it: an acknowledgement is never held past the step that holds it."""
        if self._state is SessionState.CLOSED:
            return []  # the runner replays them on its next socket; the store drops them
        if self._state not in _OPEN or last_idx > self._handed_out_idx:
            raise IllegalTransition(f"applied({last_idx}): no such Apply was handed out")
        if last_idx <= self._applied_idx:
            return []
        self._applied_idx = last_idx
        if hold and self._acks_in_commands:
            self._ack_held = last_idx
            return []
        return [Send(wire.ToClientAckEvents(last_idx))]

    def release_ack(self) -> list[ServerOutput]:
        """The acknowledgement ``applied(hold=True)`` held, if no Commands frame took it."""
        held, self._ack_held = self._ack_held, 0
        if not held or self._state not in _OPEN:
            return []  # closed: the runner replays those events; the store drops them
        return [Send(wire.ToClientAckEvents(held))]

    def kv_answered(self, request_id: int, result: dict[str, Any]) -> list[ServerOutput]:
        """A KV operation is done (committed, for a write): answer it. On a closed socket
        the answer is lost; the runner sends the request again on its next socket."""
        if self._state not in _OPEN:
            return []
        return [Send(wire.ToClientKvResponse(request_id, result))]

    def push(self, commands: Sequence[wire.Indexed]) -> list[ServerOutput]:
        """Commands the pump has stored durably; sent now, or after ``registered``."""
        if self._state in _STARTING:
            self._queued.extend(commands)
            return []
        if self._state is SessionState.CLOSED or not commands:
            return []  # the runner gets them on its next Init, as unacknowledged commands
        held, self._ack_held = self._ack_held, 0
        return [Send(wire.ToClientCommands(tuple(commands), held))]

    def drain(self, grace_s: float) -> list[ServerOutput]:
        """Forced shutdown: ask the runner to stop its work within ``grace_s``."""
        if self._state in _STARTING:
            self._queued_drain = grace_s
            return []
        if self._state is SessionState.CLOSED:
            return []
        return [Send(wire.ToClientDrain(grace_s))]

    def evict(self) -> list[ServerOutput]:
        """A newer socket of the same runner took over: this one must not reconnect."""
        return self._goodbye(wire.REASON_EVICTED)

    def stop(self) -> list[ServerOutput]:
        """The runner is stopped (its drain is over): it must not reconnect."""
        return self._goodbye(wire.REASON_STOPPED)

    def leave(self) -> list[ServerOutput]:
        """The coordinator stops (SIGTERM): the runner moves to another one at once, its
        runs kept, or holds on until this one is back."""
        if self._state is SessionState.CLOSED:
            return []
        reason = wire.REASON_COORDINATOR_LEAVING
        return [Send(wire.ToClientClose(reason)), *self._close(wire.CLOSE_GOING_AWAY, reason)]

    def tick(self, now: float) -> list[ServerOutput]:
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return []
        if self._state is SessionState.AWAITING_INIT:
            return self._close(wire.CLOSE_POLICY_VIOLATION, wire.REASON_INIT_TIMEOUT)
        return self._close(wire.CLOSE_GOING_AWAY, wire.REASON_RUNNER_LOST)

    @property
    def lost_threshold_s(self) -> float:
        return self._lost_threshold_s

    def next_deadline(self) -> float | None:
        if self._state is SessionState.AWAITING_INIT:
            return self._init_deadline
        if self._state in _OPEN:
            return self._last_seen + self._lost_threshold_s
        return None  # registering: the store's time, not the runner's; closed: nothing

    def _move(self, new: SessionState) -> None:
        if new not in TRANSITIONS[self._state]:
            raise IllegalTransition(f"runner session cannot go from {self._state} to {new}")
        self._state = new

    def _on_events(self, message: wire.ToServerEvents) -> list[ServerOutput]:
        # Drop what is applied or already handed out in an Apply not yet confirmed: the
        # runner replays everything unacknowledged after a reconnect.
        new = _by_idx(message.events, self._handed_out_idx)
        if not new:
            return []
        previous = self._handed_out_idx
        for event in new:
            if event.idx > previous + 1:
                self.gaps += 1
            previous = event.idx
        self._handed_out_idx = previous
        return [Apply(tuple(new))]

    def _protocol_error(self, code: str) -> list[ServerOutput]:
        return self._close(wire.CLOSE_POLICY_VIOLATION, wire.protocol_error_reason(code))

    def _goodbye(self, reason: str) -> list[ServerOutput]:
        if self._state is SessionState.CLOSED:
            return []
        return [Send(wire.ToClientClose(reason)), *self._close(wire.CLOSE_NORMAL, reason)]

    def _close(self, code: int, reason: str) -> list[ServerOutput]:
        self._move(SessionState.CLOSED)
        return [Close(code, reason)]
