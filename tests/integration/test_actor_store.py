"""Actors in the store (``store/actors.py``) on SQLite and PostgreSQL: get-or-create,
placement in one transaction, the pending queue, the lifecycle's effects as commands,
drain (GoingAway) and lost runners (Lost), generation fences and KV dropped on destroy."""

from __future__ import annotations

import threading
from typing import Any

from corral.actors import lifecycle as lc
from corral.actors.lifecycle import ActorState, CrashPolicy
from corral.actors.model import NewActor
from corral.runners import RunnerState
from corral.store import Store

T0 = 1000.0


def runner(
    store: Store, *, version: str = "1.0", slots: int = 2, names: tuple[str, ...] = ("echo",)
) -> str:
    row, _ = store.runners.register(
        name="r", hostname="h", labels=[], slots=4, version=version, transport="websocket",
        now=T0, revive=False,
    )  # fmt: skip
    store.actors.host(row.id, "default", names, slots)
    return row.id


def commands(store: Store, runner_id: str) -> list[dict[str, Any]]:
    return [c.body for c in store.commands.unacknowledged(runner_id, 0)]


def test_create_without_capacity_queues_or_sleeps(store: Store) -> None:
    queued, created, _ = store.actors.create(
        NewActor("echo", "k1", crash_policy=CrashPolicy.RESTART), T0
    )
    assert created and queued.state is ActorState.PENDING and queued.generation == 0
    assert queued.life.pending_allocation_at == T0
    asleep, _, _ = store.actors.create(NewActor("echo", "k2", crash_policy=CrashPolicy.SLEEP), T0)
    assert asleep.state is ActorState.SLEEPING  # sleep policy, no serverless pool
    assert store.actors.wanted_slots("default") == 1


def test_get_or_create_by_name_and_key(store: Store) -> None:
    first, created, _ = store.actors.create(NewActor("echo", "issue-12"), T0)
    again, created_again, _ = store.actors.create(NewActor("echo", "issue-12"), T0 + 1)
    other, _, _ = store.actors.create(NewActor("other", "issue-12"), T0)
    assert created and not created_again and again.id == first.id and other.id != first.id
    keyless = {store.actors.create(NewActor("echo"), T0)[0].id for _ in range(2)}
    assert len(keyless) == 2  # no key: each create is a new actor


