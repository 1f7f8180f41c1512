"""The coordinator's end of one runner socket, without I/O: ``RunnerChannel`` (pure) and
``LinkCore`` (its store operations).

``RunnerChannel`` wraps the protocol's ``ServerSession`` and keeps what the coordinator
knows of the socket beyond the protocol: the runner it registered as, the push cursor
(commands sent so far), the final reports read but not yet applied (their slots are free
on the runner), whether the runner drains or left, whether a newer socket replaced it.
Like the session it is fed (``receive(message, now)``, ``tick(now)``, what the store
answered) and answers with outputs for the pump to carry out, in order. ``LinkCore``
does what those outputs ask against the store, synchronously and with the time passed
in. ``SocketPump`` (``socket.py``) only moves frames, runs ``LinkCore`` in a thread and
waits; the deterministic simulation (``tests/sim``) drives the same two objects with a
virtual clock, so what it checks is what the coordinator runs.

    Register     ──▶ register()      runner row, last applied event, unacknowledged commands
    ApplyEvents  ──▶ apply()         ``last_event_idx``, each event's effect, and an
                                     abandon_run command for every event refused as
                                     lease_lost: one transaction (``apply_reports``)
    CommandsAcked ──▶ acknowledge()
    PushWork     ──▶ push_work()     pending runs claimed into start commands, then every
                                     stored command after the cursor (cancel_run commands
                                     too: ``RunStore.request_cancel`` stores them)
    Stopping     ──▶ draining()      and once the runner has closed its socket, gone()
    KvRequested  ──▶ (the pump calls ``store.kv.apply``)
    Wake         ──▶ (the pump notifies those topics)

A drain or a stop asked through another coordinator is stored in the runner's row, whose
change wakes this one (``store/wakeups.py``): the pump then reads it (``order()``) and the
channel passes it on (``ordered``), a drain once per socket.

Events are parsed once, as they are read (``parse_events``): a malformed one closes the
socket before anything of its frame is stored.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import TypeAdapter, ValidationError

from corral.actors.wire import ActorEventBase, lifecycle_event
from corral.coordinator.actors import actor_wakeups, host_and_serve
from corral.coordinator.notifier import (
    CALLBACKS_DUE,
    RUNS_AVAILABLE,
    actor_topic,
    logs_topic,
    runner_topic,
)
from corral.coordinator.schemas import (
    FinishedEvent,
    LogsEvent,
    RunnerEvent,
    SessionEvent,
    StartedEvent,
    TaskStepEvent,
    start_run_json,
)
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import CorralError, LeaseLost, Unavailable
from corral.ids import RunnerId
from corral.protocol import messages as wire
from corral.protocol.messages import MALFORMED_EVENT, Indexed, ProtocolError, ToServerInit
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
from corral.protocol.server import ServerSession
from corral.runners import RunnerState
from corral.runs import Ended, Run, RunStatus
from corral.store import LogLine, Store
from corral.store.actors import Changes
from corral.store.commands import START_RUN, Command
from corral.store.runners import Head, Order
from corral.subagents import Mode

log = logging.getLogger("corral.coordinator")
# An event refused, or the run it finished (``Ended``: a plain run, ``finish_together``).
Outcome = tuple[CorralError | None, Run | Ended | None]
Slot = tuple[str, int]  # (run, attempt) the runner holds

_EVENT_LIST: TypeAdapter[list[RunnerEvent]] = TypeAdapter(list[RunnerEvent])
# Pings a second from all its sockets a coordinator takes at the configured interval; a
# runner that connects beyond that is asked to ping less often, up to LONGEST_PING_S. Each
# ping costs the coordinator ~0.1 ms of CPU (mostly uvicorn, asyncio and the kernel's
# send of the Pong): at 10,000 sockets pinging every 3 s, a third of a core.
PING_BUDGET_PER_S = 1000
LONGEST_PING_S = 5.0
# At most this many late reports announced in an Init are waited for before claiming.
MAX_LATE_REPORTS = 100_000


class Registration(NamedTuple):
    runner_id: RunnerId
    last_event_idx: int  # the runner's events applied so far (0 for a new identity)
    missed: list[Indexed]  # commands the runner has not acknowledged, to send again
    woken: tuple[str, ...] = ()  # notifier topics: actors placed on it as it connected
    drain_grace_s: float | None = None  # a drain asked while it was away: the grace left


@dataclass(frozen=True)
class Applied:
    last_idx: int  # acknowledge up to here
    abandon: list[Indexed]  # the abandon_run commands stored for them (push_work sends them)
    wake: list[str]  # notifier topics: log followers, and pollers if a run went back
    finished: bool  # a run ended: the runner may have a free slot


@dataclass(frozen=True)
class PushRequest:
    """What one round of the push loop asks of ``LinkCore.push_work``."""

    claim: bool  # False for a draining runner: it takes nothing new
    after: int  # the cursor: commands up to here were sent on this socket
    finishing: frozenset[Slot]  # final reports read, not yet applied: their slots are free


@dataclass(frozen=True)
class Pushed:
    commands: list[Indexed]  # to send, in index order
    claimed: tuple[str, ...] = ()  # the runs this round claimed
    free: int | None = None  # the runner's slots still free after it (None: no claim tried)


# ---- what the channel asks beyond the session's outputs ------------------------------------


@dataclass(frozen=True, slots=True)
class ApplyEvents:
    """Commit these parsed events in order (``LinkCore.apply``), then call
    ``RunnerChannel.applied`` with what it answered."""

    last_idx: int
    events: tuple[RunnerEvent, ...]


@dataclass(frozen=True, slots=True)
class PushWork:
    """Run a round of the push loop (``RunnerChannel.push_request``): slots may be free,
    or commands were stored that this socket has not sent."""


@dataclass(frozen=True, slots=True)
class Wake:
    """Notify these topics: waiting polls, log followers, the runner's newest socket."""

    topics: tuple[str, ...]


