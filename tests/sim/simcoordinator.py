"""The simulated coordinator: the real ``RunnerChannel``, ``LinkCore`` and ``Connections``
inside a model of ``SocketPump`` (``coordinator/socket.py``) and of
``Coordinator.reconcile_once``.

The real pump awaits each store call in a thread while its other coroutines run. Here a
store call is an ``Op`` that completes at a later step of the scheduler, so the same
interleavings happen: the read loop waits on a registration; the store worker applies
events, acks and a drain in order while frames keep being read; the push loop's claim runs
beside them; a session tick may close the link while an op is in flight — the op's store
effect still happens (a thread is not interrupted) but what follows it in the cancelled
coroutine does not, nor does queued work. ``_forget`` runs once no op is in flight.
New runs wake push loops as ``Coordinator.dispatch_forever`` does: a round (its read of the
claimable runs an op too) hands them to the sockets waiting in the real ``SocketWaiters``,
and a round is made every ``poll_timeout_s`` without a wake-up.
What the pump keeps of the protocol (the push cursor, finishing reports, draining,
who was replaced) is the channel's: nothing of it is copied here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simnet import CLOSE, Socket
from simrunner import ACK_INTERVAL_S, LOST_AFTER_S, PING_INTERVAL_S
from simstore import CrashingStore

from corral.coordinator.actors import kv_request
from corral.coordinator.claims import READ_LIMIT
from corral.coordinator.connections import Connections
from corral.coordinator.link_core import (
    ApplyEvents,
    ChannelOutput,
    LinkCore,
    Pushed,
    PushWork,
    Registration,
    RunnerChannel,
    Wake,
)
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic
from corral.coordinator.settings import CoordinatorSettings
from corral.coordinator.waiters import SocketWaiters, Waiter, after_claim
from corral.errors import CorralError
from corral.ids import RunId
from corral.protocol import messages as wire
from corral.protocol.outputs import (
    Alive,
    Close,
    CommandsAcked,
    KvRequested,
    Register,
    Send,
    Stopping,
    Tunnelled,
)
from corral.store import Store

if TYPE_CHECKING:
    from simworld import World


def settings(ping_interval_s: float = PING_INTERVAL_S) -> CoordinatorSettings:
    """The coordinator's settings, scaled down from the defaults (ping 3 s, lost 15 s)."""
    return CoordinatorSettings(
        ws_lost_after_s=LOST_AFTER_S,
        ws_ping_interval_s=ping_interval_s,
        ws_ack_interval_s=ACK_INTERVAL_S,
        lost_after_s=LOST_AFTER_S,
        reconcile_interval_s=1.0,
    )


@dataclass(eq=False)
class Op:
    """A store call in a worker thread: ``run`` in the thread, then ``then`` on the loop."""

    kind: str
    due: float
    run: Callable[[], Any]
    then: Callable[[Any], None]


class SimPump:
    """The model of one ``SocketPump``: its loops' store calls in flight, and its channel."""

    token_id = None

    def __init__(self, socket: Socket, channel: RunnerChannel) -> None:
        self.socket = socket
        self.channel = channel
        self.read_op: Op | None = None  # the registration: no frame is read meanwhile
        self.work: deque[Callable[[], Op]] = deque()  # the store worker's queue
        self.work_op: Op | None = None
        self.push_op: Op | None = None
        self.pushing = False  # the push loop runs (from registration on)
        self.wake = False  # the push loop was notified
        self.waiter: Waiter | None = None  # waiting among the socket waiters
        self.woken = False  # a round reserved runs for it that it has not tried to claim
        self.reserved: list[RunId] | None = None
        self.declined: frozenset[RunId] = frozenset()
        self.runs_seen = 0  # RUNS_AVAILABLE notifications when its push began
        self.closed = False
        self.forgotten = False

    @property
    def seq(self) -> int:
        return self.channel.seq

    @property
    def runner_id(self) -> Any:
        return self.channel.runner_id

    @property
    def name(self) -> str:
        return f"{self.socket.name}/{self.runner_id or '?'}"

    def ops(self) -> list[Op]:
        return [op for op in (self.read_op, self.work_op, self.push_op) if op is not None]


