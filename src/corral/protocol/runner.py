"""The runner's end of the link: ``RunnerConnection``, a pure state machine (seed 000).

    idle ──connect──▶ connecting ──ToClientInit──▶ active
                        │    ▲                       │
     socket_closed /    │    └────connect────┐       │ socket_closed,
     connect_failed     ▼                    │       │ ToClientClose(other reason)
                      disconnected ◀─────────┴───────┘
                        (tick: Reconnect after the backoff; at once after
                         ToClientClose(coordinator_leaving), then often)
    any ──ToClientClose(evicted | stopped), shutdown──▶ closed (terminal)

Every method takes the time and returns outputs for the pump to carry out. Events are
numbered per runner from 1 and kept until the coordinator acknowledges them, so they survive
any number of reconnects; commands are executed once each, by index.

The runner holds its runs on a lease: the coordinator declares it lost (and runs its runs
elsewhere) once it has heard nothing for the lost threshold, counted from the last ping
it read or the last Init it answered. So once disconnected, the runner counts from the
same moments as it can see them — when it sent its last answered ping (the Pong echoes
it) or its answered Init — not from when it noticed the disconnection, which may be later;
when that runs out it outputs StopAllWork. Its identity is then spent: the next Init
presents none, so the coordinator registers a new runner and takes back what the old
identity held — had it kept its id, runs it stopped would stay assigned to it forever.
(Both found by tests/sim: counting from the disconnection ran runs twice.)

Work finished before the lease ran out is not lost with the identity: the final reports
still unacknowledged (and the other events of their attempts: logs, session, steps) are
carried over to the new identity, numbered after its Init, each naming the identity that
held its attempt (``former_runner_id``). The coordinator takes such a late report while
its run still waits for that attempt, unclaimed since (``corral.store.claims``): a run
whose work was done is not run again. The Init announces how many final reports follow
(``late_reports_to_send``): until they are applied, the new identity claims nothing — it
would claim back the very runs they end. Only to a coordinator whose Init says
``late_reports``: an older one would refuse the field (and the events die as before). No
other event is carried: the runs the lease ended were stopped and report nothing more.

The lease is enforced while a socket is open too: a half-open socket (the coordinator's
end vanished without a reset) looks open but carries nothing. When no Pong has come back
for the *silence window*, the runner drops that socket and reconnects; if it cannot get
back in, it stops all work ``stop_margin_s`` before the lease ends, so that its processes
are gone (SIGTERM, grace, SIGKILL) by the time the coordinator can give their runs away.

KV requests (an actor's durable state) wait while disconnected and are sent again after
every Init until answered: an answer lost with a socket is asked for again. When the work
stops (the lease ran out, or a new identity), the requests still waiting fail instead
(``lease_lost``): a write buffered by an actor that has since moved to another runner
must never land late on top of what the new placement wrote.

Tunnelled requests (the gateway's, for actors) are numbered per request in a
``TunnelLedger``: what the runner sends back is kept until acknowledged, waits while
disconnected and goes again after every Init; what the coordinator sends is delivered
once each, in order (``TunnelReceived``). When the work stops they are over: the actors
they were for are stopped.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterable
from typing import Any, assert_never

from corral.backoff import backoff_delay
from corral.errors import IllegalTransition
from corral.ids import RunnerId
from corral.protocol import messages as wire
from corral.protocol.limits import MAX_BATCH_EVENTS
from corral.protocol.outputs import (
    Closed,
    Connected,
    Disconnected,
    DrainRequested,
    Execute,
    KvAnswered,
    Reconnect,
    RunnerOutput,
    Send,
    StopAllWork,
    TunnelAcked,
    TunnelDropped,
    TunnelReceived,
)
from corral.protocol.replay import ReplayBuffer
from corral.protocol.tunnel import Receipt, TunnelLedger

# What the runner's tunnel sends (acknowledgements are not kept: they are repeated instead).
TunnelReply = (
    wire.ToServerResponseStart
    | wire.ToServerResponseChunk
    | wire.ToServerResponseEnd
    | wire.ToServerResponseAbort
)


# A retry on another coordinator, or one close to the end of the lease, waits this long.
RETRY_ELSEWHERE_S = 0.1
# The coordinator said it stops (a deploy, ``REASON_COORDINATOR_LEAVING``): the runner
# moves to the next at once, and while none answers it tries this often, so that it is
# back within this of a coordinator's return rather than after a growing backoff.
HOLD_ON_RETRY_S = 0.25


class ConnectionState(enum.StrEnum):
    IDLE = "idle"
    CONNECTING = "connecting"
    ACTIVE = "active"
    DISCONNECTED = "disconnected"
    CLOSED = "closed"


S = ConnectionState
TRANSITIONS: dict[ConnectionState, frozenset[ConnectionState]] = {
    S.IDLE: frozenset({S.CONNECTING, S.CLOSED}),
    S.CONNECTING: frozenset({S.ACTIVE, S.DISCONNECTED, S.CLOSED}),
    S.ACTIVE: frozenset({S.DISCONNECTED, S.CLOSED}),
    S.DISCONNECTED: frozenset({S.CONNECTING, S.CLOSED}),
    S.CLOSED: frozenset(),
}
_LINKED = (S.CONNECTING, S.ACTIVE)  # a socket is open (or opening)
del S
_TUNNEL = (
    wire.ToClientRequestStart,
    wire.ToClientRequestChunk,
    wire.ToClientRequestEnd,
    wire.ToClientRequestAbort,
    wire.ToClientTunnelAck,
    wire.ToClientTunnelAcks,
)


def late_reports(events: Iterable[wire.Indexed], holder: RunnerId) -> list[wire.Indexed]:
    """Of a former identity's unacknowledged ``events``, those to carry to the new one:
    each final report and the events of its attempt before it, in order, marked as
    ``holder``'s (or as an earlier holder's, when they were carried before)."""
    events = list(events)
    finished = {_attempt_of(e.body) for e in events if e.body.get("type") == "finished"}
    return [
        wire.Indexed(
            e.idx, {**e.body, "former_runner_id": e.body.get("former_runner_id") or holder}
        )
        for e in events
        if _attempt_of(e.body) in finished
    ]


def _attempt_of(body: dict[str, Any]) -> tuple[Any, Any]:
    return body.get("run_id"), body.get("attempt")


def _takes_late_reports(metadata: dict[str, Any]) -> bool:
    version: Any = metadata.get(wire.LATE_REPORTS)
    return type(version) is int and version >= 1


def _seconds(metadata: dict[str, Any], key: str, default: float) -> float:
    value: Any = metadata.get(key)
    if type(value) in (int, float) and math.isfinite(value) and value > 0:
        return float(value)
    return default


class RunnerConnection:
    """One runner process's link, across every socket it opens. A ``ProtocolError`` from
    ``receive`` means: close that socket (1008) and report ``socket_closed``."""

    def __init__(
        self,
        *,
        name: str,
        version: str,
        total_slots: int,
        labels: Iterable[str],
        metadata: dict[str, Any],
        rng: random.Random,
        max_backoff_s: float = 30.0,
        default_lost_threshold_s: float = 15.0,
        default_ping_interval_s: float = 3.0,
        default_ack_interval_s: float = 300.0,
        max_batch_events: int = MAX_BATCH_EVENTS,
        stop_margin_s: float = 0.0,
        actor_names: Iterable[str] = (),
        pool: str = "default",
        actor_slots: int = 0,
        addresses: int = 1,
    ) -> None:
        # It reads acknowledgements in Commands frames too (``ACKS_IN_COMMANDS``).
        metadata = {**metadata, wire.ACKS_IN_COMMANDS: 1}
        self._hello = (name, version, total_slots, tuple(labels), metadata)
        # Coordinators it may reach, tried in turn (the pump's, which updates it: a name may
        # resolve to more or fewer from one round to the next).
        self.addresses = addresses
        self._hosting = (tuple(actor_names), pool, actor_slots)
        self._rng = rng
        self._max_backoff_s = max_backoff_s
        self._stop_margin_s = stop_margin_s
        self._defaults = (default_lost_threshold_s, default_ping_interval_s, default_ack_interval_s)
        self.lost_threshold_s, self.ping_interval_s, self.ack_interval_s = self._defaults
        self.coordinator_tunnel = 0  # what its Init says in ``metadata.tunnel`` (TUNNEL_…)
        self._state = ConnectionState.IDLE
        self._runner_id: RunnerId | None = None
        self._last_command_idx = 0
        self._acked_command_idx: int | None = None  # None: ack at the next tick (just connected)
        self._events = ReplayBuffer(max_batch=max_batch_events)
        self._kv: dict[int, wire.ToServerKvRequest] = {}  # sent or not, until answered
        self._kv_ids = 0
        self._tunnel: TunnelLedger[TunnelReply, wire.ToServerTunnelAck] = TunnelLedger(
            wire.ToServerTunnelAck
        )
        # The coordinator's end of the tunnel the last Init came from (``wire.TUNNEL_END``;
        # "" for a coordinator that names none); None before the first.
        self._tunnel_with: str | None = None
        self._attempt = 0  # failed attempts since the last successful Init
        self._draining = False
        self._holding_on = False  # the coordinator said it stops: retry often, not backing off
        self._stopping_sent = False  # on the current socket
        self._work_stopped = False  # StopAllWork was output since the last successful Init
        self._connect_at = 0.0  # when the current socket's Init was sent
        self._lease_at: float | None = None  # the coordinator had heard from us at this time
        self._init_answered_at = 0.0  # when the current socket's ToClientInit came
        # Timers as absolute deadlines; None when not running.
        self._ping_at: float | None = None
        self._ack_at: float | None = None
        self._reconnect_at: float | None = None
        self._lost_at: float | None = None
        # The work stopped with its final reports unsent: until when the coordinator keeps
        # their runs waiting for them (``corral.store.reconcile``: the grace of a lost last
        # attempt, our threshold counted again from when it found us lost).
        self._reports_wanted_until: float | None = None
        self.gaps = 0  # commands that skipped an index: only a coordinator bug causes one
        self.rtt: float | None = None

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def runner_id(self) -> RunnerId | None:
        return self._runner_id

    @property
    def last_command_idx(self) -> int:
        return self._last_command_idx

    @property
    def unacked_events(self) -> tuple[wire.Indexed, ...]:
        return self._events.pending

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def draining(self) -> bool:
        return self._draining

    def connect(self, now: float) -> list[RunnerOutput]:
        self._move(ConnectionState.CONNECTING)
        self._connect_at = now
        self._reconnect_at = None
        self._stopping_sent = False
        name, version, slots, labels, metadata = self._hello
        spent = self._work_stopped  # this identity is spent: see the top
        runner_id, last_command_idx = (
            (None, 0) if spent else (self._runner_id, self._last_command_idx)
        )
        if spent and self._runner_id is not None:
            # Announced, so that the new identity claims nothing before they are applied:
            # it could otherwise claim again a run whose late report says it is done.
            finals = self._final_reports()
            if finals:
                metadata = {**metadata, wire.LATE_REPORTS_TO_SEND: finals}
        if self._tunnel_with is not None and metadata.get("tunnel"):  # it takes requests
            metadata = {**metadata, wire.TUNNEL_WITH: self._tunnel_with}
        init = wire.ToServerInit(
            name, version, wire.PROTOCOL_VERSION, slots, last_command_idx, runner_id,
            labels, metadata, *self._hosting,
        )  # fmt: skip
        return [Send(init)]

    def socket_closed(self, now: float) -> list[RunnerOutput]:
        # Idempotent: the pump reports a close after a ToClientClose we already handled.
        return self._lose_link(now) if self._state in _LINKED else []

    def connect_failed(self, now: float) -> list[RunnerOutput]:
        return self.socket_closed(now)

    def send_event(self, body: dict[str, Any], now: float) -> list[RunnerOutput]:
        return self.send_events((body,), now)

    def send_events(self, bodies: Iterable[dict[str, Any]], now: float) -> list[RunnerOutput]:
        batch = self._events.append(bodies)
        if self._state is not ConnectionState.ACTIVE:
            return []  # kept for the replay after the next Init
        return [Send(frame) for frame in self._events.frames(batch)]

    @property
    def pending_kv(self) -> tuple[int, ...]:
        return tuple(self._kv)

    def kv_request(
        self, actor_id: str, op: dict[str, Any], now: float, *, generation: int | None = None
    ) -> tuple[int, list[RunnerOutput]]:
        """Ask for a KV operation (for that ``generation`` of the actor); its answer comes
        as ``KvAnswered`` with this id."""
        if self._state is ConnectionState.CLOSED:
            raise IllegalTransition("the runner connection is closed for good")
        self._kv_ids += 1
        request = wire.ToServerKvRequest(self._kv_ids, actor_id, dict(op), generation)
        self._kv[request.request_id] = request
        return request.request_id, [Send(request)] if self._state is ConnectionState.ACTIVE else []

    # ---- the tunnel ----------------------------------------------------------------------

    def tunnel_send(self, message: TunnelReply, now: float) -> list[RunnerOutput]:
        """Send a tunnel message (its ``seq`` is given here); kept until acknowledged."""
        if self._state is ConnectionState.CLOSED:
            return []
        self._tunnel.send(message)
        return self._tunnel_flush()

    def tunnel_room(self, request_id: str) -> int:
        """Bytes that may be sent for ``request_id`` before the coordinator consumes some."""
        return self._tunnel.room(request_id)

    def tunnel_consumed(
        self, request_id: str, seq: int, nbytes: int, now: float, *, final: bool = False
    ) -> list[RunnerOutput]:
        """Tunnel message ``seq`` was carried out: acknowledge it, a quarter window at a time."""
        ack = self._tunnel.consumed(request_id, seq, nbytes, final=final)
        return [Send(ack)] if ack is not None and self._state is ConnectionState.ACTIVE else []

    def tunnel_forget(self, request_id: str) -> None:
        """The request is over here (its last message acknowledged, or given up)."""
        self._tunnel.forget(request_id)

    def tunnel_unacknowledged(self, request_id: str) -> int:
        return len(self._tunnel.kept(request_id))

    def _tunnel_flush(self) -> list[RunnerOutput]:
        if self._state is not ConnectionState.ACTIVE:
            return []  # sent again after the next Init
        return [Send(message) for message in self._tunnel.take_unsent()]

    def _on_tunnel(self, message: wire.ToClientTunnel) -> list[RunnerOutput]:
        if isinstance(message, wire.ToClientTunnelAck):
            self._tunnel.acknowledge(message.request_id, message.seq)
            return [TunnelAcked(message.request_id)]
        if isinstance(message, wire.ToClientTunnelAcks):
            for request_id, seq in message.acks:
                self._tunnel.acknowledge(request_id, seq)
            return [TunnelAcked(request_id) for request_id, _ in message.acks]
        opening = isinstance(message, wire.ToClientRequestStart)
        receipt = self._tunnel.receive(message.request_id, message.seq, opening=opening)
        if receipt is Receipt.NEW:
            return [TunnelReceived(message)]
        if receipt is Receipt.GAP:
            raise wire.ProtocolError(
                wire.TUNNEL_GAP, f"tunnel message {message.seq} of {message.request_id} skipped one"
            )
        if receipt is Receipt.ORPHAN:  # a request this runner does not hold: stop its sending
            return [Send(self._tunnel.orphan_ack(message.request_id, message.seq))]
        ack = self._tunnel.duplicate_ack(message.request_id)
        return [] if ack is None else [Send(ack)]

    def stopping(self, now: float) -> list[RunnerOutput]:
        """Graceful shutdown begins; told to every coordinator we talk to from now on."""
        self._draining = True
        if self._state is not ConnectionState.ACTIVE or self._stopping_sent:
            return []
        self._stopping_sent = True
        return [Send(wire.ToServerStopping())]

    def shutdown(self, now: float) -> list[RunnerOutput]:
        """Work is done: close (code 1000, ``corral.runner_shutdown``) and never reconnect."""
        if self._state is ConnectionState.CLOSED:
            return []
        out: list[RunnerOutput] = []
        if self._state is ConnectionState.ACTIVE and not self._stopping_sent:
            out.append(Send(wire.ToServerStopping()))  # seed: "if not sent"
        return [*out, *self._close(wire.REASON_RUNNER_SHUTDOWN)]

    def receive(self, message: wire.ToClientMessage, now: float) -> list[RunnerOutput]:
        if self._state not in _LINKED:
            return []  # a late frame from a socket we have already given up on
        if isinstance(message, wire.ToClientClose):
            if message.reason in (wire.REASON_EVICTED, wire.REASON_STOPPED):
                return self._close(message.reason)
            leaving = message.reason == wire.REASON_COORDINATOR_LEAVING
            return [Closed(message.reason, reconnect=True), *self._lose_link(now, leaving)]
        if isinstance(message, wire.ToClientInit):
            if self._state is ConnectionState.ACTIVE:
                raise wire.ProtocolError(wire.DUPLICATE_INIT, "a second ToClientInit on one socket")
            if self._work_stopped and message.runner_id == self._runner_id:
                # Our Init left before the lease ran out; the answer keeps the identity whose
                # runs we have stopped since: they would stay assigned to it. Drop this link;
                # the next Init presents no identity.
                raise wire.ProtocolError(
                    wire.UNEXPECTED_MESSAGE, "ToClientInit for an identity this runner gave up"
                )
            return self._on_init(message, now)
        if self._state is ConnectionState.CONNECTING:
            raise wire.ProtocolError(
                wire.EXPECTED_INIT, f"{type(message).__name__} before ToClientInit"
            )
        if isinstance(message, wire.ToClientCommands):
            return self._on_commands(message)
        if isinstance(message, wire.ToClientAckEvents):
            self._events.acknowledge(message.last_event_idx)
            return []
        if isinstance(message, wire.ToClientPong):
            self.rtt = max(0.0, now - message.ts)
            self._lease_at = max(self._lease_at or message.ts, message.ts)
            return []
        if isinstance(message, wire.ToClientDrain):
            return [DrainRequested(message.grace_s)]
        if isinstance(message, wire.ToClientKvResponse):
            if self._kv.pop(message.request_id, None) is None:
                return []  # answered already (asked twice across a reconnect), or failed
            return [KvAnswered(message.request_id, message.result)]
        if isinstance(message, _TUNNEL):
            return self._on_tunnel(message)
        assert_never(message)

    @property
    def lease_s(self) -> float:
        """How long after the coordinator last heard from us we still own our runs:
        the lost threshold less the margin that stopping takes (at most a third of it)."""
        return self.lost_threshold_s - min(self._stop_margin_s, self.lost_threshold_s / 3)

    @property
    def silence_s(self) -> float:
        """No answer for this long on an open socket: it is dead, drop it. Long enough for
        two pings to go unanswered, short enough to reconnect before the lease ends."""
        return max(2 * self._ping_every_s(), self.lease_s / 2)

    def _ping_every_s(self) -> float:
        # Never so rarely that a healthy link looks silent (a misconfigured coordinator).
        return min(self.ping_interval_s, self.lease_s / 3)

    def _silent_at(self) -> float | None:
        if self._state not in _LINKED:
            return None
        if self._state is ConnectionState.CONNECTING:
            heard = self._connect_at
        else:
            # A socket just up is silent for no longer than since its Init was answered:
            # the lease counts from when the Init was sent, but a slow answer (a loaded
            # coordinator) must not leave the first ping too little time to come back.
            heard = max(self._lease_at or 0.0, self._init_answered_at)
        return heard + self.silence_s

    def tick(self, now: float) -> list[RunnerOutput]:
        out: list[RunnerOutput] = []
        silent_at = self._silent_at()
        if silent_at is not None and now >= silent_at:
            # Half-open, or a coordinator too stuck to answer: either way it may stop
            # hearing us. Drop the socket (the pump closes it) and try another.
            reason = f"no answer from the coordinator for {self.silence_s:g} s"
            out += [Closed(reason, reconnect=True), *self._lose_link(now)]
        if self._state is ConnectionState.ACTIVE:
            if self._ping_at is not None and now >= self._ping_at:
                out.append(Send(wire.ToServerPing(now)))
                self._ping_at = now + self._ping_every_s()
            if self._ack_at is not None and now >= self._ack_at:
                acked = self._acked_command_idx
                if acked is None or self._last_command_idx > acked:
                    out.append(Send(wire.ToServerAckCommands(self._last_command_idx)))
                    self._acked_command_idx = self._last_command_idx
                self._ack_at = now + self.ack_interval_s
        if self._lost_at is not None and now >= self._lost_at:
            # The lease ran out: the coordinator may be giving our runs to others by now.
            out += [StopAllWork(), *self._fail_kv()]
            self._tunnel.clear()
            # The coordinator found us lost a threshold after it last heard us (no sooner
            # than ``_lease_at``), and waits as long again for the final reports.
            self._reports_wanted_until = (self._lease_at or now) + 2 * self.lost_threshold_s
            self._lost_at = None
            self._work_stopped = True
            # The quick attempts that fitted in the lease are not a backoff's rounds: with
            # no lease to keep, the backoff starts over (1 s, 2 s …), not at its cap.
            self._attempt = 0
            self._holding_on = False
        if self._reconnect_at is not None and now >= self._reconnect_at:
            out.append(Reconnect())
            self._reconnect_at = None
        return out

    def next_deadline(self) -> float | None:
        timers = (self._ping_at, self._ack_at, self._reconnect_at, self._lost_at, self._silent_at())
        return min((t for t in timers if t is not None), default=None)

    def _move(self, new: ConnectionState) -> None:
        if new not in TRANSITIONS[self._state]:
            raise IllegalTransition(f"runner connection cannot go from {self._state} to {new}")
        self._state = new

    def _on_init(self, message: wire.ToClientInit, now: float) -> list[RunnerOutput]:
        out: list[RunnerOutput] = []
        fresh = message.runner_id != self._runner_id
        late: list[wire.Indexed] = []
        if fresh and self._runner_id is not None:
            # The coordinator no longer knows our old identity: its runs were reclaimed (stop
            # them, if the lost timer has not already), and its unacknowledged events and
            # command numbering mean nothing to the new one. Clearing them avoids the bug of
            # a reused identity whose new events are dropped as duplicates of old indexes.
            # Only late reports of work done go on, as the old identity's (see the top).
            if not self._work_stopped:
                out += [StopAllWork(), *self._fail_kv()]
            self._tunnel.clear()
            if _takes_late_reports(message.metadata):
                late = late_reports(self._events.pending, self._runner_id)
            self._events.reset()
            self._last_command_idx = 0
        self._runner_id = message.runner_id
        meta = message.metadata
        self.lost_threshold_s = _seconds(meta, "runner_lost_threshold", self._defaults[0])
        self.ping_interval_s = _seconds(meta, "ping_interval", self._defaults[1])
        self.ack_interval_s = _seconds(meta, "ack_interval", self._defaults[2])
        tunnel = meta.get("tunnel")
        self.coordinator_tunnel = tunnel if type(tunnel) is int else 0
        end = meta.get(wire.TUNNEL_END)
        end = end if isinstance(end, str) else ""
        if self._tunnel_with is not None and end != self._tunnel_with:
            # Another coordinator (or this one restarted): the last one's requests are over
            # here; what was not sent of their answers would only be dropped by this one.
            self._tunnel.clear()
            out.append(TunnelDropped())
        self._tunnel_with = end
        self._events.skip_past(message.last_event_idx)
        self._events.acknowledge(message.last_event_idx)
        carried = self._events.append(event.body for event in late)
        self._move(ConnectionState.ACTIVE)
        out.extend(Send(frame) for frame in self._events.frames())  # seed: resend unacked
        out.extend(Send(request) for request in self._kv.values())  # and unanswered KV
        out.extend(Send(ack) for ack in self._tunnel.acks())  # and the tunnel's, both ways
        self._tunnel.rewind()
        out.extend(self._tunnel_flush())
        if self._draining:
            self._stopping_sent = True
            out.append(Send(wire.ToServerStopping()))
        self._attempt = 0
        self._holding_on = False
        self._lease_at = self._connect_at  # it registered us after our Init was sent
        self._init_answered_at = now
        self._lost_at = self._reconnect_at = self._reports_wanted_until = None
        self._work_stopped = False
        self._ping_at = now + self._ping_every_s()
        self._ack_at, self._acked_command_idx = now, None  # ack at once after a (re)connect
        moved = tuple((old.idx, new.idx) for old, new in zip(late, carried, strict=True))
        out.append(Connected(message.runner_id, fresh, moved))
        return out

    def _on_commands(self, message: wire.ToClientCommands) -> list[RunnerOutput]:
        if message.ack_events:
            self._events.acknowledge(message.ack_events)
        out: list[RunnerOutput] = []
        for command in sorted(message.commands, key=lambda c: c.idx):
            if command.idx <= self._last_command_idx:
                continue  # a duplicate, or one executed before a reconnect
            if command.idx > self._last_command_idx + 1:
                self.gaps += 1  # the coordinator resends all unacknowledged: never a loss here
            self._last_command_idx = command.idx
            out.append(Execute(command))
        return out

    def _lose_link(self, now: float, leaving: bool = False) -> list[RunnerOutput]:
        """The socket is gone. ``leaving``: the coordinator said it stops — not a failure:
        the next coordinator is tried at once (then every ``HOLD_ON_RETRY_S``)."""
        self._move(ConnectionState.DISCONNECTED)
        self._ping_at = self._ack_at = None
        # The lease runs out a threshold after the coordinator last heard from us (an
        # answered ping or Init); before we ever had an identity there is no work to lose.
        lease_at = self._lease_at
        if lease_at is not None and self._lost_at is None and not self._work_stopped:
            self._lost_at = lease_at + self.lease_s
        if leaving:
            self._holding_on = True
            self._reconnect_at = now
        else:
            self._reconnect_at = now + self._reconnect_delay(now)
            self._attempt += 1
        return [Disconnected()]

    def _reconnect_delay(self, now: float) -> float:
        """The next attempt goes to the next coordinator (the pump's turn): at once to
        another while a round of them lasts, after an exponential backoff once every one
        failed. While we hold work, attempts fit inside the lease: never more than a
        quarter of what is left of it, so they come faster as its end nears — a
        coordinator back (or another up) a second before the end still finds us trying."""
        rounds, turn = divmod(self._attempt + 1, self.addresses)
        delay = (
            RETRY_ELSEWHERE_S
            if turn
            else backoff_delay(rounds - 1, base=1.0, cap=self._max_backoff_s, rng=self._rng)
        )
        if self._lost_at is not None:
            delay = min(delay, max(RETRY_ELSEWHERE_S, (self._lost_at - now) / 4))
        elif self._reports_wanted_until is not None and self._final_reports():
            # The work stopped, but a report of how a run ended waits to be sent: its run
            # waits for it until the coordinator's grace ends. The attempts fit in that too
            # (else a backoff of 16 s and then 30 s could miss it: done work failed).
            left = self._reports_wanted_until - now
            if left > 0:
                delay = min(delay, max(RETRY_ELSEWHERE_S, left / 4))
        if self._holding_on:  # a coordinator said it would be back: be there when it is
            delay = min(delay, HOLD_ON_RETRY_S)
        return delay

    def _final_reports(self) -> int:
        """How many reports of a run's end wait to be acknowledged."""
        return sum(e.body.get("type") == "finished" for e in self._events.pending)

    def _fail_kv(self) -> list[RunnerOutput]:
        failed: list[RunnerOutput] = [
            KvAnswered(
                i, {"ok": False, "code": "lease_lost", "error": "the runner stopped its work"}
            )
            for i in self._kv
        ]
        self._kv.clear()
        return failed

    def _close(self, reason: str) -> list[RunnerOutput]:
        self._move(ConnectionState.CLOSED)
        self._ping_at = self._ack_at = self._reconnect_at = self._lost_at = None
        self._reports_wanted_until = None
        self._tunnel.clear()
        return [*self._fail_kv(), Closed(reason, reconnect=False)]