ChannelOutput = (
    Send[wire.ToClientMessage]
    | Close
    | Register
    | ApplyEvents
    | CommandsAcked
    | Alive
    | Stopping
    | KvRequested
    | Tunnelled
    | PushWork
    | Wake
)


@dataclass
class RunnerChannel:
    """One runner socket on the coordinator, pure: the protocol session and what was sent
    and read on it. ``seq`` orders the sockets as they opened: of two sockets registering
    as the same runner, the newer one wins (``Connections.take_over``).

    The push loop sends the store's command queue from a cursor rather than what its last
    round added: a command stored by an ``apply`` (abandon_run) or by an older socket of
    the same runner (still open because the coordinator has not yet noticed it broke) is
    never lost or sent after a higher index, which the runner would drop as a duplicate
    (found by ``tests/sim``)."""

    seq: int
    session: ServerSession
    runner_id: RunnerId | None = None
    draining: bool = False  # it said it stops, or was told to: no more claims
    left: bool = False  # the runner closed as one that shuts down (its work has stopped)
    replaced: bool = False  # a newer socket of the runner took over (or this one lost)
    drain_sent: bool = False  # the runner was told to drain on this socket
    # The runner's free slots as the store counted them at the end of the last claim (less
    # what was read finished since): while some are, the socket waits for runs
    # (``coordinator.waiters``); while none is, only a final report makes it claim again.
    free_slots: int = 0
    _sent_idx: int = 0  # commands sent on this socket, up to here
    _finishing: Counter[Slot] = field(default_factory=Counter)  # read, not yet applied
    _applying: deque[list[Slot]] = field(default_factory=deque)  # each ApplyEvents' finishes
    # Late final reports (a former identity's: they free no slot here) the runner said it
    # would send and were not read yet, and those read but not yet applied. While there
    # are any, it claims nothing: the runs they end are pending until then.
    _late_awaited: int = 0
    _late_applying: deque[int] = field(default_factory=deque)  # how many in each ApplyEvents
    _late_in_flight: int = 0
    # A runner sends them first, right after its Init: those announced and not read within
    # a lease (the lost threshold) are not coming, and it claims again.
    _late_due_at: float = math.inf

    @classmethod
    def open(
        cls,
        seq: int,
        now: float,
        settings: CoordinatorSettings,
        sockets: int = 0,
        tunnel_end: str | None = None,
    ) -> RunnerChannel:
        """A socket opened while the coordinator holds ``sockets`` others: its runner is
        told the ping interval for that many (``ping_interval_s``), and the coordinator's
        end of the tunnel (``wire.TUNNEL_END``)."""
        session = ServerSession(
            now,
            lost_threshold_s=settings.ws_lost_after_s,
            ping_interval_s=ping_interval_s(settings, sockets),
            ack_interval_s=settings.ws_ack_interval_s,
            tunnel_end=tunnel_end,
        )
        return cls(seq, session)

    @property
    def wants_runs(self) -> bool:
        """Should a new run wake this socket? Its runner has a free slot and takes work."""
        return self.free_slots > 0 and not self.draining and not self.replaced

    @property
    def stopped_for_good(self) -> bool:
        """It said it was stopping, and then it left: stopped (not if the socket broke)."""
        return self.draining and self.left

    # ---- fed by the pump ------------------------------------------------------------------

    def receive(self, message: wire.ToServerMessage, now: float) -> list[ChannelOutput]:
        return self._lift(self.session.receive(message, now))

    def receive_error(self, error: ProtocolError) -> list[ChannelOutput]:
        return self._lift(self.session.receive_error(error))

    def next_deadline(self) -> float | None:
        """When to ``tick`` next: the session's deadline, or sooner the end of the wait for
        announced late reports."""
        deadline = self.session.next_deadline()
        if self._late_awaited and deadline is not None:
            return min(deadline, self._late_due_at)
        return deadline

    def tick(self, now: float) -> list[ChannelOutput]:
        out = self._lift(self.session.tick(now))
        if self._late_awaited and now >= self._late_due_at:
            log.warning(
                "runner %s: %d late final reports it announced did not come within %.0f s: "
                "it claims again",
                self.runner_id,
                self._late_awaited,
                self.session.lost_threshold_s,
            )
            self._late_awaited = 0
            out.append(PushWork())
        return out

    def disconnected(self, code: int, reason: str | None) -> None:
        """The runner closed its end (``code``, ``reason``)."""
        self.left = code == wire.CLOSE_NORMAL and reason == wire.REASON_RUNNER_SHUTDOWN

    def registered(self, registration: Registration, now: float) -> list[ChannelOutput]:
        """The store knows the runner, and this socket is its newest: greet it; the push
        loop starts, from after the commands it is sent again now."""
        init = self.session.init
        assert init is not None  # Register comes from the Init
        runner_id = self.runner_id = registration.runner_id
        floor = init.last_command_idx if init.runner_id == runner_id else 0
        self._late_awaited = late_reports_to_send(init)
        self._late_due_at = now + self.session.lost_threshold_s
        self._sent_idx = max([c.idx for c in registration.missed], default=floor)
        greeting = self.session.registered(
            runner_id, registration.last_event_idx, registration.missed, now
        )
        # A drain asked while it was away: it drains now (after its greeting).
        if registration.drain_grace_s is not None:
            greeting += self.session.drain(registration.drain_grace_s)
            self.draining = self.drain_sent = True
        # Resumes bound to this runner's name may run now; its free slots want work.
        return [*self._lift(greeting), Wake((RUNS_AVAILABLE,)), PushWork()]

    def applied(self, applied: Applied, *, hold: bool = False) -> list[ChannelOutput]:
        """``LinkCore.apply`` committed the oldest ``ApplyEvents`` handed out. ``hold``: its
        acknowledgement may wait for the commands about to be pushed, in this same step
        (``ServerSession.applied``); then ``release_ack`` after them."""
        self._finishing.subtract(self._applying.popleft())
        self._finishing = +self._finishing  # drop the zeros
        late = self._late_applying.popleft()
        self._late_in_flight -= late
        out: list[ChannelOutput] = []
        topics = list(applied.wake)
        if applied.abandon or applied.finished:
            # Replaced: the runner's newest socket sends the abandon_run commands, and
            # counts the slot a final report read here freed.
            topics.extend(self._announce())
        if topics:
            out.append(Wake(tuple(topics)))
        # The slots its own final reports free were filled when they were read (they were
        # ``finishing``): another round now would only find them filled, and keep the socket
        # out of the waiters' line meanwhile (a run created then waits for a round). Late
        # reports free no slot counted so, and nothing was claimed while they were applied.
        if applied.abandon or late:
            out.append(PushWork())  # abandon_run commands wait; a slot may be free
        return [*out, *self._lift(self.session.applied(applied.last_idx, hold=hold))]

    def release_ack(self) -> list[ChannelOutput]:
        """The acknowledgement ``applied(hold=True)`` held, if no pushed commands took it."""
        return self._lift(self.session.release_ack())

    def push_request(self) -> PushRequest:
        return PushRequest(
            # Not while late final reports are announced or being applied: the run one
            # reports done is pending until then, and this runner could claim it again.
            claim=not self.draining and not self._late_awaited and not self._late_in_flight,
            after=self._sent_idx,
            finishing=frozenset(self._finishing),
        )

    def pushed(self, pushed: Pushed) -> list[ChannelOutput]:
        """``LinkCore.push_work`` stored and read these commands: send them."""
        if pushed.free is not None:
            self.free_slots = pushed.free
        if not pushed.commands:
            return []
        out = self._lift(self.session.push(pushed.commands))
        self._sent_idx = max(self._sent_idx, pushed.commands[-1].idx)
        if topics := self._announce():
            out.append(Wake(topics))
        return out

    def kv_answered(self, request_id: int, result: dict[str, Any]) -> list[ChannelOutput]:
        return self._lift(self.session.kv_answered(request_id, result))

    def behind(self, head: Head) -> bool:
        """Has the runner's row (``RunnerStore.heads``) anything this socket has not passed
        on? Commands stored past what it sent, or a state other than active (a drain, a
        stop, lost). After a lost notification only such a socket needs to look again."""
        return head.last_command_idx > self._sent_idx or head.state is not RunnerState.ACTIVE

    # ---- orders from the rest of the coordinator -------------------------------------------

    def drain(self, grace_s: float) -> list[ChannelOutput]:
        """Forced drain: no new work; the runner finishes (up to ``grace_s``) and leaves."""
        self.draining = self.drain_sent = True
        return self._lift(self.session.drain(grace_s))

    def ordered(self, order: Order) -> list[ChannelOutput]:
        """What the store says was asked of the runner, maybe through another coordinator
        (``LinkCore.order``): a stop is passed on, a drain once (a drain asked here was
        sent already)."""
        if order.state is RunnerState.STOPPED:
            return self.stop()
        if order.drain_grace_left_s is not None and not self.drain_sent:
            return self.drain(order.drain_grace_left_s)
        return []

    def stop(self) -> list[ChannelOutput]:
        return self._lift(self.session.stop())

    def leave(self) -> list[ChannelOutput]:
        """This coordinator stops: the runner moves to another (``ServerSession.leave``)."""
        return self._lift(self.session.leave())

    def evict(self) -> list[ChannelOutput]:
        """A newer socket of the same runner took over: this one must not reconnect."""
        self.replaced = True
        return self._lift(self.session.evict())

    # ---- inside --------------------------------------------------------------------------

    def _announce(self) -> tuple[str, ...]:
        """New commands are stored: if this socket is not the runner's newest, wake the
        newest, which sends them."""
        if self.replaced and self.runner_id is not None:
            return (runner_topic(self.runner_id),)
        return ()

    def _lift(self, outputs: list[ServerOutput]) -> list[ChannelOutput]:
        lifted: list[ChannelOutput] = []
        for out in outputs:
            if isinstance(out, Apply):
                try:
                    events = parse_events(out.events)
                except ProtocolError as exc:  # never acknowledged: nothing is stored
                    log.warning("runner %s: refused: %s", self.runner_id, exc.reason)
                    return [*lifted, *self._lift(self.session.receive_error(exc))]
                finals = [e for e in events if isinstance(e, FinishedEvent)]
                ended = [(e.run_id, e.attempt) for e in finals if e.former_runner_id is None]
                late = len(finals) - len(ended)
                self._applying.append(ended)
                self._late_applying.append(late)
                self._late_in_flight += late
                # They come first, in order: a frame with none means none is to come.
                carried = any(
                    not isinstance(e, ActorEventBase) and e.former_runner_id for e in events
                )
                self._late_awaited = max(0, self._late_awaited - late) if carried else 0
                lifted.append(ApplyEvents(out.events[-1].idx, tuple(events)))
                if ended:
                    # Those slots are free on the runner: fill them while the reports are
                    # being committed, not after.
                    self._finishing.update(ended)
                    lifted.append(PushWork())
            elif isinstance(out, Stopping):
                self.draining = True  # no more claims from now on; the store learns in turn
                lifted += [out, PushWork()]
            else:
                lifted.append(out)
        return lifted


