"""Sessions in the store: read by clients, written by the runs that use them.

A session row is written by the run operations, in their transaction: when an agent
announces its session id (``upsert_from_run``), when its run ends (``finish_from_run``),
and when a run ended some other way still adds what it cost (``add_cost``).
"""

from __future__ import annotations

import json

from corral.errors import NotFound
from corral.runs import Run, RunStatus
from corral.sessions import Session
from corral.store.db import Database, Row, Tx
from corral.store.rows import session_from_row


class SessionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, key: str) -> Session:
        """A session by id, or the most recent session with that name."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT * FROM sessions WHERE id = ?", (key,)) or tx.one(
                "SELECT * FROM sessions WHERE name = ? ORDER BY updated_at DESC LIMIT 1", (key,)
            )
        if row is None:
            raise NotFound.of("session", key)
        return session_from_row(row)

    def list(self, limit: int = 50) -> list[Session]:
        """The most recently updated sessions first."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT * FROM sessions ORDER BY updated_at DESC, id DESC LIMIT ?", (limit,)
            )
        return [session_from_row(r) for r in rows]


def upsert_from_run(tx: Tx, run: Row, now: float) -> None:
    """The run's agent announced its session: the session points at the run."""
    agent_name = json.loads(run["agent"]).get("name") if run["agent"] else None
    tx.execute(
        "INSERT INTO sessions (id, name, agent_name, runner_id, project_dir, last_run_id, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET runner_id = excluded.runner_id, "
        "project_dir = excluded.project_dir, last_run_id = excluded.last_run_id, "
        "updated_at = excluded.updated_at",
        (
            run["session_id"],
            run["session_name"],
            agent_name,
            run["runner_id"],
            run["project_dir"],
            run["id"],
            now,
            now,
        ),
    )


def finish_from_run(tx: Tx, run: Run, now: float) -> None:
    """The run's final report: the session takes its result, cost and one more run."""
    tx.execute(
        "INSERT INTO sessions (id, name, agent_name, runner_id, project_dir, last_run_id, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        (
            run.session_id,
            run.session_name,
            run.agent_name,
            run.runner_id,
            run.project_dir,
            run.id,
            now,
            now,
        ),
    )
    tx.execute(
        "UPDATE sessions SET result = ?, is_error = ?, cost_usd = cost_usd + ?, "
        "runs = runs + 1, last_run_id = ?, runner_id = ?, updated_at = ? WHERE id = ?",
        (
            run.result,
            int(run.status is not RunStatus.COMPLETED),
            run.cost_usd or 0.0,
            run.id,
            run.runner_id,
            now,
            run.session_id,
        ),
    )


def add_cost(tx: Tx, session_id: str, cost_usd: float, now: float) -> None:
    tx.execute(
        "UPDATE sessions SET cost_usd = cost_usd + ?, updated_at = ? WHERE id = ?",
        (cost_usd, now, session_id),
    )
