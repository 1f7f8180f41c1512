"""A deterministic simulation of actors: the real ``ActorStore`` (SQLite) driven by seeded
random events — wakes, sleeps and destroys through the API, processes that start, ask to
sleep or stop, crash and set alarms, runners that drain, get lost (their processes running
on, cut off) and come back, KV writes from any runner — on a virtual clock.

Invariants, checked after every step:
- never two live generations: once every reachable runner has carried out its commands,
  no actor has a process on two of them;
- the tables agree with the lifecycle: a placement exactly for the placed states, on a
  runner within its slots, with the actor's generation; the queue exactly the pending ones;
- the wanted slots of the pool (what the autoscaler counts) equal the placed and queued
  actors, never drifting;
- no KV write from a runner the actor is not placed on is applied;
and at the end: every wake while capacity exists ends connectable.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral.actors import lifecycle as lc
from corral.actors.lifecycle import ALWAYS_PLACED, ActorState, CrashPolicy
from corral.actors.model import NewActor
from corral.coordinator.actors import kv_request
from corral.runners import RunnerState
from corral.store import Store

SEEDS = range(12)
STEPS = 250
SLOTS = 2


@dataclass
class SimRunner:
    """A runner process: the actor processes it runs, and how far it read its commands."""

    name: str
    runner_id: str = ""
    processes: dict[str, tuple[int, bool]] = field(default_factory=dict)  # gen, running
    read_idx: int = 0
    reachable: bool = True  # a lost runner is cut off: its processes run on, unheard


class ActorSim:
    def __init__(self, store: Store, rng: random.Random) -> None:
        self.store = store
        self.rng = rng
        self.now = 1000.0
        self.runners = [SimRunner(f"r{i}") for i in range(3)]
        for runner in self.runners:
            self._connect(runner)
        policies = list(CrashPolicy)
        self.actors = [
            store.actors.create(NewActor("echo", f"k{i}", crash_policy=policies[i % 3]), self.now)[
                0
            ].id
            for i in range(5)
        ]
        self.kv_refused = self.kv_applied = 0

    def _connect(self, runner: SimRunner) -> None:
        """A fresh runner process (a new identity): no processes, no commands read."""
        row, _ = self.store.runners.register(
            name=runner.name, hostname="h", labels=[], slots=1, version="1", transport="websocket",
            now=self.now, revive=False,
        )  # fmt: skip
        runner.runner_id, runner.processes, runner.read_idx = row.id, {}, 0
        runner.reachable = True
        self.store.actors.host(row.id, "default", ["echo"], SLOTS)
        self.store.actors.serve("default", self.now)

    def _runner(self, runner_id: str) -> SimRunner | None:
        return next((r for r in self.runners if r.runner_id == runner_id), None)

    # ---- what runners do ---------------------------------------------------------------------

    def deliver(self, runner: SimRunner) -> None:
        """The runner carries out the commands it has not read yet."""
        if not runner.reachable:
            return
        for command in self.store.commands.unacknowledged(runner.runner_id, runner.read_idx):
            runner.read_idx = command.idx
            body = command.body
            actor_id, generation = body["actor_id"], body["generation"]
            held = runner.processes.get(actor_id)
            if body["type"] == "start_actor":
                if held is None or held[0] < generation:
                    runner.processes[actor_id] = (generation, False)
            elif held is not None and held[0] == generation:
                del runner.processes[actor_id]
                self.event(runner, actor_id, lc.Stopped(runner.runner_id, generation, 0))

    def event(self, runner: SimRunner, actor_id: str, event: lc.Event) -> None:
        if runner.reachable:
            self.store.actors.runner_event(runner.runner_id, actor_id, event, self.now)

    def process_step(self, runner: SimRunner) -> None:
        if not runner.processes:
            return
        actor_id = self.rng.choice(sorted(runner.processes))
        generation, running = runner.processes[actor_id]
        rid = runner.runner_id
        if not running:
            runner.processes[actor_id] = (generation, True)
            self.event(runner, actor_id, lc.Running(rid, generation))
            return
        roll = self.rng.random()
        if roll < 0.35:
            self.event(runner, actor_id, lc.Sleep(rid, generation))
        elif roll < 0.45:
            self.event(runner, actor_id, lc.Stop(rid, generation))
        elif roll < 0.65:
            del runner.processes[actor_id]  # it crashes
            self.event(runner, actor_id, lc.Stopped(rid, generation, 1))
        else:
            at = self.now + self.rng.uniform(1, 120)
            self.event(runner, actor_id, lc.SetAlarm(rid, generation, at))

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> None:
        self.now += self.rng.uniform(0, 5)
        roll = self.rng.random()
        runner = self.rng.choice(self.runners)
        actor_id = self.rng.choice(self.actors)
        if roll < 0.15:
            self.store.actors.signal(actor_id, lc.Wake(), self.now)
        elif roll < 0.2:
            self.store.actors.signal(actor_id, lc.Sleep(), self.now)
        elif roll < 0.21:
            self.store.actors.signal(actor_id, lc.Destroy(), self.now)
        elif roll < 0.45:
            self.deliver(runner)
        elif roll < 0.7:
            self.process_step(runner)
        elif roll < 0.73:
            self.lose(runner)
        elif roll < 0.75:
            self.drain(runner)
        elif roll < 0.85:
            self.kv_write(runner, actor_id)
        else:
            self.store.actors.tick(self.now)
        for r in self.runners:
            if not r.reachable and self.rng.random() < 0.05:
                self._connect(r)  # the lost runner's host restarts: its processes are gone

    def lose(self, runner: SimRunner) -> None:
        if runner.reachable:
            runner.reachable = False
            self.store.runners.set_state(runner.runner_id, RunnerState.LOST, self.now)

    def drain(self, runner: SimRunner) -> None:
        state = self.store.runners.get(runner.runner_id).state
        if runner.reachable and state is RunnerState.ACTIVE:
            self.store.runners.set_state(runner.runner_id, RunnerState.DRAINING, self.now)
        elif runner.reachable and not runner.processes:
            self.store.runners.set_state(runner.runner_id, RunnerState.STOPPED, self.now)
            runner.reachable = False  # it left; it comes back as a new process

    def kv_write(self, runner: SimRunner, actor_id: str) -> None:
        placed = self.store.actors.placed_on(actor_id, runner.runner_id)
        op = {"op": "put", "entries": {"by": runner.runner_id}}
        result = kv_request(self.store, runner.runner_id, actor_id, op, self.now)
        assert result["ok"] == placed, (result, placed)
        if result["ok"]:
            self.kv_applied += 1
        else:
            self.kv_refused += 1
            assert result["code"] == "actor_not_placed"

    # ---- invariants --------------------------------------------------------------------------

    def check_tables(self) -> None:
        db = self.store.db
        with db.transaction(write=False) as tx:
            placements = {
                r["actor_id"]: (r["runner_id"], r["generation"])
                for r in tx.execute("SELECT * FROM actor_placements")
            }
            queued = {r["actor_id"] for r in tx.execute("SELECT actor_id FROM actor_queue")}
        wanted = 0
        for actor_id in self.actors:
            actor = self.store.actors.get(actor_id)
            placed = actor.runner_id is not None
            assert (actor_id in placements) == placed, (actor_id, actor.state)
            if actor.state is not ActorState.SLEEPING:
                assert placed == (actor.state in ALWAYS_PLACED), (actor_id, actor.state)
            if placed:
                assert placements[actor_id] == (actor.runner_id, actor.generation)
            assert (actor_id in queued) == (actor.state is ActorState.PENDING), actor.state
            wanted += placed or actor.state is ActorState.PENDING
        assert self.store.actors.wanted_slots("default") == wanted
        per_runner: dict[str, int] = {}
        for runner_id, _ in placements.values():
            per_runner[runner_id] = per_runner.get(runner_id, 0) + 1
        assert all(n <= SLOTS for n in per_runner.values()), per_runner

    def check_one_live_generation(self) -> None:
        """After every reachable runner has read its commands: one process per actor."""
        for runner in self.runners:
            self.deliver(runner)
        hosts: dict[str, list[str]] = {}
        for runner in self.runners:
            if runner.reachable:
                for actor_id in runner.processes:
                    hosts.setdefault(actor_id, []).append(runner.name)
        assert all(len(names) == 1 for names in hosts.values()), hosts

    def settle_and_wake_all(self) -> None:
        """Every runner back and reachable; every actor woken; processes report running;
        time passes (backoffs, thresholds): each actor not destroyed ends connectable."""
        for runner in self.runners:
            if not runner.reachable or self.store.runners.get(runner.runner_id).state is not (
                RunnerState.ACTIVE
            ):
                if runner.reachable:
                    self.store.runners.set_state(runner.runner_id, RunnerState.STOPPED, self.now)
                self._connect(runner)
        self.store.actors.tick(self.now)  # the stopped runners' actors are lost
        alive = [
            a for a in self.actors if self.store.actors.get(a).state is not ActorState.DESTROYED
        ]
        assert len(alive) <= SLOTS * len(self.runners)  # capacity exists for all of them
        for actor_id in alive:
            self.store.actors.signal(actor_id, lc.Wake(), self.now)
        for _ in range(40):
            for runner in self.runners:
                self.deliver(runner)
                for actor_id, (generation, running) in list(runner.processes.items()):
                    if not running:
                        runner.processes[actor_id] = (generation, True)
                        self.event(runner, actor_id, lc.Running(runner.runner_id, generation))
            self.now += 30.0
            self.store.actors.tick(self.now)
            for actor_id in alive:
                self.store.actors.signal(actor_id, lc.Wake(), self.now)
        states = {a: self.store.actors.get(a).state for a in alive}
        assert all(s is ActorState.RUNNING for s in states.values()), states


@pytest.fixture
def sim_store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(str(tmp_path / "sim.db"))
    try:
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_actors_keep_their_invariants(sim_store: Store, seed: int) -> None:
    sim = ActorSim(sim_store, random.Random(seed))
    for n in range(STEPS):
        sim.step()
        sim.check_tables()
        if n % 25 == 24:
            sim.check_one_live_generation()
    sim.check_tables()
    sim.settle_and_wake_all()
    sim.check_tables()
    assert sim.kv_refused > 0  # the fence was exercised