class SimCoordinator:
    def __init__(self, world: World, store: Store, settings: CoordinatorSettings) -> None:
        self.world = world
        self.settings = settings
        self.store = CrashingStore(store)
        self.core = LinkCore(self.store, settings)  # type: ignore[arg-type]
        self.up = True
        self.up_since = world.now
        self.restart_at: float | None = None
        self.links: list[SimPump] = []
        self.connections = Connections()
        self.next_reconcile = world.now
        self.waiters = SocketWaiters()
        self.runs_notified = 0  # RUNS_AVAILABLE notifications so far
        self.round_due = False  # a round of the socket waiters is to be made
        self.round_op: Op | None = None  # its read of the claimable runs
        self.next_rescan = world.now + settings.poll_timeout_s

    # ---- sockets and frames --------------------------------------------------------------

    def accept(self, socket: Socket) -> None:
        channel = RunnerChannel.open(self.connections.accepted(), self.world.now, self.settings)
        link = SimPump(socket, channel)
        socket.link = link
        self.links.append(link)

    def can_read(self, link: SimPump) -> bool:
        return not link.closed and link.read_op is None

    def deliver_up(self, socket: Socket) -> None:
        link = socket.link
        assert link is not None
        text = socket.up.popleft()
        if text is CLOSE:
            code = wire.CLOSE_NORMAL if socket.runner_reason else 1006
            link.channel.disconnected(code, socket.runner_reason)
            self.world.log(f"{link.name} reads the runner's close ({socket.runner_reason!r})")
            self.close(link)
            return
        socket.last_up = text
        self.world.log_frame(f"{link.name} ← {link.socket.runner.label}: ", text)
        self.receive(link, text)

    def receive(self, link: SimPump, text: str) -> None:
        try:
            message = wire.decode(text, side="server")
        except wire.ProtocolError as exc:
            self.handle(link, link.channel.receive_error(exc))
            return
        self.handle(link, link.channel.receive(message, self.world.now))

    def close(self, link: SimPump) -> None:
        if not link.closed:
            link.closed = True
            link.work.clear()  # the worker task is cancelled
            self.leave_line(link)
            if link.woken:  # the push loop's ``finally``: what was reserved, others take
                link.woken = False
                self.notify(RUNS_AVAILABLE)
            link.socket.close_from_server()
            self.forget_if_idle(link)

    # ---- what the channel asks -----------------------------------------------------------

    def handle(self, link: SimPump, outputs: list[ChannelOutput]) -> None:
        world, core = self.world, self.core
        for out in outputs:
            if link.closed:
                return  # the pump's task is cancelled once the link is closed
            if isinstance(out, Send):
                link.socket.send_down(wire.encode(out.message))
            elif isinstance(out, Close):
                world.log(f"{link.name} closes: {out.reason}")
                self.close(link)
            elif isinstance(out, Register):
                init = out.init
                link.read_op = self.op(
                    "register",
                    lambda init=init: core.register(init, world.now),
                    lambda reg, link=link: self.registered(link, reg),
                )
            elif isinstance(out, ApplyEvents):
                rid = link.runner_id
                link.work.append(
                    lambda rid=rid, out=out, link=link: self.op(
                        "apply",
                        lambda: core.apply(rid, out.last_idx, out.events, world.now),
                        lambda applied: self.handle(link, link.channel.applied(applied)),
                    )
                )
            elif isinstance(out, CommandsAcked):
                idx, rid = out.last_command_idx, link.runner_id
                link.work.append(
                    lambda rid=rid, idx=idx: self.op(
                        "ack", lambda: core.acknowledge(rid, idx), lambda _: None
                    )
                )
            elif isinstance(out, Alive):
                self.connections.note_ping(link.runner_id)
            elif isinstance(out, Stopping):
                rid = link.runner_id
                link.work.append(
                    lambda rid=rid: self.op(
                        "draining", lambda: core.draining(rid, world.now), lambda _: None
                    )
                )
            elif isinstance(out, KvRequested):
                # On the store worker, in order with the events (socket.py's _work).
                rid = link.runner_id
                link.work.append(
                    lambda rid=rid, out=out, link=link: self.op(
                        "kv",
                        lambda: kv_request(
                            self.store,  # type: ignore[arg-type]
                            rid,
                            out.actor_id,
                            out.op,
                            world.now,
                            generation=out.generation,
                        ),
                        lambda result: self.handle(
                            link, link.channel.kv_answered(out.request_id, result)
                        ),
                    )
                )
            elif isinstance(out, Tunnelled):
                pass  # no gateway in the simulation
            elif isinstance(out, PushWork):
                link.wake = True
            elif isinstance(out, Wake):
                for topic in out.topics:
                    self.notify(topic)

    def notify(self, topic: str) -> None:
        """The notifier: new runs start a round of the socket waiters; a push loop waits on
        its runner's orders."""
        if topic == RUNS_AVAILABLE:
            self.runs_notified += 1
            self.round_due = True
            return
        for link in self.links:
            if topic == runner_topic(link.runner_id):
                link.wake = True

    def leave_line(self, link: SimPump) -> None:
        if link.waiter is not None:
            self.waiters.discard(link.waiter)
            link.waiter = None

    def board_wake(self, link: SimPump, reserved: list[RunId] | None) -> None:
        link.waiter = None  # the round took it out of the line
        link.woken, link.reserved, link.wake = True, reserved, True

    def complete_round(self) -> None:
        """The round's read is back: the waiting sockets it fits are woken."""
        op = self.round_op
        assert op is not None
        self.round_op = None
        claimable = op.run()
        for waiter, runs in self.waiters.assign(claimable, set(), len(claimable) < READ_LIMIT):
            waiter.wake(runs)

    def op(self, kind: str, run: Callable[[], Any], then: Callable[[Any], None]) -> Op:
        rng = self.world.rng
        roll = rng.random()
        if roll < 0.6:
            delay = 0.0
        elif roll < 0.95 or not self.world.slow_store:
            delay = rng.uniform(0.0, 0.3)
        else:
            delay = rng.uniform(0.5, 6.0)  # a slow database: a reconnect may overtake it
        return Op(kind, self.world.now + delay, run, then)

    def complete(self, link: SimPump, op: Op) -> None:
        if op is link.read_op:
            link.read_op = None
        elif op is link.work_op:
            link.work_op = None
        else:
            link.push_op = None
        try:
            result = op.run()
        except CorralError as exc:
            if op.kind != "push":
                raise
            result = exc
        if not link.closed:
            op.then(result)
        elif isinstance(result, Pushed) and result.commands:
            # As ``SocketPump._stored_behind``: the runner's newest socket sends them.
            self.notify(runner_topic(link.runner_id))
        self.forget_if_idle(link)

    def registered(self, link: SimPump, reg: Registration) -> None:
        world = self.world
        link.channel.runner_id = reg.runner_id
        evicted = self.connections.take_over(reg.runner_id, link)  # type: ignore[arg-type]
        if evicted is link:
            world.log(f"{link.name} registered after a newer socket: evicts itself")
            self.handle(link, link.channel.evict())
            return
        if evicted is not None:
            assert isinstance(evicted, SimPump)
            world.log(f"{link.name} evicts {evicted.name}")
            self.handle(evicted, evicted.channel.evict())
        link.pushing = True
        self.handle(link, link.channel.registered(reg, world.now))
        for topic in reg.woken:  # actors placed on it as it connected
            self.notify(topic)

    def committed_apply(self, link: SimPump, *, hold: bool) -> list[ChannelOutput]:
        """``SocketPump._committed_apply``: the worker's apply, if due by now, run and told
        to the channel here rather than when the worker gets to it."""
        op = link.work_op
        if op is None or op.kind != "apply" or op.due > self.world.now:
            return []
        link.work_op = None
        return link.channel.applied(op.run(), hold=hold)

    def pushed(self, link: SimPump, result: Pushed | CorralError) -> None:
        if isinstance(result, CorralError):
            self.world.log(f"{link.name} push: {result.code}: closes")
            self.close(link)
            return
        link.woken = False
        reserved, link.reserved = link.reserved, None
        # As ``SocketPump``: an apply due by now (committed with this claim) is told to the
        # channel first, its acknowledgement held for the commands, then released if none.
        held = self.committed_apply(link, hold=bool(result.commands))
        self.handle(link, [*held, *link.channel.pushed(result), *link.channel.release_ack()])
        if link.closed:
            return
        link.declined, missed = after_claim(reserved, result.claimed, link.declined)
        if missed:
            self.notify(RUNS_AVAILABLE)
        if not link.channel.wants_runs:
            return
        if self.runs_notified != link.runs_seen:
            link.wake = True  # runs came while it claimed: it looks again
            return
        init = link.channel.session.init
        assert init is not None
        link.waiter = Waiter(
            init.name,
            frozenset(init.labels),
            link.channel.free_slots,
            lambda runs, link=link: self.board_wake(link, runs),
            link.declined,
        )
        self.waiters.add(link.waiter)

    def forget_if_idle(self, link: SimPump) -> None:
        if not link.closed or link.forgotten or link.ops():
            return
        link.forgotten = True
        self.links.remove(link)
        rid = link.runner_id
        if not self.connections.forget(rid, link):  # type: ignore[arg-type]
            return
        if self.core.gone(rid, link.channel.stopped_for_good, self.world.now):
            self.world.log(f"{link.name} left: stopped")
            self.notify(RUNS_AVAILABLE)

    # ---- loops ---------------------------------------------------------------------------

    def sweep(self) -> None:
        """Start push loops that were woken; let read loops notice broken sockets."""
        now = self.world.now
        for link in list(self.links):
            if link.closed:
                continue
            socket = link.socket
            if socket.cut and now >= socket.notice_at and link.read_op is None:
                self.world.log(f"{link.name} notices its socket broke")
                self.close(link)
                continue
            if link.work_op is None and link.work:
                link.work_op = link.work.popleft()()
            if link.pushing and link.push_op is None and link.wake:
                link.wake = False
                self.leave_line(link)
                link.runs_seen = self.runs_notified
                rid, request = link.runner_id, link.channel.push_request()
                link.push_op = self.op(
                    "push",
                    lambda rid=rid, request=request: self.core.push_work(
                        rid, self.world.now, request
                    ),
                    lambda result, link=link: self.pushed(link, result),
                )

        if now >= self.next_rescan:
            self.next_rescan = now + self.settings.poll_timeout_s
            if self.waiters:
                self.round_due = True
        if self.round_due and self.round_op is None:
            self.round_due = False
            if self.waiters:
                self.round_op = self.op(
                    "round",
                    lambda: self.store.runs.claimable(self.world.now, READ_LIMIT),
                    lambda _: None,
                )

    def tick(self, link: SimPump) -> None:
        self.handle(link, link.channel.tick(self.world.now))

    def reconcile(self) -> None:
        now = self.world.now
        if pinged := self.connections.take_pinged():
            self.store.runners.touch(pinged, now)
        done = self.store.reconcile(
            now,
            lost_after_s=self.settings.lost_after_s,
            timeout_grace_s=self.settings.timeout_grace_s,
            up_since=self.up_since,
        )
        if done.changed:
            self.world.log(f"reconcile: lost {done.lost_runners}, requeued {done.requeued}")
        if self.world.with_actors:  # thresholds, backoffs, alarms, lost and drained runners
            changes = self.store.actors.tick(now)
            for runner_id in changes.runners:
                self.notify(runner_topic(runner_id))
        if self.store.runs.has_claimable(now):  # as reconcile_once: only then are pollers woken
            self.notify(RUNS_AVAILABLE)
        self.next_reconcile = now + self.settings.reconcile_interval_s

    def deadlines(self) -> list[float]:
        now = self.world.now
        times = [self.next_reconcile, self.next_rescan] if self.up else []
        if self.round_op is not None and self.round_op.due > now:
            times.append(self.round_op.due)
        if self.restart_at is not None:
            times.append(self.restart_at)
        for link in self.links:
            if not link.closed:
                deadline = link.channel.next_deadline()
                if deadline is not None:
                    times.append(deadline)
                if link.socket.cut and link.socket.notice_at > now:
                    times.append(link.socket.notice_at)
            times.extend(op.due for op in link.ops() if op.due > now)
        return times

    # ---- crash and restart ---------------------------------------------------------------

    def crash(self) -> None:
        """The process dies: in-flight store calls stop after a random number of calls;
        every socket breaks; nothing in memory survives."""
        world = self.world
        for link in self.links:
            for op in link.ops():
                budget = world.rng.randrange(0, 6)
                try:
                    finished = self.store.run_until_crash(op.run, budget)
                except CorralError:
                    finished = True
                world.log(f"crash during {op.kind} of {link.name}: finished={finished}")
            if not link.socket.cut:
                world.cut(link.socket, notice=0.0)
        self.links.clear()
        self.connections = Connections()
        self.waiters = SocketWaiters()
        self.round_op, self.round_due = None, False
        self.up = False
        self.restart_at = world.now + world.rng.uniform(0.5, 6.0)

    def restart(self) -> None:
        self.up = True
        self.up_since = self.next_reconcile = self.world.now
        self.next_rescan = self.world.now + self.settings.poll_timeout_s
        self.restart_at = None
        self.core = LinkCore(self.store, self.settings)  # type: ignore[arg-type]