class LinkCore:
    def __init__(self, store: Store, settings: CoordinatorSettings) -> None:
        self.store = store
        self.settings = settings

    def register(self, init: ToServerInit, now: float, token_id: str | None = None) -> Registration:
        """Look up (or create) the runner that sent ``init``: what it has and has missed.
        ``token_id``: the token of its socket (an id registered with another one is refused,
        ``runner_not_yours``)."""
        store = self.store
        runner, _ = store.runners.register(
            name=init.name,
            hostname=str(init.metadata.get("hostname", "")),
            labels=list(init.labels),
            slots=init.total_slots,
            version=init.version,
            transport="websocket",
            now=now,
            runner_id=init.runner_id,
            held=None,
            lost_after_s=self.settings.ws_lost_after_s,
            revive=False,
            token_id=token_id,
            keep_drain=True,
            coordinator_url=self.settings.endpoint_url,
        )
        # Its actor slots take queued actors now: their start commands are among ``missed``.
        placed = host_and_serve(store, runner.id, init, now)
        # A new identity starts over: the first connect, an id the store does not know, or
        # one it declared lost (its runs went back: commands not yet acknowledged would
        # start runs that are others' now; the runner stops all work on a new id).
        same = init.runner_id == runner.id
        if init.runner_id is not None and not same:
            store.commands.forget(init.runner_id)
        state = store.commands.state(runner.id)
        missed = store.commands.unacknowledged(
            runner.id, max(init.last_command_idx, state.acked_command_idx) if same else 0
        )
        drained = runner.state is RunnerState.DRAINING  # kept: a drain asked while away
        return Registration(
            runner.id,
            state.last_event_idx if same else 0,
            _indexed(missed),
            tuple(actor_topic(a) for a in placed.actors)
            + tuple(runner_topic(r) for r in placed.runners if r != runner.id),
            store.runners.order(runner.id, now).drain_grace_left_s if drained else None,
        )

    def apply(
        self, runner_id: RunnerId, last: int, events: Sequence[RunnerEvent], now: float
    ) -> Applied:
        """Record the runner's events as applied up to ``last`` and commit their effect
        (parsed: ``parse_events``) in order, in one transaction (``apply_reports``).

        Recorded first: that write locks the runner's row before any run's, the order
        ``RunStore.request_cancel`` and the reconciler take them on PostgreSQL (taken the
        other way, a final report racing a cancel of its run could deadlock)."""
        return apply_reports(
            self.store,
            runner_id,
            events,
            now,
            applied=last,
            then=lambda outcomes, changed: self._after_apply(
                runner_id, events, outcomes, changed, last, now
            ),
        ).applied

    def _after_apply(
        self,
        runner_id: RunnerId,
        parsed: Sequence[RunnerEvent],
        outcomes: Sequence[Outcome],
        changed: Changes,
        last: int,
        now: float,
    ) -> Applied:
        refused = {
            (e.run_id, e.attempt): None
            for e, (error, _) in zip(parsed, outcomes, strict=True)
            if error is not None
            and error.code == "lease_lost"
            and not isinstance(e, ActorEventBase)
            and e.former_runner_id is None  # late: that attempt stopped long ago
        }
        for event, (error, _) in zip(parsed, outcomes, strict=True):
            if (
                error is not None
                and not isinstance(event, ActorEventBase)
                and event.former_runner_id
            ):
                # Acknowledged all the same: the run went on without it (cancelled, claimed
                # again, ended), and sending it again would change nothing.
                log.warning(
                    "runner %s: a late %s report of run %s attempt %d (held by %s) dropped: %s",
                    runner_id,
                    event.type,
                    event.run_id,
                    event.attempt,
                    event.former_runner_id,
                    error.message,
                )
        # The run is not the runner's any more: it must stop it. Not so for a late report
        # of an older attempt of a run this runner holds again: ``abandon_run`` names the
        # run, and would stop the attempt the runner is meant to be running.
        stale = {r: a for r, a in refused if not self._holds_newer(runner_id, r, a)}
        abandon: list[Indexed] = []
        if stale:
            bodies = [{"type": "abandon_run", "run_id": r, "attempt": a} for r, a in stale.items()]
            abandon = self.push(runner_id, bodies, now)
        return Applied(
            last_idx=last,
            abandon=abandon,
            wake=wakeups(parsed, outcomes, changed),
            finished=any(e.type == "finished" for e in parsed),
        )

    def _holds_newer(self, runner_id: RunnerId, run_id: str, attempt: int) -> bool:
        run = self.store.runs.get(run_id)
        return run.runner_id == runner_id and run.status.holds_lease and run.attempts > attempt

    def acknowledge(self, runner_id: RunnerId, idx: int) -> None:
        self.store.commands.acknowledge(runner_id, idx)

    def push(
        self, runner_id: RunnerId, bodies: Sequence[dict[str, Any]], now: float
    ) -> list[Indexed]:
        """Number and store commands; the push loop sends them (``push_work``)."""
        return _indexed(self.store.commands.push(runner_id, bodies, now))

    def push_work(self, runner_id: RunnerId, now: float, request: PushRequest) -> Pushed:
        """Pending runs claimed into the runner's free slots (with their start commands, one
        transaction); then every stored command after ``request.after`` (the last one this
        socket sent), in order, to send.

        The store's queue is what is sent, not what this call added: commands stored by an
        ``apply``, by a cancel request, or by an older socket of the runner that had not yet
        noticed it was replaced, go out too, and never after a higher index (the runner
        would drop them). Commits come in index order (numbering locks the runner's row), so
        this read never sees a command without those before it. Raises ``CorralError``
        (runner_lost) when the runner was declared lost or stopped meanwhile: it must
        connect again."""
        commands = self.store.commands
        claimed: list[Command] = []
        free = None
        # One commit for the claim and the read; flat: the claim's own transaction joins it
        # (a savepoint would cost PostgreSQL two round trips, and a failure ends both anyway).
        with self.store.db.transaction(flat=True):
            if request.claim:
                # What is left free decides whether the socket waits for new runs.
                claimed, free = commands.claim_into_commands(
                    runner_id, now, _start_body, request.finishing, START_RUN
                )
            # Numbering holds the runner's row: what was added here is contiguous. If it
            # starts right after the cursor, it is all there is to send (no read back).
            added = claimed
            if not added or added[0].idx != request.after + 1:
                added = commands.unacknowledged(runner_id, request.after)
        started = tuple(str(c.body["run"]["run_id"]) for c in claimed)
        return Pushed(_indexed(added), started, free)

    def order(self, runner_id: RunnerId, now: float) -> Order:
        """What was asked of the runner through any coordinator (drain, stop)."""
        return self.store.runners.order(runner_id, now)

    def draining(self, runner_id: RunnerId, now: float) -> None:
        """The runner shuts down gracefully: no new work for it."""
        self.store.runners.set_state(runner_id, RunnerState.DRAINING, now)

    def gone(self, runner_id: RunnerId, left: bool, now: float) -> bool:
        """The runner's socket closed. ``left``: it said it was stopping, then closed the way
        a runner that shuts down does (1000 ``corral.runner_shutdown``, once its work has
        stopped): it is stopped now, and what it still holds goes back to pending (True).

        Any other close — a broken connection, even of a draining runner — may be a runner
        still running its work that reconnects soon: taking its runs back now would run
        them twice. The reconciler declares it lost if it stays away its threshold."""
        if not left:
            return False
        with contextlib.suppress(CorralError):
            self.store.runners.set_state(runner_id, RunnerState.STOPPED, now)
        return True


