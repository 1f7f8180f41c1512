"""Pools in the store: serverless endpoints, who scales each, and their recent errors.

The wanted slots a pool's autoscaler counts are not a counter of their own: they are the
actors placed in the pool and those queued for it (``ActorStore.wanted_slots``), each
placement attempt counted once and uncounted when its slot is released — in the same
transactions that place and release, so the count never drifts from the placements.

One autoscaler at a time per pool, even with several coordinators: each holds a lease on
the pools it scales (``scaler``, ``scaler_until``), renewed while it runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from corral.errors import NotFound
from corral.pools import PoolError, Serverless
from corral.store.db import Database, Row, Tx
from corral.store.rows import dumps, loads

ERRORS_KEPT = 20  # per pool, newest first


@dataclass(frozen=True)
class Pool:
    name: str
    serverless: Serverless | None
    created_at: float
    updated_at: float
    wanted_slots: int | None = None  # as its autoscaler last saw them (None: never yet)
    desired_runners: int | None = None


@dataclass(frozen=True)
class PoolErrorEntry:
    kind: PoolError
    message: str
    at: float


class PoolStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def put(self, name: str, serverless: Serverless | None, now: float) -> Pool:
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO pools (name, serverless, created_at, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "serverless = excluded.serverless, updated_at = excluded.updated_at",
                (name, None if serverless is None else dumps(asdict(serverless)), now, now),
            )
            return self._pool(tx, name)

    def get(self, name: str) -> Pool:
        with self.db.transaction(write=False) as tx:
            return self._pool(tx, name)

    def list_all(self) -> list[Pool]:
        """Every pool with settings of its own (``PUT /pools/{name}``), by name."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute("SELECT * FROM pools ORDER BY name")
        return [_pool_from_row(r) for r in rows]

    def serverless(self) -> list[Pool]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute("SELECT * FROM pools WHERE serverless IS NOT NULL ORDER BY name")
        return [_pool_from_row(r) for r in rows]

    def is_serverless(self, tx: Tx, pool: str) -> bool:
        """Can an endpoint grow ``pool``? (The actors' lifecycle asks, in its transaction.)"""
        row = tx.one("SELECT serverless FROM pools WHERE name = ?", (pool,))
        return row is not None and row["serverless"] is not None

    def lease(self, names: list[str], scaler: str, until: float, now: float) -> list[str]:
        """Of ``names``, the pools ``scaler`` may scale until ``until``: those it holds or
        whose lease has run out (then taken)."""
        held = []
        with self.db.transaction() as tx:
            for name in names:
                row = tx.one(
                    "UPDATE pools SET scaler = ?, scaler_until = ? WHERE name = ? AND "
                    "(scaler IS NULL OR scaler = ? OR scaler_until < ?) RETURNING name",
                    (scaler, until, name, scaler, now),
                )
                if row is not None:
                    held.append(name)
        return held

    def record_demand(self, pool: str, wanted_slots: int, desired_runners: int, now: float) -> bool:
        """What the pool's autoscaler now wants, kept when it changed (then a pool event,
        written by the database); whether it changed."""
        with self.db.transaction() as tx:
            row = tx.one(
                "UPDATE pools SET wanted_slots = ?, desired_runners = ?, updated_at = ? "
                "WHERE name = ? AND (wanted_slots IS NULL OR wanted_slots <> ? "
                "OR desired_runners IS NULL OR desired_runners <> ?) RETURNING name",
                (wanted_slots, desired_runners, now, pool, wanted_slots, desired_runners),
            )
        return row is not None

    def record_error(self, pool: str, kind: PoolError, message: str, now: float) -> None:
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO pool_errors (pool, kind, message, at) VALUES (?, ?, ?, ?)",
                (pool, str(kind), message[:1000], now),
            )
            tx.execute(
                "DELETE FROM pool_errors WHERE pool = ? AND id NOT IN (SELECT id FROM "
                "pool_errors WHERE pool = ? ORDER BY id DESC LIMIT ?)",
                (pool, pool, ERRORS_KEPT),
            )

    def errors(self, pool: str) -> list[PoolErrorEntry]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT kind, message, at FROM pool_errors WHERE pool = ? ORDER BY id DESC",
                (pool,),
            )
        return [PoolErrorEntry(PoolError(r["kind"]), r["message"], r["at"]) for r in rows]

    def _pool(self, tx: Tx, name: str) -> Pool:
        row = tx.one("SELECT * FROM pools WHERE name = ?", (name,))
        if row is None:
            raise NotFound.of("pool", name)
        return _pool_from_row(row)


def _pool_from_row(row: Row) -> Pool:
    config = row["serverless"]
    return Pool(
        name=row["name"],
        serverless=None if config is None else Serverless(**loads(config)),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        wanted_slots=row["wanted_slots"],
        desired_runners=row["desired_runners"],
    )
