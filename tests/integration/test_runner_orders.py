"""What one coordinator stores for the one holding a runner's socket: a drain with its
grace, a stop (``RunnerStore.order``); and which coordinator that is (the gateway forwards
there), re-owned when the socket registers elsewhere. On SQLite and PostgreSQL."""

from __future__ import annotations

from corral.runners import RunnerState
from corral.store import Store
from corral.store.runners import Order

NOW = 1_000.0


def register(
    store: Store,
    runner_id: str | None = None,
    *,
    keep_drain: bool = False,
    coordinator_url: str | None = None,
) -> str:
    runner, _ = store.runners.register(
        name="r",
        hostname="h",
        labels=(),
        slots=2,
        version="1",
        transport="websocket",
        now=NOW,
        runner_id=runner_id,
        held=None,
        revive=False,
        keep_drain=keep_drain,
        coordinator_url=coordinator_url,
    )
    return runner.id


def test_a_drain_asked_is_stored_with_the_grace_left(store: Store) -> None:
    runner = register(store)
    assert store.runners.order(runner, NOW) == Order(RunnerState.ACTIVE, None)
    store.runners.set_state(runner, RunnerState.DRAINING, NOW + 1, grace_s=60)
    assert store.runners.order(runner, NOW + 11) == Order(RunnerState.DRAINING, 50.0)
    assert store.runners.order(runner, NOW + 100) == Order(RunnerState.DRAINING, 0.0)
    # The runner then says it stops (its own drain): what was asked stays asked.
    store.runners.set_state(runner, RunnerState.DRAINING, NOW + 20)
    assert store.runners.order(runner, NOW + 21) == Order(RunnerState.DRAINING, 40.0)
    store.runners.set_state(runner, RunnerState.STOPPED, NOW + 30)
    assert store.runners.order(runner, NOW + 31) == Order(RunnerState.STOPPED, None)


def test_a_runner_draining_of_itself_has_no_drain_to_pass_on(store: Store) -> None:
    runner = register(store)
    store.runners.set_state(runner, RunnerState.DRAINING, NOW + 1)
    assert store.runners.order(runner, NOW + 2) == Order(RunnerState.DRAINING, None)


def test_a_drain_asked_while_the_socket_was_away_survives_its_reconnect(store: Store) -> None:
    runner = register(store)
    store.runners.set_state(runner, RunnerState.DRAINING, NOW + 1, grace_s=60)
    assert register(store, runner, keep_drain=True) == runner
    assert store.runners.order(runner, NOW + 11) == Order(RunnerState.DRAINING, 50.0)
    # Over HTTP (no keep_drain) registering again revives it, as it always did.
    register(store, runner)
    assert store.runners.order(runner, NOW + 12) == Order(RunnerState.ACTIVE, None)
    store.runners.set_state(runner, RunnerState.DRAINING, NOW + 13)
    register(store, runner, keep_drain=True)  # a drain of its own is said again by itself
    assert store.runners.order(runner, NOW + 14) == Order(RunnerState.ACTIVE, None)


def test_the_coordinator_holding_the_socket_is_the_last_it_registered_with(store: Store) -> None:
    runner = register(store, coordinator_url="http://a:1")
    assert store.runners.coordinator_url(runner) == "http://a:1"
    assert store.runners.get(runner).coordinator_url == "http://a:1"
    register(store, runner, coordinator_url="http://b:2")  # A died; it reconnected to B
    assert store.runners.coordinator_url(runner) == "http://b:2"
    assert store.runners.coordinator_url("rnr_unknown") is None