def ping_interval_s(settings: CoordinatorSettings, sockets: int) -> float:
    """The ping interval a runner is told in its Init while the coordinator holds
    ``sockets``: the configured one while they all ping within ``PING_BUDGET_PER_S``, then
    longer as they grow, up to ``LONGEST_PING_S`` and never past a quarter of the lost
    threshold (four pings still fit in it; the runner pings within a third of its lease
    anyway, and its silence window grows with the interval: ``RunnerConnection``)."""
    spread = sockets / PING_BUDGET_PER_S
    longest = min(LONGEST_PING_S, settings.ws_lost_after_s / 4)
    return max(settings.ws_ping_interval_s, min(spread, longest))


def late_reports_to_send(init: ToServerInit) -> int:
    """How many late final reports the runner's Init says follow (0 if it says nothing
    sensible: an older runner sends none)."""
    count: Any = init.metadata.get(wire.LATE_REPORTS_TO_SEND)
    return count if type(count) is int and 0 < count <= MAX_LATE_REPORTS else 0


def parse_events(events: Sequence[Indexed]) -> list[RunnerEvent]:
    """Event bodies as the runner protocol defines them. One that is not (a ``logs`` event
    of more than ``MAX_LOG_LINES`` lines, a missing field …) raises ``ProtocolError``
    (``malformed_event``): the socket is closed and nothing of it is acknowledged, since
    an event is never acknowledged unless it was stored."""
    try:
        # The frame's events at once: one call into pydantic's core, not one an event
        # (a frame of 16 no-op reports parsed in half the time).
        return _EVENT_LIST.validate_python([event.body for event in events])
    except ValidationError as exc:
        errors = exc.errors()
        first = min(int(e["loc"][0]) for e in errors)  # the first malformed event's
        its = [e for e in errors if e["loc"][0] == first][:3]
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in its)
        raise ProtocolError(MALFORMED_EVENT, f"event {events[first].idx}: {problems}") from exc