def test_concurrent_creates_of_one_key_make_one_actor(store_url: str) -> None:
    stores = [Store.open(store_url) for _ in range(6)]
    ids: list[str] = []
    barrier = threading.Barrier(len(stores))

    def create(s: Store) -> None:
        barrier.wait()
        ids.append(s.actors.create(NewActor("echo", "same"), T0)[0].id)

    threads = [threading.Thread(target=create, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert len(ids) == len(stores) and len(set(ids)) == 1


def test_placement_serves_the_queue_in_order_when_a_runner_connects(store: Store) -> None:
    policy = CrashPolicy.RESTART
    a = store.actors.create(NewActor("echo", "a", crash_policy=policy), T0)[0]
    b = store.actors.create(NewActor("echo", "b", crash_policy=policy), T0 + 1)[0]
    c = store.actors.create(NewActor("echo", "c", crash_policy=policy), T0 + 2)[0]
    rid = runner(store, slots=2)
    changes = store.actors.serve("default", T0 + 3)
    assert changes.runners == {rid} and changes.actors == {a.id, b.id}
    assert [store.actors.get(x.id).state for x in (a, b, c)] == [
        ActorState.STARTING,
        ActorState.STARTING,
        ActorState.PENDING,
    ]
    starts = commands(store, rid)
    assert [(s["type"], s["actor_id"], s["generation"]) for s in starts] == [
        ("start_actor", a.id, 1),
        ("start_actor", b.id, 1),
    ]
    # A slot released (a's process exits with a crash) serves the queue: c is placed.
    store.actors.runner_event(rid, a.id, lc.Stopped(rid, 1, code=1), T0 + 4)
    assert store.actors.get(c.id).state is ActorState.STARTING
    assert store.actors.get(a.id).state is ActorState.PENDING  # restarted, now queued


def test_placement_prefers_the_newest_version_then_the_most_free_slots(store: Store) -> None:
    old = runner(store, version="1.9.0", slots=8)
    new = runner(store, version="1.10.0", slots=1)
    roomy = runner(store, version="1.10.0", slots=3)
    other_name = runner(store, version="9.0", slots=9, names=("else",))
    placed = [store.actors.create(NewActor("echo", f"k{i}"), T0)[0] for i in range(5)]
    runners = [store.actors.get(a.id).runner_id for a in placed]
    assert runners[:3] == [roomy, roomy, new] or runners[:3] == [roomy, new, roomy]
    assert runners.count(roomy) == 3 and runners.count(new) == 1 and runners[4] == old
    assert other_name not in runners


def test_running_makes_it_resolvable_and_events_of_an_old_generation_are_ignored(
    store: Store,
) -> None:
    rid = runner(store)
    actor = store.actors.create(NewActor("echo", "k"), T0)[0]
    assert actor.placement is None  # starting: not connectable yet
    store.actors.runner_event(rid, actor.id, lc.Running(rid, 1), T0 + 1)
    got = store.actors.get(actor.id)
    assert got.placement is not None and got.placement.runner_id == rid
    assert got.life.connectable_at == T0 + 1
    before = store.actors.get(actor.id)
    assert store.actors.runner_event(rid, actor.id, lc.Stopped(rid, 0, 0), T0 + 2).actors == set()
    other = "rnr_other"
    assert store.actors.runner_event(other, actor.id, lc.Lost(other, 1), T0).actors == set()
    assert store.actors.get(actor.id) == before
    assert store.actors.placed_on(actor.id, rid) and not store.actors.placed_on(actor.id, "x")
    assert store.actors.placed_on(actor.id, rid, 1)  # the generation placed there
    assert not store.actors.placed_on(actor.id, rid, 0)  # an older one on the same runner


def test_sleep_intent_stop_command_then_deferred_wake(store: Store) -> None:
    rid = runner(store)
    actor = store.actors.create(NewActor("echo", "k"), T0)[0]
    store.actors.runner_event(rid, actor.id, lc.Running(rid, 1), T0 + 1)
    store.actors.runner_event(rid, actor.id, lc.Sleep(rid, 1), T0 + 2)
    store.actors.runner_event(rid, actor.id, lc.Sleep(rid, 1), T0 + 2.5)  # ignored
    assert [c["type"] for c in commands(store, rid)] == ["start_actor", "stop_actor"]
    marked = store.actors.get(actor.id)
    assert marked.state is ActorState.SLEEPING and marked.runner_id == rid
    woken, _ = store.actors.signal(actor.id, lc.Wake(), T0 + 3)
    assert woken.life.will_wake and woken.state is ActorState.SLEEPING
    store.actors.runner_event(rid, actor.id, lc.Stopped(rid, 1, 0), T0 + 4)
    again = store.actors.get(actor.id)
    assert (again.state, again.generation, again.runner_id) == (ActorState.STARTING, 2, rid)
    assert commands(store, rid)[-1] == {
        "type": "start_actor", "actor_id": actor.id, "generation": 2, "name": "echo",
        "key": "k", "input": None,
    }  # fmt: skip


def test_drain_sends_going_away_and_a_lost_runner_moves_its_actors(store: Store) -> None:
    first = runner(store)
    actor = store.actors.create(NewActor("echo", "k", crash_policy=CrashPolicy.RESTART), T0)[0]
    store.actors.runner_event(first, actor.id, lc.Running(first, 1), T0 + 1)
    store.runners.set_state(first, RunnerState.DRAINING, T0 + 2)
    store.actors.tick(T0 + 2)
    away = store.actors.get(actor.id)
    assert away.state is ActorState.STOPPING and away.life.going_away
    assert commands(store, first)[-1]["type"] == "stop_actor"
    store.actors.tick(T0 + 2.5)  # GoingAway once
    assert [c["type"] for c in commands(store, first)].count("stop_actor") == 1
    second = runner(store)
    store.runners.set_state(first, RunnerState.STOPPED, T0 + 3)  # it left without a word
    changes = store.actors.tick(T0 + 3)
    moved = store.actors.get(actor.id)
    assert (moved.state, moved.runner_id, moved.generation) == (ActorState.STARTING, second, 2)
    assert second in changes.runners and actor.id in changes.actors


def test_start_threshold_and_backoff_run_on_tick(store: Store) -> None:
    rid = runner(store, slots=1)
    actor = store.actors.create(NewActor("echo", "k", crash_policy=CrashPolicy.RESTART), T0)[0]
    store.actors.tick(T0 + lc.START_THRESHOLD_S - 1)
    assert store.actors.get(actor.id).state is ActorState.STARTING
    store.runners.set_state(rid, RunnerState.LOST, T0 + 29)
    again_on = runner(store, slots=1)
    store.actors.tick(T0 + lc.START_THRESHOLD_S)  # never said running: lost, placed again
    again = store.actors.get(actor.id)
    assert again.state is ActorState.STARTING and again.generation == 2
    assert again.runner_id == again_on
    # The loss was its runner's doing: the first crash of its own restarts it at once,
    store.actors.runner_event(again_on, actor.id, lc.Stopped(again_on, 2, 1), T0 + 31)
    assert store.actors.get(actor.id).generation == 3
    # and the second, in a row, after the backoff.
    store.actors.runner_event(again_on, actor.id, lc.Stopped(again_on, 3, 1), T0 + 32)
    backing_off = store.actors.get(actor.id)
    assert backing_off.state is ActorState.STOPPED
    assert backing_off.life.reschedule_at == T0 + 32 + lc.RESTART_BASE_S
    store.actors.tick(T0 + 34)
    assert store.actors.get(actor.id).generation == 4


def test_a_threshold_on_a_runner_still_alive_never_places_a_second_generation(
    store: Store,
) -> None:
    """The runner counts the start and stop thresholds from when the command reached it,
    then SIGTERM, then SIGKILL: until it says the process stopped, or is lost (having
    stopped its work by then), another generation elsewhere would run beside it."""
    first = runner(store, slots=1)
    actor = store.actors.create(NewActor("echo", "k", crash_policy=CrashPolicy.RESTART), T0)[0]
    second = runner(store, slots=1)
    store.actors.tick(T0 + lc.START_THRESHOLD_S)
    waiting = store.actors.get(actor.id)
    assert (waiting.state, waiting.runner_id, waiting.generation) == (
        ActorState.STARTING, first, 1
    )  # fmt: skip
    assert waiting.life.deadline_at == T0 + 2 * lc.START_THRESHOLD_S  # waits once more
    assert commands(store, second) == []
    store.actors.runner_event(first, actor.id, lc.Running(first, 1), T0 + 40)  # a slow start
    running = store.actors.get(actor.id)
    assert running.state is ActorState.RUNNING and running.runner_id == first
    # Asked to sleep, slow to stop: held by its runner until it stopped, or is lost.
    store.actors.signal(actor.id, lc.Sleep(), T0 + 41)
    store.actors.tick(T0 + 41 + lc.STOP_THRESHOLD_S)
    assert store.actors.get(actor.id).runner_id == first
    store.actors.signal(actor.id, lc.Wake(), T0 + 80)  # deferred: it has not stopped yet
    store.runners.set_state(first, RunnerState.LOST, T0 + 90)
    store.actors.tick(T0 + 90)
    moved = store.actors.get(actor.id)
    assert (moved.state, moved.runner_id, moved.generation) == (ActorState.STARTING, second, 2)


def test_destroy_stops_it_then_drops_its_kv(store: Store) -> None:
    rid = runner(store)
    actor = store.actors.create(NewActor("echo", "k"), T0)[0]
    assert store.kv.apply(actor.id, {"op": "put", "entries": {"a": "1"}}, T0)["ok"]
    stopping, _ = store.actors.signal(actor.id, lc.Destroy(), T0 + 1)
    assert stopping.state is ActorState.STOPPING
    store.actors.runner_event(rid, actor.id, lc.Stopped(rid, 1, 0), T0 + 2)
    gone = store.actors.get(actor.id)
    assert gone.state is ActorState.DESTROYED and gone.life.destroyed_at == T0 + 2
    assert store.kv.apply(actor.id, {"op": "list"}, T0)["entries"] == []
    assert store.actors.placement(actor.id) is None


def test_list_filters_and_pages(store: Store) -> None:
    made = [store.actors.create(NewActor("echo", f"k{i}"), T0 + i)[0] for i in range(5)]
    store.actors.create(NewActor("other", "k0"), T0 + 9)
    page = store.actors.list(name="echo", limit=2)
    assert [a.id for a in page] == [made[4].id, made[3].id]
    rest = store.actors.list(name="echo", before=page[-1].id, limit=10)
    assert [a.id for a in rest] == [made[2].id, made[1].id, made[0].id]
    assert [a.id for a in store.actors.list(name="echo", key="k1")] == [made[1].id]
    assert len(store.actors.list(states=[ActorState.SLEEPING])) == 6


def test_an_alarm_survives_a_coordinator_restart_and_wakes_the_actor(store_url: str) -> None:
    store = Store.open(store_url)
    rid = runner(store)
    actor = store.actors.create(NewActor("echo", "k"), T0)[0]
    store.actors.runner_event(rid, actor.id, lc.Running(rid, 1), T0 + 1)
    store.actors.runner_event(rid, actor.id, lc.SetAlarm(rid, 1, T0 + 100), T0 + 2)
    store.actors.runner_event(rid, actor.id, lc.Sleep(rid, 1), T0 + 3)
    store.actors.runner_event(rid, actor.id, lc.Stopped(rid, 1, 0), T0 + 4)
    store.close()  # the coordinator goes away; another one opens the same database
    store = Store.open(store_url)
    try:
        asleep = store.actors.get(actor.id)
        assert asleep.state is ActorState.SLEEPING and asleep.life.alarm_at == T0 + 100
        store.actors.tick(T0 + 99)
        assert store.actors.get(actor.id).state is ActorState.SLEEPING
        store.actors.tick(T0 + 100)
        woken = store.actors.get(actor.id)
        assert (woken.state, woken.generation, woken.life.alarm_at) == (
            ActorState.STARTING,
            2,
            None,
        )
    finally:
        store.close()


def test_a_runner_connecting_takes_queued_actors_and_says_whom_to_wake(store: Store) -> None:
    from corral.coordinator.link_core import LinkCore
    from corral.coordinator.notifier import actor_topic
    from corral.coordinator.settings import CoordinatorSettings
    from corral.protocol.messages import PROTOCOL_VERSION, ToServerInit

    queued = store.actors.create(NewActor("echo", "k", crash_policy=CrashPolicy.RESTART), T0)[0]
    init = ToServerInit("r", "1", PROTOCOL_VERSION, 1, 0, None, (), {}, ("echo",), "default", 2)
    registration = LinkCore(store, CoordinatorSettings()).register(init, T0 + 1)
    assert [c.body["type"] for c in registration.missed] == ["start_actor"]
    assert registration.woken == (actor_topic(queued.id),)
    assert store.actors.get(queued.id).runner_id == registration.runner_id


def test_a_stop_report_that_places_an_actor_on_another_runner_wakes_that_runner(
    store: Store,
) -> None:
    """The start command goes to a runner that reported nothing: its push loop is woken
    from what the store did (found by ``tests/sim``, seed 44)."""
    from corral.coordinator.link_core import LinkCore, parse_events
    from corral.coordinator.notifier import actor_topic, runner_topic
    from corral.coordinator.settings import CoordinatorSettings
    from corral.ids import RunnerId
    from corral.protocol.messages import Indexed

    first = runner(store, slots=1)
    actor = store.actors.create(NewActor("echo", "k"), T0)[0]
    roomier = runner(store, slots=2)
    store.actors.runner_event(first, actor.id, lc.Running(first, 1), T0 + 1)
    store.actors.runner_event(first, actor.id, lc.Sleep(first, 1), T0 + 2)
    store.actors.signal(actor.id, lc.Wake(), T0 + 3)  # deferred until it stopped
    stopped = {"type": "actor_state", "actor_id": actor.id, "generation": 1, "state": "stopped"}
    events = parse_events([Indexed(1, {**stopped, "code": 0})])
    applied = LinkCore(store, CoordinatorSettings()).apply(RunnerId(first), 1, events, T0 + 4)
    assert store.actors.get(actor.id).runner_id == roomier
    assert commands(store, roomier)[-1]["type"] == "start_actor"
    assert applied.wake == [actor_topic(actor.id), runner_topic(roomier)]
