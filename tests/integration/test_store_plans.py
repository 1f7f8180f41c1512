"""PostgreSQL's plans kept fit for the tables' sizes (``corral.store.plans``): a table grown
past twice the size its last analysis recorded is analyzed (the plans that read it are made
again), once, until it grows that much again; small tables, and SQLite, are left alone."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import psycopg
import pytest
from api_fixtures import backend_url, running_api

from corral.coordinator.settings import CoordinatorSettings
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


@pytest.mark.postgres
@pytest.mark.anyio
async def test_the_coordinator_holding_the_lease_analyzes_a_grown_table(tmp_path: Path) -> None:
    """Wired: a coordinator running its loops analyzes ``runs`` once it has grown (each
    second, in a loop of its own beside the reconciler's)."""
    with backend_url("postgres", tmp_path) as db:
        settings = CoordinatorSettings(db_url=db, reconcile_interval_s=0.1)
        async with running_api(settings, reconcile=True) as api:
            store = api.app.state.coordinator.store
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")
            await anyio.to_thread.run_sync(grow_to, store, db, MIN_BYTES)
            deadline = time.monotonic() + 30
            while sizes(db)[1] == 0:  # never analyzed, until the coordinator's look
                assert time.monotonic() < deadline, "runs was not analyzed within 30 s"
                await anyio.sleep(0.05)
            assert sizes(db)[1] >= MIN_BYTES