T = TypeVar("T")


@dataclass(frozen=True)
class Reports(Generic[T]):
    outcomes: list[Outcome]
    changed: Changes  # what the actor reports did: actors changed, runners given commands
    applied: T  # what ``then`` returned


def apply_reports(
    store: Store,
    runner_id: str,
    events: Sequence[RunnerEvent],
    now: float,
    then: Callable[[list[Outcome], Changes], T],
    applied: int | None = None,
) -> Reports[T]:
    """The runner's events recorded as applied up to ``applied`` (if given:
    ``CommandStore.events_applied``), the effect of its reports, in order, and ``then`` —
    one transaction. ``then`` is given each report's outcome and what the actor reports
    changed (the actors, and the runners their commands were stored for: whoever applies
    the reports wakes those runners' push loops, ``wakeups``).

    Recorded first: that write locks the runner's row before any run's, the order
    ``RunStore.request_cancel`` and the reconciler take them on PostgreSQL (taken the other
    way, a final report racing a cancel of its run could deadlock). When the batch's start
    reports go together, on PostgreSQL it is a part of their statement, run before it
    starts any run (one round trip fewer, ``RunStore.mark_started_many``).

    Nearly every batch is accepted whole: it is tried flat first (no savepoint per report:
    on PostgreSQL each costs round trips), its start reports together in one statement
    (``start_together``), and its final reports together last (``finish_together``). If one
    report is refused (``lease_lost``, an illegal transition …), that try is undone and the
    batch is applied again with a savepoint per report, so that the refused one undoes only
    its own writes."""
    try:
        with store.db.transaction(flat=True):
            changed = Changes()
            started = start_together(store, runner_id, events, now, applied)
            last = finals_last_of_their_run(events)
            outcomes: list[Outcome] = [
                (None, None)
                if n in started or n in last
                else (None, _apply(store, runner_id, e, now, changed))
                for n, e in enumerate(events)
            ]
            for n, run in finish_together(store, runner_id, events, last, now).items():
                outcomes[n] = None, run
            return Reports(outcomes, changed, then(outcomes, changed))
    except Unavailable:
        raise
    except CorralError:
        pass
    with store.db.transaction():
        if applied is not None:
            store.commands.events_applied(runner_id, applied)
        changed = Changes()  # the flat try's changes were undone with it
        outcomes = [apply_event(store, runner_id, event, now, changed) for event in events]
        return Reports(outcomes, changed, then(outcomes, changed))


