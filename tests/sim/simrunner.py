"""A simulated runner process: the real ``RunnerConnection`` inside a model of its pump
(``runner/websocket.py``) and of the runner core (``runner/core.py``).

Its "processes" are records with a virtual duration: a ``start_run`` command makes one
(a repeated assignment is ignored; a newer attempt of a run it still holds replaces the
old one — ``runner/core.py`` today ignores that one too, see the report); it
reports ``started`` soon after and ``finished`` when its time is up; ``cancel_run`` stops
it with a ``cancelled`` report, ``abandon_run`` and ``StopAllWork`` stop it silently. As
in the real core, an attempt is held until its final report is acknowledged.

A runner of an actor world also hosts actors (``runner/actors.py``): ``start_actor`` makes a
``SimActor`` (a repeated command is ignored; a newer generation kills the older one), which
reports ``running`` a moment later; ``stop_actor`` makes it exit a little later with status
0; ``StopAllWork`` and a crash kill them all at once. During the storm a running actor,
now and then, asks to sleep or to stop, crashes, exits, sets an alarm or writes its KV
(through ``RunnerConnection.kv_request``, as the runner's local API does: the request is
kept and asked again after a reconnect until answered, whatever became of the actor).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.protocol import messages as wire
from corral.protocol.outputs import (
    Closed,
    Connected,
    Execute,
    KvAnswered,
    Reconnect,
    RunnerOutput,
    Send,
    StopAllWork,
)
from corral.protocol.runner import ConnectionState, RunnerConnection

if TYPE_CHECKING:
    from simworld import World

LOST_AFTER_S = 5.0
PING_INTERVAL_S = 1.0
ACK_INTERVAL_S = 2.0
MAX_BACKOFF_S = 4.0
DRAIN_GRACE_S = 4.0
STOP_MARGIN_S = 1.0  # what stopping a process takes; the runner stops that much early
# An actor kind's start and stop thresholds on the runner (``ActorKind``: 30 s each by
# default, as the coordinator's): scaled down as the lost threshold is; the actor world
# gives the coordinator's lifecycle the same (``simworld.actor_thresholds``).
ACTOR_THRESHOLD_S = 10.0  # twice the lost threshold, as 30 s is to 15 s


@dataclass(eq=False)
class SimAttempt:
    run_id: str
    attempt: int
    start_at: float
    finish_at: float
    running: bool = True  # the process runs (the invariant: never two for one run)
    started_sent: bool = False
    report_idx: int | None = None  # the final report, held until acknowledged


@dataclass(eq=False)
class SimActor:
    """One generation of one actor in a runner process (the invariant: never two live)."""

    actor_id: str
    generation: int
    identity: str  # the runner id it was started under (what its KV writes name)
    start_at: float  # it accepts connections then: reports running
    next_at: float  # its next doing of its own (storm only)
    give_up_at: float  # not accepting by then: the runner stops it (its start threshold)
    running: bool = False  # reported running
    stop_at: float | None = None  # stopping: it is gone then
    stop_code: int | None = 0  # … with this exit status reported
    writes: int = 0

    @property
    def misbehaves(self) -> bool:
        """Too slow to start (stopped, or to be), or to stop (to be killed): only the storm
        makes such processes."""
        too_slow = not self.running and self.stop_at is None and self.start_at >= self.give_up_at
        return too_slow or self.stop_code != 0


class RunnerProcess:
    def __init__(
        self, world: World, host: int, incarnation: int, slots: int, actor_slots: int = 0
    ) -> None:
        self.slots = slots
        self.actor_slots = actor_slots
        self.world = world
        self.host = host
        self.label = f"r{host}.{incarnation}"
        self.conn = RunnerConnection(
            name=f"host{host}",
            version="sim",
            total_slots=slots,
            labels=(),
            metadata={},
            rng=random.Random(world.rng.getrandbits(32)),
            max_backoff_s=MAX_BACKOFF_S,
            stop_margin_s=STOP_MARGIN_S,
            default_lost_threshold_s=LOST_AFTER_S,
            default_ping_interval_s=PING_INTERVAL_S,
            default_ack_interval_s=ACK_INTERVAL_S,
            actor_names=("echo",) if actor_slots else (),
            actor_slots=actor_slots,
        )
        self.socket: Any = None  # simnet.Socket: the one the pump reads now
        self.attempts: dict[str, SimAttempt] = {}
        self.actors: dict[str, SimActor] = {}
        self.last_executed: dict[str | None, int] = {}  # by runner id
        self.alive = True
        self.over = False  # closed for good: finish the work, then exit
        self.leave_at: float | None = None  # graceful shutdown: the drain deadline
        self.want_reconnect = False

    # ---- the socket ----------------------------------------------------------------------

    def connect(self) -> None:
        world = self.world
        if self.conn.state not in (ConnectionState.IDLE, ConnectionState.DISCONNECTED):
            return
        outputs = self.conn.connect(world.now)
        if world.coordinator.up and world.now >= world.partitioned_until[self.host]:
            self.socket = world.open_socket(self)
            world.log(f"{self.label} connects {self.socket.name}")
            self.carry_out(outputs)
        else:
            world.log(f"{self.label} cannot connect")
            self.carry_out(self.conn.connect_failed(world.now))

    def socket_ended(self) -> None:
        """The pump's socket is gone: closed by the coordinator, by us, or cut."""
        self.socket = None
        self.carry_out(self.conn.socket_closed(self.world.now))
        if self.want_reconnect and self.alive:
            self.want_reconnect = False
            self.connect()

    def close_socket(self, reason: str = "") -> None:
        if self.socket is not None:
            self.socket.close_from_runner(reason)
            self.socket_ended()

    def receive(self, text: str) -> None:
        now = self.world.now
        try:
            outputs = self.conn.receive(wire.decode(text, side="client"), now)
        except wire.ProtocolError as exc:
            self.world.log(f"{self.label} protocol error {exc.code}: closes its socket")
            self.close_socket()
            return
        self.carry_out(outputs)
        self.forget_acknowledged()
        if self.conn.state is ConnectionState.CLOSED:
            self.close_socket()

    # ---- outputs -------------------------------------------------------------------------

    def carry_out(self, outputs: list[RunnerOutput]) -> None:
        world = self.world
        for out in outputs:
            if isinstance(out, Send):
                if self.socket is not None:
                    self.socket.send_up(wire.encode(out.message))
            elif isinstance(out, Execute):
                self.execute(out.command)
            elif isinstance(out, Connected):
                world.log(f"{self.label} connected as {out.runner_id} (fresh={out.fresh})")
                if out.fresh:  # reports of the old identity fail: their attempts end …
                    carried = dict(out.carried)  # … but for late reports, renumbered
                    for run_id, a in list(self.attempts.items()):
                        if a.report_idx in carried:
                            a.report_idx = carried[a.report_idx]
                        else:
                            del self.attempts[run_id]
            elif isinstance(out, StopAllWork):
                world.log(f"{self.label} StopAllWork")
                self.stop_running()
                self.kill_actors()
            elif isinstance(out, KvAnswered):
                world.kv_answered(self, out.request_id, out.result)
            elif isinstance(out, Reconnect):
                if self.socket is None:
                    self.connect()
                else:  # the old socket is still closing: reconnect once it has
                    self.want_reconnect = True
            elif isinstance(out, Closed) and out.reconnect:
                world.log(f"{self.label} drops its socket: {out.reason}")
                self.close_socket()
            elif isinstance(out, Closed) and self.leave_at is None:
                world.log(f"{self.label} closed for good: {out.reason}")
                world.closed_for_good(self, out.reason)
                self.over = True

    def execute(self, command: wire.Indexed) -> None:
        world = self.world
        identity = self.conn.runner_id
        last = self.last_executed.get(identity, 0)
        if command.idx <= last:
            world.violation(
                f"{self.label} executes command {command.idx} of {identity} after {last}"
            )
        self.last_executed[identity] = command.idx
        body = command.body
        kind = body["type"]
        if kind in ("start_actor", "stop_actor"):
            self.execute_actor(command.idx, body)
            return
        run_id = str(body["run"]["run_id"] if kind == "start_run" else body["run_id"])
        held = self.attempts.get(run_id)
        world.log(f"{self.label} executes #{command.idx} {kind} {run_id}")
        if kind == "start_run":
            attempt = int(body["run"]["attempts"])
            if held is not None and held.attempt >= attempt:
                world.log(f"{self.label} already holds {run_id}/{held.attempt}: start ignored")
                return
            if held is not None:  # the old attempt is void: stop it, its report is stale
                world.log(f"{self.label} drops {run_id}/{held.attempt} for the newer attempt")
            rng, now = world.rng, world.now
            start_at = now + (0.0 if rng.random() < 0.5 else rng.uniform(0.0, 0.5))
            # Instantaneous, a few seconds, or longer than the lost threshold: a run that
            # outlives its runner's disconnection is what a lease has to protect.
            roll = rng.random()
            duration = (
                0.0 if roll < 0.2 else rng.uniform(0, 4) if roll < 0.85 else rng.uniform(4, 12)
            )
            finish_at = start_at + duration
            self.attempts[run_id] = SimAttempt(run_id, attempt, start_at, finish_at)
            world.process_started(self, run_id, attempt)
        elif kind == "cancel_run":
            if held is not None and held.running:
                held.running = False
                world.count("cancels obeyed")  # a stored cancel reached a running process
                self.report(held, "cancelled")
        elif kind == "abandon_run" and held is not None and held.running:
            held.running = False
            del self.attempts[run_id]

    # ---- the actors ----------------------------------------------------------------------

    def execute_actor(self, idx: int, body: dict[str, Any]) -> None:
        world = self.world
        actor_id, generation = str(body["actor_id"]), int(body["generation"])
        held = self.actors.get(actor_id)
        world.log(f"{self.label} executes #{idx} {body['type']} {actor_id}/{generation}")
        if body["type"] == "stop_actor":
            if held is not None and held.generation == generation and held.stop_at is None:
                self.terminate(held, asked=True)
            return
        if held is not None and held.generation >= generation:
            world.log(f"{self.label} already runs {actor_id}/{held.generation}: start ignored")
            return
        if held is not None:  # an older generation still here: killed (ActorHost.start)
            self.actor_ended(held, None)
        rng, now = world.rng, world.now
        # Most start at once or soon; during the storm some slowly, now and then later than
        # the threshold.
        roll = rng.random() if now < world.storm_end else rng.random() * 0.9
        start_at = now + (
            0.0 if roll < 0.5 else rng.uniform(0.0, 1.0) if roll < 0.9 else rng.uniform(1.0, 15.0)
        )
        assert self.conn.runner_id is not None
        self.actors[actor_id] = SimActor(
            actor_id,
            generation,
            self.conn.runner_id,
            start_at,
            next_at=start_at + rng.expovariate(0.5),
            give_up_at=now + ACTOR_THRESHOLD_S,
        )
        world.actor_started(self, actor_id, generation)

    def terminate(self, actor: SimActor, *, asked: bool) -> None:
        """SIGTERM (``ActorHost.stop``, or a start that took too long): most exit soon
        (status 0 when told to stop; no status when the runner gave up on its start);
        during the storm some do not, and are killed (SIGKILL) after the stop threshold."""
        rng, now = self.world.rng, self.world.now
        slow = rng.random() < 0.15 and now < self.world.storm_end  # processes behave after
        delay = rng.uniform(1.0, 2 * ACTOR_THRESHOLD_S) if slow else rng.uniform(0.0, 1.0)
        if delay < ACTOR_THRESHOLD_S:
            actor.stop_at, actor.stop_code = now + delay, 0 if asked else None
        else:
            actor.stop_at, actor.stop_code = now + ACTOR_THRESHOLD_S, 137 if asked else None

    def actor_ended(self, actor: SimActor, code: int | None) -> None:
        """Its process is gone: say so (``stopped`` with its exit status; none when the
        runner ended it of its own accord)."""
        del self.actors[actor.actor_id]
        self.world.log(f"{self.label} actor {actor.actor_id}/{actor.generation} exits {code}")
        body = {"type": "actor_state", "actor_id": actor.actor_id,
                "generation": actor.generation, "state": "stopped"}  # fmt: skip
        self.send(body if code is None else {**body, "code": code})
        roll = self.world.rng.random()
        if actor.running and roll < 0.35:
            # A call to the local API it made just before it ended: the API had checked
            # the generation was there, and asks after the end was reported.
            if roll < 0.25:
                self.kv_write(actor)
            else:
                intent = "sleep" if roll < 0.3 else "stop"
                self.actor_event(actor, {"type": "actor_intent", "intent": intent})

    def kill_actors(self) -> None:
        for actor in list(self.actors.values()):
            self.actor_ended(actor, None)

    def actor_progress(self) -> None:
        world = self.world
        now = world.now
        for actor in list(self.actors.values()):
            if actor.stop_at is not None:
                if now >= actor.stop_at:
                    self.actor_ended(actor, actor.stop_code)
                continue
            if not actor.running:
                if now >= actor.start_at:
                    actor.running = True
                    self.actor_event(actor, {"type": "actor_state", "state": "running"})
                elif now >= actor.give_up_at:
                    self.world.log(f"{self.label} gives up on {actor.actor_id}/{actor.generation}")
                    self.terminate(actor, asked=False)
                continue
            if now < actor.next_at:
                continue
            actor.next_at = now + world.rng.expovariate(0.5)
            if now < world.storm_end:
                self.actor_does(actor)
            elif world.rng.random() < 0.3:
                self.kv_write(actor)

    def actor_does(self, actor: SimActor) -> None:
        """Something a running actor does of its own, now and then, during the storm."""
        rng, now = self.world.rng, self.world.now
        roll = rng.random()
        if roll < 0.35:
            self.kv_write(actor)
        elif roll < 0.5:
            self.actor_event(actor, {"type": "actor_intent", "intent": "sleep"})
        elif roll < 0.58:
            self.world.may_destroy.add(actor.actor_id)  # its graceful exit destroys it
            self.actor_event(actor, {"type": "actor_intent", "intent": "stop"})
        elif roll < 0.7:
            self.actor_ended(actor, 1)  # it crashes
        elif roll < 0.75:
            self.world.may_destroy.add(actor.actor_id)
            self.actor_ended(actor, 0)  # it exits by itself
        elif roll < 0.85:
            at = now + rng.uniform(0.5, 10.0) if rng.random() < 0.8 else None
            self.actor_event(actor, {"type": "actor_alarm", "at": at})

    def actor_event(self, actor: SimActor, body: dict[str, Any]) -> None:
        self.send({**body, "actor_id": actor.actor_id, "generation": actor.generation})

    def kv_write(self, actor: SimActor) -> None:
        """A KV put naming who writes it: the world checks it against the placement."""
        if self.conn.state is ConnectionState.CLOSED:
            return  # closed for good: the runner is on its way out
        actor.writes += 1
        value = f"{actor.identity}/{actor.generation}/{actor.writes}"
        op = {"op": "put", "entries": {"w": value}}
        _, outputs = self.conn.kv_request(
            actor.actor_id, op, self.world.now, generation=actor.generation
        )
        self.world.count("kv writes")
        self.carry_out(outputs)

    # ---- the attempts --------------------------------------------------------------------

    def progress(self) -> None:
        """Send what the processes have to say by now (started, finished)."""
        now = self.world.now
        for attempt in list(self.attempts.values()):
            if not attempt.running:
                continue
            if not attempt.started_sent and now >= attempt.start_at:
                attempt.started_sent = True
                self.send({"type": "started", "run_id": attempt.run_id, "attempt": attempt.attempt})
            if now >= attempt.finish_at:
                attempt.running = False
                rate_limited = self.world.rng.random() < 0.1
                self.report(attempt, "pending" if rate_limited else "completed")
        self.actor_progress()
        if self.leave_at is not None and (
            (not self.attempts and not self.actors) or now >= self.leave_at
        ):
            self.leave()
        elif self.over and not any(a.running for a in self.attempts.values()):
            self.attempts.clear()  # its reports can never be acknowledged now
            self.world.process_exited(self, "closed for good")

    def next_deadline(self) -> float | None:
        times = [self.conn.next_deadline(), self.leave_at]
        for a in self.attempts.values():
            if a.running:
                times.append(a.finish_at if a.started_sent else a.start_at)
        for actor in self.actors.values():
            if actor.stop_at is not None:
                times.append(actor.stop_at)
            elif actor.running:
                times.append(actor.next_at)
            else:
                times.append(min(actor.start_at, actor.give_up_at))
        return min((t for t in times if t is not None), default=None)

    def report(self, attempt: SimAttempt, status: str) -> None:
        if not attempt.started_sent:
            attempt.started_sent = True
            self.send({"type": "started", "run_id": attempt.run_id, "attempt": attempt.attempt})
        body: dict[str, Any] = {
            "type": "finished",
            "run_id": attempt.run_id,
            "attempt": attempt.attempt,
            "status": status,
            "exit_code": 0 if status == "completed" else None,
        }
        if status == "pending":
            body["retry_after_s"] = 0.3
            body["error"] = "rate limited"
        self.send(body)
        attempt.report_idx = self.conn.unacked_events[-1].idx
        self.world.log(f"{self.label} {attempt.run_id} attempt {attempt.attempt} → {status}")

    def send(self, body: dict[str, Any]) -> None:
        self.carry_out(self.conn.send_event(body, self.world.now))

    def forget_acknowledged(self) -> None:
        pending = self.conn.unacked_events
        first = pending[0].idx if pending else None
        for run_id, a in list(self.attempts.items()):
            if a.report_idx is not None and (first is None or a.report_idx < first):
                del self.attempts[run_id]

    def stop_running(self) -> None:
        for run_id, a in list(self.attempts.items()):
            if a.running:
                del self.attempts[run_id]

    # ---- the process ---------------------------------------------------------------------

    def tick(self) -> None:
        self.carry_out(self.conn.tick(self.world.now))
        self.progress()

    def begin_leaving(self) -> None:
        """SIGTERM: stop taking work, finish (up to the drain grace), close and exit."""
        if self.leave_at is None and not self.over:
            self.world.log(f"{self.label} drains")
            self.leave_at = self.world.now + DRAIN_GRACE_S
            self.carry_out(self.conn.stopping(self.world.now))

    def leave(self) -> None:
        self.stop_running()
        for actor in list(self.actors.values()):  # SIGTERM at the end of the grace: the
            self.actor_ended(actor, None)  # runner's own accord, no exit status
        self.carry_out(self.conn.shutdown(self.world.now))
        self.close_socket(wire.REASON_RUNNER_SHUTDOWN)
        self.world.process_exited(self, "drained")

    def crash(self) -> None:
        self.attempts.clear()
        self.actors.clear()
        if self.socket is not None:
            sock, self.socket = self.socket, None
            self.world.cut(sock)
        self.world.process_exited(self, "crashed")
