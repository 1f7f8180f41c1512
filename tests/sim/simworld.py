"""The deterministic simulation of corral's runner link (DESIGN.md §7).

One ``World`` per seed: a virtual clock, a seeded scheduler, a coordinator
(``simcoordinator``: real ``RunnerChannel``, ``LinkCore`` and ``Store`` on SQLite) and
1–3 runner hosts (``simrunner``: real ``RunnerConnection``), joined by ``simnet`` sockets.
Each step the scheduler picks one thing that can happen — deliver a frame, finish a
store call, let time pass (timers: pings, acks, backoff, lost timers, reconcile every
virtual second, processes starting and ending, clients creating and cancelling runs),
or, while the storm lasts, a fault: duplicate a frame, cut a socket, partition a host,
a socket's coordinator end vanishing (half-open), crash the coordinator or a runner
process, drain a runner. The invariants are checked
after every step; after the storm the world runs quietly until every run has ended.

Invariants:
- a run never runs in two simulated processes at once, and a runner never runs more
  attempts than it has slots (work goes out as soon as a final report is read);
- every run status change is one the transition table allows (a pending or lost run ends
  at once only by a late report of the attempt it was lost with); a completed run stays
  completed; no effect is applied twice (the same change of the same attempt, two
  terminal changes of one run);
- each runner identity executes command indexes in increasing order, with no gap (a
  skipped index is a command that will never run: a client's cancel is a stored command
  too, ``RunStore.request_cancel``), and no event index is skipped;
- a runner is never told it was evicted on its newest socket;
- liveness: once the faults stop (the coordinator back up, hosts reachable, crashed
  runners restarted), every run ends: completed, or cancelled if a client asked, or — one
  run in four has a single attempt — failed lost (that attempt lost, and no report of it
  in the grace).

An actor world (``with_actors``) also has actors: runners host a kind in actor slots,
clients create actors and wake, sleep and destroy them through the store's API, the actor
processes come and go (``simrunner``), and the coordinator's reconcile ticks the actors'
timers. More invariants, also after every step:
- never two live generations: no actor has a process in two runner processes at once;
- no KV write is applied but from the runner and generation the actor is placed on (a
  trigger logs each applied write beside the placement of its transaction);
- an actor is destroyed only when something asked for it: a client, a stop intent or an
  exit of its own process, or its crash policy;
- the tables agree with the lifecycle (a placement exactly for a placed actor, with its
  generation, within its runner's slots; the queue exactly the pending actors), and the
  pool's wanted slots (what the autoscaler counts) never drift from the placed and
  queued actors;
- liveness: once the faults stop, every actor a client asks for (a wake, again when it
  stopped while asked, at most ``MAX_REWAKES`` times more, as the gateway does) ends
  connectable — running in the store, and its process running that generation on the
  runner it is placed on — unless it was destroyed; capacity exists for all of them.

What is modelled rather than real: the two pumps (``SocketPump``, the runner's
``WebSocketTransport`` and core), the network, and processes. Each model follows its
module, with the differences said in its docstring.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simcoordinator import SimCoordinator, settings
from simnet import CLOSE, Socket
from simrunner import ACTOR_THRESHOLD_S, LOST_AFTER_S, RunnerProcess, SimActor
from simstore import open_copy, sequential_ids

from corral.actors import lifecycle as lc
from corral.actors.lifecycle import ALWAYS_PLACED, ActorState, CrashPolicy
from corral.actors.model import NewActor
from corral.coordinator.gateway import MAX_REWAKES
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic
from corral.errors import IllegalTransition
from corral.runs import LATE_REPORT, TERMINAL, TRANSITIONS, NewRun, RunStatus, RunType

T0 = 1_000_000.0
# CORRAL_SIM_TRACE=all keeps every step (for a failing seed), else the last 30.
TRACE_STEPS = None if os.environ.get("CORRAL_SIM_TRACE") == "all" else 30
MAX_STEPS = 30_000


class Violation(Exception):
    pass


@dataclass
class Outcome:
    seed: int
    steps: int
    virtual_s: float
    failure: str | None = None
    stats: dict[str, int] = field(default_factory=dict)


class World:
    def __init__(self, seed: int, store: Any, with_actors: bool = False) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.now = T0
        self.step_no = 0
        self.trace: deque[tuple[int, list[float], list[object]]] = deque(maxlen=TRACE_STEPS)
        self.lines: list[object] = []  # this step's trace: strings, or frames to describe
        self.stats: dict[str, int] = {}
        # The shape of this world.
        self.hosts = rng.randint(1, 3)
        self.slots = [rng.randint(1, 3) for _ in range(self.hosts)]
        self.n_runs = rng.randint(3, 15)
        self.storm_end = T0 + rng.uniform(4.0, 18.0)
        self.fault_every_s = rng.choice([1.5, 3.0, 6.0, 1e9])
        self.dup_weight = rng.choice([0.0, 0.3, 1.0])
        self.slow_store = rng.random() < 0.5
        self.quiet_limit = self.storm_end + 40.0 + 5.0 * self.n_runs
        # Pings as often as reconciles (1 s), or less often, as by default (3 s vs 1 s).
        self.ping_interval_s = rng.choice([1.0, 2.0, 2.5])
        # The parts.
        self.coordinator = SimCoordinator(self, store, settings(self.ping_interval_s))
        self.store = self.coordinator.store
        self.partitioned_until = [0.0] * self.hosts
        self.runners: list[RunnerProcess | None] = [None] * self.hosts
        self.incarnations = [0] * self.hosts
        self.respawn_at: list[float | None] = [T0 + rng.uniform(0, 1) for _ in range(self.hosts)]
        self.sockets: list[Socket] = []
        self.socket_seq = 0
        self.late: list[tuple[Socket, str, str]] = []
        self.next_fault = T0 + rng.expovariate(1.0 / self.fault_every_s)
        # Clients: runs created during the storm, some cancelled a little later.
        self.client_plan: list[tuple[float, str, int]] = []
        for i in range(self.n_runs):
            at = T0 + rng.uniform(0.0, self.storm_end - T0)
            self.client_plan.append((at, "create", i))
            if rng.random() < 0.2:
                self.client_plan.append((at + rng.uniform(0.0, 6.0), "cancel", i))
        self.client_plan.sort()
        self.created: list[str] = []
        self.cancel_asked: set[str] = set()
        self.one_attempt: set[str] = set()  # runs created with one attempt
        # What the invariants remember.
        self.status: dict[str, str] = {}
        self.history: dict[str, list[str]] = {}  # each run's status changes, for a failure
        self.seen: set[tuple[str, int, str, str]] = set()
        self.last_change: dict[str, tuple[str, str, int]] = {}  # (old, new, attempts) by run
        self.terminal_changes: dict[str, int] = {}
        self.log_seq = 0
        # A second connection: its data_version changes when the store commits a write.
        self.watch = sqlite3.connect(store.db.path, isolation_level=None)
        self.data_version = -1
        # Actors (an actor world only: a world of runs draws nothing more from its rng).
        self.with_actors = with_actors
        self.actor_slots = [0] * self.hosts
        self.actor_ids: list[str] = []
        self.kv_seq = 0
        self.calm = False  # the faults are over and every runner is back: clients insist
        self.asked: dict[str, int] = {}  # wakes a client sent each actor since the calm
        self.stopping_when_woken: set[str] = set()
        # Actors something asked to end: a client's destroy, a stop intent of the process
        # it has now, an exit of its own, or its crash policy (destroy).
        self.may_destroy: set[str] = set()
        self.gone_at_calm = 0
        if with_actors:
            self.actor_slots = [rng.randint(1, 2) for _ in range(self.hosts)]
            n_actors = rng.randint(1, sum(self.actor_slots))  # capacity for all of them
            for i in range(n_actors):
                self.client_plan.append((T0 + rng.uniform(0.0, 2.0), "actor", i))
            for _ in range(rng.randint(0, 12)):
                at = T0 + rng.uniform(0.0, self.storm_end - T0)
                what = rng.choices(["wake", "sleep", "destroy"], [6, 3, 0.3])[0]
                self.client_plan.append((at, what, rng.randrange(n_actors)))
            self.client_plan.sort()

    # ---- the trace -----------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.lines.append(line)

    def log_frame(self, prefix: str, text: str) -> None:
        """A frame, described only if the trace is printed (decoding costs)."""
        self.lines.append(_Frame(prefix, text))

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def violation(self, message: str) -> None:
        raise Violation(message)

    # ---- running -------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            self.step_no += 1
            self.lines = []
            at = [self.now]
            self.trace.append((self.step_no, at, self.lines))
            self.step()
            at[0] = self.now
            if self.coordinator.up:
                self.coordinator.sweep()
            self.sockets = [s for s in self.sockets if _in_use(s)]
            self.check()
            if self.with_actors and self.now >= self.storm_end:
                self.begin_calm()
            if (
                self.now >= self.storm_end
                and self.finished()
                and (not self.with_actors or self.actors_connectable())
            ):
                break
            if self.now > self.quiet_limit:
                stuck = [r for r, s in self.status.items() if s not in _TERMINAL]
                if stuck:
                    self.violation(
                        "liveness: runs not ended after the quiet phase: "
                        + "; ".join(f"{r} ({' → '.join(self.history[r])})" for r in stuck)
                    )
                if self.with_actors and self.now > self.quiet_limit + self.actors_may_wait():
                    self.violation(
                        "liveness: actors not connectable after the quiet phase: "
                        + self.stuck_actors()
                    )
            if self.step_no > MAX_STEPS:
                self.violation("the world did not settle within the step limit")
        self.final_check()

    def step(self) -> None:
        """Pick one thing that can happen now, weighted, and do it."""
        actions: list[tuple[float, Callable[..., None], Any]] = []
        add = actions.append
        coordinator = self.coordinator
        storm = self.now < self.storm_end
        for sock in self.sockets:
            readable = sock.link is not None and coordinator.can_read(sock.link)
            if sock.up and readable:
                add((4.0, coordinator.deliver_up, sock))
            if sock.down and sock.runner.socket is sock:
                add((4.0, self.deliver_down, sock))
            if storm and self.dup_weight and not sock.cut:
                if sock.last_up and readable and not sock.runner_done:
                    add((self.dup_weight, self.duplicate_up, sock))
                if sock.last_down and sock.runner.socket is sock and not sock.server_done:
                    add((self.dup_weight, self.duplicate_down, sock))
        now = self.now
        for link in coordinator.links:
            for op in (link.read_op, link.work_op, link.push_op):
                if op is not None and op.due <= now:
                    add((3.0, self.complete, (link, op)))
        round_op = coordinator.round_op
        if coordinator.up and round_op is not None and round_op.due <= now:
            add((3.0, self.complete_round, None))
        if self.late:
            add((0.5, self.deliver_late, None))
        add((2.0, self.advance, None))
        roll = self.rng.random() * sum(a[0] for a in actions)
        chosen = actions[-1]
        for entry in actions:
            roll -= entry[0]
            if roll < 0:
                chosen = entry
                break
        _, action, arg = chosen
        if arg is None:
            action()
        else:
            action(arg)

    # ---- network -------------------------------------------------------------------------

    def open_socket(self, runner: RunnerProcess) -> Socket:
        self.socket_seq += 1
        sock = Socket(self.socket_seq, runner)
        self.sockets.append(sock)
        self.coordinator.accept(sock)
        return sock

    def deliver_down(self, sock: Socket) -> None:
        text = sock.down.popleft()
        runner = sock.runner
        if text is CLOSE:
            self.log(f"{runner.label} reads the close of {sock.name}")
            runner.socket_ended()
            return
        self.log_frame(f"{sock.name} → {runner.label}: ", text)
        sock.last_down = text
        runner.receive(text)

    def duplicate_up(self, sock: Socket) -> None:
        self.count("duplicates")
        assert sock.last_up is not None and sock.link is not None
        self.log_frame(f"{sock.name} duplicates ↑ ", sock.last_up)
        self.coordinator.receive(sock.link, sock.last_up)

    def duplicate_down(self, sock: Socket) -> None:
        self.count("duplicates")
        assert sock.last_down is not None
        self.log_frame(f"{sock.name} duplicates ↓ ", sock.last_down)
        sock.runner.receive(sock.last_down)

    def deliver_late(self) -> None:
        sock, direction, frame = self.late.pop(self.rng.randrange(len(self.late)))
        # Its socket is dead: the pump that read it has ended, so nobody reads this.
        assert sock.cut
        self.log_frame(f"late {direction} frame of dead {sock.name} dropped: ", frame)

    def cut(self, sock: Socket, notice: float | None = None, *, half_open: bool = False) -> None:
        """The connection breaks; the coordinator notices after ``notice`` seconds (its
        session's lost timer closes the link if it never does). ``half_open``: the
        runner's end never notices; only the silence on it can tell the runner."""
        self.count("cuts")
        if notice is None:
            roll = self.rng.random()
            notice = 0.0 if roll < 0.5 else self.rng.uniform(0.0, 3.0) if roll < 0.85 else 1e9
        self.log(f"{sock.name} cut (the coordinator notices in {notice:.2f} s)")
        sock.break_off(self.rng, self.late)
        sock.notice_at = self.now + notice
        if sock.runner.socket is sock and not half_open:
            sock.runner.socket_ended()

    def complete(self, link_op: tuple[Any, Any]) -> None:
        link, op = link_op
        self.log(f"{link.name} {op.kind} done")
        self.coordinator.complete(link, op)

    def complete_round(self) -> None:
        self.log("a round of the socket waiters reads the claimable runs")
        self.coordinator.complete_round()

    # ---- time ----------------------------------------------------------------------------

    def advance(self) -> None:
        deadlines = self.deadlines()
        target = self.now + self.rng.expovariate(4.0)
        soonest = min(deadlines, default=target)
        self.now = max(self.now, min(target, soonest))
        self.fire_timers()

    def deadlines(self) -> list[float]:
        times = self.coordinator.deadlines()
        times += [t for t in self.respawn_at if t is not None]
        if self.client_plan:
            times.append(self.client_plan[0][0])
        if self.now < self.storm_end:
            times += [self.next_fault, self.storm_end]
        for runner in self.runners:
            if runner is not None and runner.alive:
                deadline = runner.next_deadline()
                if deadline is not None:
                    times.append(deadline)
        return [t for t in times if t > self.now] or [self.now]

    def fire_timers(self) -> None:
        now, coordinator = self.now, self.coordinator
        if self.now >= self.storm_end and any(self.partitioned_until):
            self.partitioned_until = [0.0] * self.hosts  # the storm is over
        if coordinator.restart_at is not None and now >= coordinator.restart_at:
            self.log("coordinator restarts")
            coordinator.restart()
        for host, at in enumerate(self.respawn_at):
            if at is not None and now >= at:
                self.respawn_at[host] = None
                self.spawn(host)
        while self.client_plan and self.client_plan[0][0] <= now:
            if not coordinator.up:
                break  # clients retry once it is back
            _, kind, i = self.client_plan.pop(0)
            self.client(kind, i)
        if coordinator.up and now >= coordinator.next_reconcile:
            coordinator.reconcile()
        for link in list(coordinator.links):
            deadline = link.channel.next_deadline()
            if not link.closed and deadline is not None and now >= deadline:
                coordinator.tick(link)
        for runner in self.runners:
            if runner is not None and runner.alive:
                deadline = runner.next_deadline()
                if deadline is not None and now >= deadline:
                    runner.tick()
        if now < self.storm_end and now >= self.next_fault:
            self.next_fault = now + self.rng.expovariate(1.0 / self.fault_every_s)
            self.fault()

    # ---- clients -------------------------------------------------------------------------

    def client(self, kind: str, i: int) -> None:
        if kind in ("actor", "wake", "sleep", "destroy"):
            self.actor_client(kind, i)
            return
        if kind == "create":
            # Every fourth run has one attempt: lost, it waits lost for its runner's late
            # report (a grace), then fails (``store.reconcile.fail_lost``).
            attempts = 1 if len(self.created) % 4 == 3 else 1_000_000
            spec = NewRun(type=RunType.COMMAND, command=("true",), max_attempts=attempts)
            (run,) = self.store.runs.create_many([spec], self.now)
            if attempts == 1:
                self.one_attempt.add(run.id)
            self.created.append(run.id)
            self.status[run.id] = str(RunStatus.PENDING)
            self.history[run.id] = [f"pending at {self.now - T0:.3f}"]
            self.log(f"client creates {run.id}")
            self.coordinator.notify(RUNS_AVAILABLE)
            return
        run_id = self.created[i] if i < len(self.created) else None
        if run_id is None:
            return
        self.cancel_asked.add(run_id)
        try:
            run = self.store.runs.request_cancel(run_id, self.now)
        except IllegalTransition:
            self.log(f"client cancels {run_id}: already ended")
            return
        self.log(f"client cancels {run_id} ({run.status})")
        if run.runner_id:
            self.coordinator.notify(runner_topic(run.runner_id))

    def actor_client(self, kind: str, i: int) -> None:
        if kind == "actor":
            policy = self.rng.choice(list(CrashPolicy))
            actor, _, changes = self.store.actors.create(
                NewActor("echo", f"k{i}", crash_policy=policy), self.now
            )
            self.actor_ids.append(actor.id)
            if policy is CrashPolicy.DESTROY:
                self.may_destroy.add(actor.id)
            self.log(f"client creates {actor.id} ({policy}): {actor.state}")
        elif i >= len(self.actor_ids):
            return
        else:
            if kind == "destroy":
                self.may_destroy.add(self.actor_ids[i])
            event = {"wake": lc.Wake(), "sleep": lc.Sleep(), "destroy": lc.Destroy()}[kind]
            actor, changes = self.store.actors.signal(self.actor_ids[i], event, self.now)
            self.log(f"client: {kind} {actor.id}: now {actor.state}")
        for runner_id in changes.runners:
            self.coordinator.notify(runner_topic(runner_id))

    def actor_started(self, runner: RunnerProcess, actor_id: str, generation: int) -> None:
        self.count("actor processes")

    def kv_answered(self, runner: RunnerProcess, request_id: int, result: dict[str, Any]) -> None:
        outcome = "ok" if result.get("ok") else str(result.get("code"))
        self.count(f"kv {outcome}")
        self.log(f"{runner.label} kv request {request_id}: {outcome}")

    # ---- runner processes ----------------------------------------------------------------

    def spawn(self, host: int) -> None:
        self.incarnations[host] += 1
        runner = RunnerProcess(
            self, host, self.incarnations[host], self.slots[host], self.actor_slots[host]
        )
        self.runners[host] = runner
        self.log(f"{runner.label} starts")
        runner.connect()

    def process_started(self, runner: RunnerProcess, run_id: str, attempt: int) -> None:
        self.count("processes")

    def process_exited(self, runner: RunnerProcess, why: str) -> None:
        self.log(f"{runner.label} exits ({why})")
        runner.alive = False
        self.respawn_at[runner.host] = self.now + self.rng.uniform(0.2, 2.0)

    def closed_for_good(self, runner: RunnerProcess, reason: str) -> None:
        # Only an older socket than the runner's newest could be evicted, and nothing in
        # the simulation stops a runner: the newest socket told this is a coordinator bug.
        self.violation(f"{runner.label} was closed for good on its newest socket: {reason}")

    # ---- faults --------------------------------------------------------------------------

    def fault(self) -> None:
        rng, coordinator = self.rng, self.coordinator
        alive = [r for r in self.runners if r is not None and r.alive]
        kinds = ["cut", "half_open", "partition", "partition", "crash_runner", "drain_runner"]
        if coordinator.up:
            kinds.append("crash_coordinator")
        kind = rng.choice(kinds)
        self.count(kind)
        if kind == "crash_coordinator":
            self.log("coordinator crashes")
            coordinator.crash()
            return
        if not alive:
            return
        runner = rng.choice(alive)
        if kind in ("cut", "half_open"):
            if runner.socket is not None and not runner.socket.cut:
                self.cut(runner.socket, half_open=kind == "half_open")
        elif kind == "partition":
            until = self.now + rng.uniform(1.0, 3.0 * LOST_AFTER_S)
            self.partitioned_until[runner.host] = until
            self.log(f"host {runner.host} partitioned until {until - T0:.3f}")
            if runner.socket is not None and not runner.socket.cut:
                self.cut(runner.socket)
        elif kind == "crash_runner":
            self.log(f"{runner.label} crashes")
            runner.crash()
        else:
            runner.begin_leaving()

    # ---- invariants ----------------------------------------------------------------------

    def check(self) -> None:
        holders: dict[str, str] = {}
        for runner in self.runners:
            if runner is None or not runner.alive:
                continue
            if runner.conn.gaps:
                self.violation(f"{runner.label} received a command index gap")
            running = sum(a.running for a in runner.attempts.values())
            if running > runner.slots:
                self.violation(f"{runner.label} runs {running} attempts on {runner.slots} slots")
            for attempt in runner.attempts.values():
                if attempt.running:
                    if attempt.run_id in holders:
                        self.violation(
                            f"{attempt.run_id} runs twice: in {holders[attempt.run_id]} "
                            f"and {runner.label} (store: "
                            + " → ".join(self.history.get(attempt.run_id, []))
                            + ")"
                        )
                    holders[attempt.run_id] = runner.label
        for link in self.coordinator.links:
            if link.channel.session.gaps:
                self.violation(f"{link.name} received an event index gap")
        if self.with_actors:
            self.check_live_generations()
        (version,) = self.watch.execute("PRAGMA data_version").fetchone()
        if version != self.data_version:
            self.data_version = version
            self.read_transitions()
            if self.with_actors:
                self.check_kv_writes()
                self.check_actor_tables()
                self.insist()

    # ---- actors' invariants --------------------------------------------------------------

    def check_live_generations(self) -> None:
        holders: dict[str, tuple[str, SimActor]] = {}
        for runner in self.runners:
            if runner is None or not runner.alive:
                continue
            for actor in runner.actors.values():
                if actor.actor_id in holders:
                    label, other = holders[actor.actor_id]
                    self.violation(
                        f"two live generations of {actor.actor_id}: {other.generation} in "
                        f"{label} and {actor.generation} in {runner.label}"
                    )
                holders[actor.actor_id] = (runner.label, actor)

    def check_kv_writes(self) -> None:
        rows = self.watch.execute(
            "SELECT seq, actor_id, value, runner_id, generation FROM sim_kv_writes "
            "WHERE seq > ? ORDER BY seq",
            (self.kv_seq,),
        ).fetchall()
        for seq, actor_id, value, runner_id, generation in rows:
            self.kv_seq = seq
            writer, written_gen, _ = value.split("/")
            self.log(f"  store: KV of {actor_id} written by {value}")
            if (writer, int(written_gen)) != (runner_id, generation):
                self.violation(
                    f"a KV write of {actor_id} by {writer} (generation {written_gen}) was "
                    f"applied while it is placed on {runner_id} (generation {generation})"
                )

    def check_actor_tables(self) -> None:
        db = self.watch
        placements = {
            a: (r, g)
            for a, r, g in db.execute(
                "SELECT actor_id, runner_id, generation FROM actor_placements"
            )
        }
        queued = {a for (a,) in db.execute("SELECT actor_id FROM actor_queue")}
        slots = dict(db.execute("SELECT runner_id, slots FROM actor_hosts").fetchall())
        wanted = 0
        for actor_id, state, generation in db.execute("SELECT id, state, generation FROM actors"):
            state = ActorState(state)
            if state is ActorState.DESTROYED and actor_id not in self.may_destroy:
                self.violation(f"{actor_id} was destroyed, though nothing asked for it")
            placed = actor_id in placements
            if state is not ActorState.SLEEPING and placed != (state in ALWAYS_PLACED):
                self.violation(f"{actor_id} is {state} but {'' if placed else 'not '}placed")
            if placed and placements[actor_id][1] != generation:
                self.violation(
                    f"{actor_id} is placed as {placements[actor_id]}, generation {generation}"
                )
            if (actor_id in queued) != (state is ActorState.PENDING):
                self.violation(
                    f"{actor_id} is {state} and {'' if actor_id in queued else 'not '}queued"
                )
            wanted += placed or state is ActorState.PENDING
        counted = self.store.actors.wanted_slots("default")
        if counted != wanted:
            self.violation(f"wanted slots {counted}, but {wanted} actors are placed or queued")
        used: dict[str, int] = {}
        for runner_id, _ in placements.values():
            used[runner_id] = used.get(runner_id, 0) + 1
        for runner_id, n in used.items():
            if n > slots.get(runner_id, 0):
                self.violation(
                    f"{n} actors placed on {runner_id}, which hosts {slots.get(runner_id)}"
                )

    def insist(self) -> None:
        """In the calm, a client wants every actor: one that fell asleep is woken again
        (the gateway: again when it stopped while waited for, ``MAX_REWAKES`` times). A
        wake must be enough, though — to be woken again, the actor must have been told to
        stop when it was woken (its stop ends as the decision table says, not by waking),
        or a runner must have been lost or stopped since."""
        if not self.calm or not self.coordinator.up:
            return
        rows = self.watch.execute(
            "SELECT a.id FROM actors a LEFT JOIN actor_placements p "
            "ON p.actor_id = a.id WHERE a.state = 'sleeping' AND p.actor_id IS NULL"
        ).fetchall()
        for (actor_id,) in rows:
            n = self.asked.get(actor_id, 0) + 1
            if n > 1 + MAX_REWAKES:
                self.violation(f"{actor_id} asleep again after {n - 1} wakes in the calm")
            if actor_id not in self.stopping_when_woken and not self.runners_gone():
                self.violation(f"{actor_id} was woken in the calm, yet fell asleep again")
            self.wake(actor_id, n)

    def wake(self, actor_id: str, n: int) -> None:
        self.asked[actor_id] = n
        actor, changes = self.store.actors.signal(actor_id, lc.Wake(), self.now)
        self.log(f"client wakes {actor_id} (wake {n} in the calm): now {actor.state}")
        for runner_id in changes.runners:
            self.coordinator.notify(runner_topic(runner_id))

    def runners_gone(self) -> bool:
        """Has a runner been lost or stopped since the calm began?"""
        (gone,) = self.watch.execute(
            "SELECT COUNT(*) FROM runners WHERE state IN ('lost', 'stopped')"
        ).fetchone()
        return bool(gone > self.gone_at_calm)

    def begin_calm(self) -> bool:
        """After the storm, once every runner is back and linked, the coordinator has
        applied all its runners said (an actor's sleep intent of the storm is not news
        that comes after the wake) and taken back the actors of runners gone, and no
        process misbehaves as the storm made it: the clients insist."""
        if self.calm:
            return True
        if not self.coordinator.up:
            return False
        for runner in self.runners:
            if runner is None or not runner.alive or runner.socket is None or runner.socket.cut:
                return False
            if runner.conn.state != "active" or runner.leave_at is not None or runner.over:
                return False
            if runner.conn.unacked_events:  # what its actors said in the storm is applied
                return False
            if any(a.misbehaves for a in runner.actors.values()):  # as the storm made it
                return False
        # And no actor is still placed on a runner identity of before (lost, or not yet).
        live = {r.conn.runner_id for r in self.runners if r is not None}
        placed = self.watch.execute("SELECT runner_id FROM actor_placements").fetchall()
        if any(runner_id not in live for (runner_id,) in placed):
            return False
        self.calm = True
        self.log("calm: every runner is back; clients want every actor")
        (self.gone_at_calm,) = self.watch.execute(
            "SELECT COUNT(*) FROM runners WHERE state IN ('lost', 'stopped')"
        ).fetchone()
        self.stopping_when_woken = {
            a for (a,) in self.watch.execute("SELECT id FROM actors WHERE state = 'stopping'")
        }
        for actor_id in self.actor_ids:
            self.wake(actor_id, 1)
        return True

    def actors_connectable(self) -> bool:
        """Every actor not destroyed is running, and so is its process, where it is placed."""
        if not self.begin_calm():
            return False
        for actor_id in self.actor_ids:
            actor = self.store.actors.get(actor_id)
            if actor.state is ActorState.DESTROYED:
                continue
            if actor.state is not ActorState.RUNNING or actor.life.runner_id is None:
                return False
            if not any(
                r is not None and r.alive and r.conn.runner_id == actor.life.runner_id
                and (p := r.actors.get(actor_id)) is not None
                and p.generation == actor.generation and p.running and p.stop_at is None
                for r in self.runners
            ):  # fmt: skip
                return False
        return True

    def stuck_actors(self) -> str:
        out = []
        for actor_id in self.actor_ids:
            a = self.store.actors.get(actor_id)
            out.append(
                f"{actor_id} {a.state} gen {a.generation} on {a.life.runner_id} "
                f"(reschedule at {a.life.reschedule_at and a.life.reschedule_at - T0})"
            )
        return "; ".join(out)

    def actors_may_wait(self) -> float:
        """How long the quiet phase may take for actors: a restart's backoff is waited."""
        (latest,) = self.watch.execute(
            "SELECT MAX(reschedule_at) FROM actors WHERE state = 'stopped'"
        ).fetchone()
        return 0.0 if latest is None else max(0.0, latest - self.now)

    def read_transitions(self) -> None:
        rows = self.watch.execute(
            "SELECT seq, run_id, old, new, attempts, runner FROM sim_transitions "
            "WHERE seq > ? ORDER BY seq",
            (self.log_seq,),
        ).fetchall()
        for seq, run_id, old, new, attempts, runner in rows:
            self.log_seq = seq
            self.log(f"  store: {run_id} {old} → {new} (attempt {attempts})")
            self.history[run_id].append(f"{new} at {self.now - T0:.3f} ({runner}/{attempts})")
            legal = RunStatus(new) in TRANSITIONS[RunStatus(old)]
            if not legal and RunStatus(new) in LATE_REPORT.get(RunStatus(old), frozenset()):
                # A late final report ends only a run taken back from its runner (lost) for
                # the attempt the report is of, and not claimed since: back at pending, or
                # waiting lost (its last attempt).
                self.count(f"late reports taken ({old})")
                last = self.last_change.get(run_id)
                lost = str(RunStatus.LOST)
                if last is None or last[1:] != (old, attempts) or lost not in (last[0], old):
                    self.violation(
                        f"{run_id}: {old} → {new} (attempt {attempts}) after "
                        f"{self.last_change.get(run_id)}, not a lost attempt's late report"
                    )
            elif not legal:
                self.violation(f"{run_id}: illegal change {old} → {new}")
            self.last_change[run_id] = (old, new, attempts)
            key = (run_id, attempts, old, new)
            if key in self.seen:
                self.violation(f"{run_id}: {old} → {new} of attempt {attempts} twice")
            self.seen.add(key)
            if new in _TERMINAL:
                self.terminal_changes[run_id] = self.terminal_changes.get(run_id, 0) + 1
                if self.terminal_changes[run_id] > 1:
                    self.violation(f"{run_id} ended twice")
            self.status[run_id] = new

    def finished(self) -> bool:
        return not self.client_plan and all(s in _TERMINAL for s in self.status.values())

    def final_check(self) -> None:
        rows = self.watch.execute("SELECT id, status, error FROM runs ORDER BY id").fetchall()
        in_store = {run_id: status for run_id, status, _ in rows}
        if in_store != self.status:
            self.violation(f"the transition log disagrees with the store: {in_store}")
        for run_id, status, error in rows:
            if status == RunStatus.COMPLETED:
                continue
            if status == RunStatus.CANCELLED and run_id in self.cancel_asked:
                continue
            lost_for_good = (error or "").endswith("; no attempts left (1/1)")
            if status == RunStatus.FAILED and run_id in self.one_attempt and lost_for_good:
                # Its one attempt lost, and no report of it came in the grace.
                self.count("one-attempt runs failed lost")
                continue
            self.violation(f"{run_id} ended {status}, not completed")


_TERMINAL = frozenset(str(s) for s in TERMINAL)


def _in_use(sock: Socket) -> bool:
    done = sock.cut or (sock.runner_done and sock.server_done)
    return not done or bool(sock.up or sock.down)


@dataclass(frozen=True, slots=True)
class _Frame:
    prefix: str
    text: str

    def __str__(self) -> str:
        return self.prefix + _describe(self.text)


def _describe(text: str) -> str:
    if text is CLOSE:
        return "close"
    frame = json.loads(text)
    kind = frame["type"].removeprefix("ToServer").removeprefix("ToClient")
    if kind in ("Events", "Commands"):
        items = frame["events" if kind == "Events" else "commands"]
        return f"{kind}[{', '.join(_item(x) for x in items)}]"
    details = {k: v for k, v in frame.items() if k not in ("v", "type", "metadata", "labels")}
    return f"{kind}{details}" if details else kind


def _item(item: dict[str, Any]) -> str:
    body = item["body"]
    if "actor_id" in body:
        what = body.get("state") or body.get("intent") or ""
        return f"{item['idx']}:{body['type']} {body['actor_id']}/{body['generation']} {what}"
    run = body.get("run_id") or body.get("run", {}).get("run_id", "")
    attempt = body.get("attempt") or body.get("run", {}).get("attempts", "")
    return f"{item['idx']}:{body['type']} {run}/{attempt}"


@contextlib.contextmanager
def actor_thresholds(seconds: float) -> Iterator[None]:
    """The lifecycle's start and stop thresholds (30 s), scaled down as the runner's are."""
    saved = lc.START_THRESHOLD_S, lc.STOP_THRESHOLD_S
    lc.START_THRESHOLD_S = lc.STOP_THRESHOLD_S = seconds
    try:
        yield
    finally:
        lc.START_THRESHOLD_S, lc.STOP_THRESHOLD_S = saved


def simulate(seed: int, template: Path, workdir: Path, *, with_actors: bool = False) -> Outcome:
    """Run one seed on a fresh copy of the template database; never raises."""
    path = workdir / f"sim-{seed}.db"
    store = open_copy(template, path)
    world: World | None = None
    try:
        thresholds = (
            actor_thresholds(ACTOR_THRESHOLD_S) if with_actors else contextlib.nullcontext()
        )
        with sequential_ids(), thresholds:
            world = World(seed, store, with_actors)
            try:
                world.run()
            except Violation as exc:
                return _failed(world, f"invariant violated: {exc}")
            except Exception:
                return _failed(world, f"crashed:\n{traceback.format_exc()}")
            return Outcome(seed, world.step_no, world.now - T0, stats=world.stats)
    finally:
        if world is not None:
            world.watch.close()
        store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def _failed(world: World, what: str) -> Outcome:
    lines = [
        f"seed {world.seed}: {what}",
        f"world: {world.hosts} hosts (slots {world.slots}), {world.n_runs} runs, storm until "
        f"t={world.storm_end - T0:.1f}, a fault every {world.fault_every_s} s, "
        f"slow store {world.slow_store}, ping every {world.ping_interval_s} s"
        + (f", actor slots {world.actor_slots}" if world.with_actors else ""),
        f"last {len(world.trace)} steps (t = virtual seconds since start):",
    ]
    for step, at, events in world.trace:
        what = "; ".join(map(str, events)) or "(time passes)"
        lines.append(f"  #{step:<5} t={at[0] - T0:8.3f}  {what}")
    test = "tests/sim/test_actor_world.py" if world.with_actors else "tests/sim"
    lines.append(f"reproduce: CORRAL_SIM_SEED={world.seed} .venv/bin/pytest {test} -q")
    lines.append("(add CORRAL_SIM_TRACE=all for every step, not only the last ones)")
    return Outcome(world.seed, world.step_no, world.now - T0, failure="\n".join(lines))