def start_together(
    store: Store,
    runner_id: str,
    events: Sequence[RunnerEvent],
    now: float,
    applied: int | None = None,
) -> set[int]:
    """The batch's start reports that come before any other report of their run, applied
    first, in one statement (``RunStore.mark_started_many``): the positions of those it
    started. Each run's reports still apply in their order; a runner's batch alternates
    start and final reports of different runs, each a statement of its own otherwise.
    Before them, the runner's events are recorded as applied up to ``applied`` (if given)."""
    seen: set[str] = set()
    first_starts: list[tuple[int, tuple[str, int]]] = []
    for n, event in enumerate(events):
        if isinstance(event, ActorEventBase):
            continue
        if (
            isinstance(event, StartedEvent)
            and event.former_runner_id is None
            and event.run_id not in seen
        ):
            first_starts.append((n, (event.run_id, event.attempt)))
        seen.add(event.run_id)
    if len(first_starts) < 2:
        if applied is not None:
            store.commands.events_applied(runner_id, applied)
        return set()
    started = store.runs.mark_started_many(
        runner_id, [a for _, a in first_starts], now, applied=applied
    )
    return {n for n, attempt in first_starts if attempt in started}


def finals_last_of_their_run(events: Sequence[RunnerEvent]) -> list[int]:
    """The positions of the batch's final reports (not late ones) that are the last report
    of their run in it, if there are two or more: ``finish_together`` applies them after the
    others, so each run's reports still apply in their order."""
    last: dict[str, int] = {}
    for n, event in enumerate(events):
        if not isinstance(event, ActorEventBase):
            last[event.run_id] = n
    finals = [
        n
        for n in last.values()
        if isinstance(event := events[n], FinishedEvent) and event.former_runner_id is None
    ]
    return sorted(finals) if len(finals) >= 2 else []


