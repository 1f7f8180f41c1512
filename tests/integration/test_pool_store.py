"""Pools in the store, on SQLite and PostgreSQL: settings kept, serverless known to the
actors' placement, one scaler per pool at a time (the lease), errors kept newest first and
trimmed; the wanted slots counted from the actors placed and queued, never drifting."""

from __future__ import annotations

from corral.actors import lifecycle as lc
from corral.actors.model import NewActor
from corral.pools import PoolError, Serverless
from corral.store import Store
from corral.store.pools import ERRORS_KEPT

SERVERLESS = Serverless(url="http://127.0.0.1:9", headers={"x-a": "1"}, max_runners=3)


def test_a_pool_keeps_its_settings_and_is_known_as_serverless(store: Store) -> None:
    store.pools.put("sl", SERVERLESS, 10.0)
    store.pools.put("plain", None, 11.0)
    assert store.pools.get("sl").serverless == SERVERLESS
    assert [p.name for p in store.pools.serverless()] == ["sl"]
    with store.db.transaction(write=False) as tx:
        assert store.pools.is_serverless(tx, "sl")
        assert not store.pools.is_serverless(tx, "plain")
        assert not store.pools.is_serverless(tx, "unknown")
    # An actor name no runner offers is still known in a serverless pool: it can grow one.
    assert store.actors.known("anything", "sl") and not store.actors.known("anything", "plain")
    again = store.pools.put("sl", None, 12.0)
    assert again.serverless is None and again.created_at == 10.0 and again.updated_at == 12.0


def test_one_scaler_holds_a_pool_until_its_lease_runs_out(store: Store) -> None:
    store.pools.put("sl", SERVERLESS, 0.0)
    assert store.pools.lease(["sl"], "crd_a", until=10.0, now=1.0) == ["sl"]
    assert store.pools.lease(["sl"], "crd_b", until=11.0, now=2.0) == []  # a holds it
    assert store.pools.lease(["sl"], "crd_a", until=12.0, now=3.0) == ["sl"]  # renewed
    assert store.pools.lease(["sl"], "crd_b", until=20.0, now=12.5) == ["sl"]  # ran out
    assert store.pools.lease(["sl"], "crd_a", until=20.0, now=13.0) == []


def test_errors_are_kept_newest_first_and_trimmed(store: Store) -> None:
    store.pools.put("sl", SERVERLESS, 0.0)
    for i in range(ERRORS_KEPT + 5):
        store.pools.record_error("sl", PoolError.HTTP_ERROR, f"refused {i}", float(i))
    errors = store.pools.errors("sl")
    assert len(errors) == ERRORS_KEPT
    assert (
        errors[0].message == f"refused {ERRORS_KEPT + 4}" and errors[0].kind is PoolError.HTTP_ERROR
    )
    assert store.pools.errors("other") == []


def test_wanted_slots_are_the_actors_placed_and_queued(store: Store) -> None:
    store.pools.put("sl", SERVERLESS, 0.0)
    assert store.actors.wanted_slots("sl") == 0
    created = [store.actors.create(NewActor("echo", f"k{i}", pool="sl"), 1.0)[0] for i in range(3)]
    assert store.actors.wanted_slots("sl") == 3  # queued: no runner yet
    store.actors.create(NewActor("echo", "k0", pool="sl"), 2.0)  # get, not create: no count
    assert store.actors.wanted_slots("sl") == 3
    assert store.actors.wanted_slots("default") == 0
    store.actors.signal(created[0].id, lc.Destroy(), 3.0)  # released: uncounted
    assert store.actors.wanted_slots("sl") == 2
