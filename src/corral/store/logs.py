"""Runs' output lines in the store: appended by the runner holding the run, read by clients."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.errors import LeaseLost
from corral.store.claims import reports_late
from corral.store.db import Database
from corral.store.rows import row_by_id


@dataclass(frozen=True)
class LogLine:
    line_no: int
    stream: str
    text: str
    ts: float


@dataclass(frozen=True)
class LogEntry:
    id: int
    attempt: int
    line_no: int
    stream: str
    text: str
    ts: float


class LogStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def append(self, run_id: str, runner_id: str, attempt: int, lines: Sequence[LogLine]) -> int:
        """Store output lines; a line sent twice (a retried batch) is stored once."""
        if not lines:
            return 0
        with self.db.transaction() as tx:
            row = row_by_id(tx, "runs", run_id)
            if row["runner_id"] != runner_id and not reports_late(row, runner_id, attempt):
                raise LeaseLost(f"run {run_id} is not held by runner {runner_id}")
            tx.many(
                "INSERT INTO run_logs (run_id, attempt, line_no, stream, text, ts) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, attempt, line_no) DO NOTHING",
                [(run_id, attempt, x.line_no, x.stream, x.text, x.ts) for x in lines],
            )
        return len(lines)

    def read(self, run_id: str, after_id: int = 0, limit: int = 1000) -> list[LogEntry]:
        with self.db.transaction(write=False) as tx:
            row_by_id(tx, "runs", run_id)
            rows = tx.execute(
                "SELECT id, attempt, line_no, stream, text, ts FROM run_logs "
                "WHERE run_id = ? AND id > ? ORDER BY id LIMIT ?",
                (run_id, after_id, limit),
            )
        return [LogEntry(**r) for r in rows]