def finish_together(
    store: Store, runner_id: str, events: Sequence[RunnerEvent], last: Sequence[int], now: float
) -> dict[int, Run | Ended]:
    """The final reports at ``last`` (``finals_last_of_their_run``), applied in as few
    statements as their outcomes allow (``RunStore.finish_many``: one for those that end
    alike), each one the statement did not end by the checked path (``RunStore.finish``):
    the run each ended, by position."""
    finals = [(n, e) for n in last if isinstance(e := events[n], FinishedEvent)]
    reports = [(e.run_id, e.attempt, e.to_report(RunStatus(e.status))) for _, e in finals]
    ended = store.runs.finish_many(runner_id, reports, now)
    finished: dict[int, Run | Ended] = {}
    for (n, _), (run_id, attempt, report) in zip(finals, reports, strict=True):
        run = ended.get((run_id, attempt))
        finished[n] = run or store.runs.finish(run_id, runner_id, attempt, report, now)
    return finished


def apply_event(
    store: Store, runner_id: str, event: RunnerEvent, now: float, changed: Changes
) -> Outcome:
    """One runner report's effect, as a store operation; a refusal is returned, not raised
    (and adds nothing to ``changed``)."""
    try:
        return None, _apply(store, runner_id, event, now, changed)
    except CorralError as exc:
        return exc, None


