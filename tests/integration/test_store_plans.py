"""PostgreSQL's plans kept fit for the tables' sizes (``corral.store.plans``): a table grown
past twice the size its last analysis recorded is analyzed (the plans that read it are made
again), once, until it grows that much again; small tables, and SQLite, are left alone."""

from __future__ import annotations

import psycopg

from corral.runs import NewRun, RunType
from corral.store import Store
from corral.store.plans import GROWTH, MIN_BYTES

NOW = 1_700_000_000.0
RUNS = [NewRun(type=RunType.COMMAND, command=("true",), prompt="p" * 1000)] * 200


def sizes(store_url: str) -> tuple[int, int]:
    """The runs table's size now, and the size its last analysis recorded (bytes)."""
    with psycopg.connect(store_url) as conn:
        row = conn.execute(
            "SELECT pg_relation_size(oid), relpages::bigint * current_setting('block_size')::int "
            "FROM pg_class WHERE oid = 'runs'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def grow_to(store: Store, store_url: str, size: int) -> None:
    while sizes(store_url)[0] < size:
        store.runs.create_many(RUNS, NOW)


def test_a_grown_table_is_analyzed_once_until_it_grows_again(store: Store, store_url: str) -> None:
    assert store.analyze_grown() == []  # a new database: every table is small
    if store.db.dialect == "sqlite":
        for _ in range(5):
            store.runs.create_many(RUNS, NOW)
        assert store.analyze_grown() == []  # no plans kept across statements: nothing to do
        return
    with psycopg.connect(store_url, autocommit=True) as conn:
        # Autovacuum's own analysis, should its minute come meanwhile, would pass for ours.
        conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")
    grow_to(store, store_url, MIN_BYTES)
    assert sizes(store_url)[1] == 0  # never analyzed: plans made now would not know
    assert "runs" in store.analyze_grown()
    size, recorded = sizes(store_url)
    assert recorded == size  # what the planner counts on now
    assert "runs" not in store.analyze_grown()  # not grown since: left alone
    grow_to(store, store_url, GROWTH * recorded + 1)
    assert "runs" in store.analyze_grown()
    assert sizes(store_url)[1] > GROWTH * recorded