def _apply(
    store: Store, runner_id: str, event: RunnerEvent, now: float, changed: Changes
) -> Run | None:
    """One report's effect; the run it finished, if it was a final report. An actor
    report's changes are added to ``changed``."""
    if isinstance(event, ActorEventBase):
        lifecycle = lifecycle_event(runner_id, event)
        changed.update(store.actors.runner_event(runner_id, event.actor_id, lifecycle, now))
        return None
    if event.former_runner_id is not None:
        # A late report, of an attempt an earlier identity of this runner held: the store
        # takes it as that identity's (``RunStore.finish``), if it may still.
        if not store.runners.former_identity(runner_id, event.former_runner_id):
            raise LeaseLost(f"{event.former_runner_id} is not a former identity of {runner_id}")
        runner_id = event.former_runner_id
    if isinstance(event, StartedEvent):
        store.runs.mark_started(event.run_id, runner_id, event.attempt, now)
    elif isinstance(event, SessionEvent):
        store.runs.record_session(event.run_id, runner_id, event.attempt, event.session_id, now)
    elif isinstance(event, LogsEvent):
        lines = [LogLine(x.line_no, x.stream, x.text, x.ts) for x in event.lines]
        store.logs.append(event.run_id, runner_id, event.attempt, lines)
    elif isinstance(event, TaskStepEvent):
        store.runs.record_task_step(
            event.run_id, runner_id, event.attempt, event.step, event.data, now
        )
    else:
        report = event.to_report(RunStatus(event.status))
        return store.runs.finish(event.run_id, runner_id, event.attempt, report, now)
    return None


def wakeups(
    events: Sequence[RunnerEvent], outcomes: Sequence[Outcome], changed: Changes
) -> list[str]:
    """Who to wake after a runner's ``events`` were applied, whichever way they came (the
    socket, ``POST /runner/events``, the per-run endpoints): followers of their logs,
    pollers if a final report made work for them (``makes_work``), the callback deliverer
    if one may be due (``may_owe_callback``), and, for the actors they moved
    (``changed``), their followers and the runners given commands (``actor_wakeups``)."""
    topics = [logs_topic(e.run_id) for e in events if isinstance(e, LogsEvent | FinishedEvent)]
    if any(run is not None and makes_work(run) for _, run in outcomes):
        topics.append(RUNS_AVAILABLE)
    if any(run is not None and may_owe_callback(run) for _, run in outcomes):
        topics.append(CALLBACKS_DUE)
    return topics + actor_wakeups(events, changed)


def makes_work(finished: Run | Ended) -> bool:
    """A final report that ended as ``finished`` may have made a run claimable: its run went
    back to pending, or it was a task run (settling its task schedules more tasks)."""
    return finished.status is RunStatus.PENDING or finished.task_id is not None


def may_owe_callback(finished: Run | Ended) -> bool:
    """A final report that ended as ``finished`` may make a sub-agent callback due: an
    async_callback child ended (its callback was recorded), or a run of a session ended —
    a parent whose children's callbacks waited while it was busy is idle now."""
    return finished.status.is_terminal and (
        finished.callback == Mode.ASYNC_CALLBACK or finished.session_id is not None
    )


def _start_body(run: Run) -> dict[str, Any]:
    return {"type": "start_run", "run": start_run_json(run)}


def _indexed(commands: Sequence[Command]) -> list[Indexed]:
    return [Indexed(c.idx, c.body, c.stored) for c in commands]
