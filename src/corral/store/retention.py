"""Retention: what the store deletes once it is old or large enough, and what it never does.

Deleted, oldest first, in batches of one transaction each (so a collection never holds the
database for long):

* finished runs (completed, failed, cancelled, timed out) whose run ended more than
  ``runs_s`` ago, with their logs;
* lost or stopped runners silent for more than ``runners_s``, with the commands they never
  acknowledged (acknowledged ones are deleted at once, see ``CommandStore.acknowledge``);
* the middle of a finished run's log over ``log_chars`` characters: its first and last
  halves stay, with one marker line saying how many lines went;
* events (``GET /events``) older than ``events_s``, by id: a resume from before the
  newest one deleted is refused (``events_expired``);
* idempotency keys of requests that created runs, a day after (``run_requests.KEPT_S``).

Never deleted: a run that is not finished; the last run of a session (its result) and the
current run of a task; a runner a kept run or a session names (resumes go back to it), or
that is active or draining; the commands of a runner that is kept (they are replayed
after a reconnect); sessions, projects and tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import corral.store.run_requests as run_requests
from corral.runners import ALIVE, RunnerState
from corral.runs import TERMINAL
from corral.store.db import Database, Row, Tx
from corral.store.events import EventStore
from corral.store.rows import sql_list

DAY = 86400.0
MARKER_LINE_NO = -1  # runner lines count from 0: the marker cannot collide with one
_FINISHED = sql_list(TERMINAL)
_GONE = sql_list(set(RunnerState) - ALIVE)  # lost, stopped


@dataclass(frozen=True)
class Retention:
    """How long finished work is kept (seconds); ``None`` keeps it forever."""

    runs_s: float | None = 30 * DAY
    runners_s: float | None = 7 * DAY
    log_chars: int | None = 16 * 1024 * 1024
    events_s: float | None = 7 * DAY


@dataclass(frozen=True)
class Collected:
    runs: int = 0
    log_lines: int = 0
    runners: int = 0
    commands: int = 0
    events: int = 0
    run_requests: int = 0


def collect(db: Database, retention: Retention, now: float, *, batch: int = 500) -> Collected:
    """Delete what ``retention`` lets go (see the module's docstring); returns the counts."""
    r = retention
    trimmed = _trim_logs(db, r.log_chars, batch) if r.log_chars else 0
    runs, run_lines = _runs(db, now - r.runs_s, batch) if r.runs_s is not None else (0, 0)
    runners, commands = (
        _runners(db, now - r.runners_s, batch) if r.runners_s is not None else (0, 0)
    )
    events = EventStore(db).collect(now - r.events_s, batch) if r.events_s is not None else 0
    keys = run_requests.collect(db, now - run_requests.KEPT_S, batch)
    return Collected(runs, trimmed + run_lines, runners, commands, events, keys)


def _runs(db: Database, cutoff: float, batch: int) -> tuple[int, int]:
    return _delete_batches(
        db,
        # created_at first: the runs_by_created index finds the oldest at once.
        f"SELECT id FROM runs WHERE created_at < ? AND status IN ({_FINISHED}) "
        "AND COALESCE(finished_at, updated_at) < ? "
        "AND id NOT IN (SELECT last_run_id FROM sessions WHERE last_run_id IS NOT NULL) "
        "AND id NOT IN (SELECT run_id FROM tasks WHERE run_id IS NOT NULL) "
        # A child whose parent has not heard of its end yet (store/callbacks.py).
        "AND id NOT IN (SELECT child_run_id FROM run_callbacks "
        "WHERE delivered_run_id IS NULL AND dropped IS NULL) "
        "ORDER BY created_at LIMIT ?",
        (cutoff, cutoff, batch),
        table="runs",
        children=("run_logs", "run_id"),
    )


def _runners(db: Database, cutoff: float, batch: int) -> tuple[int, int]:
    return _delete_batches(
        db,
        f"SELECT id FROM runners WHERE state IN ({_GONE}) AND last_heartbeat_at < ? "
        "AND id NOT IN (SELECT runner_id FROM runs WHERE runner_id IS NOT NULL) "
        "AND id NOT IN (SELECT runner_id FROM sessions WHERE runner_id IS NOT NULL) "
        "ORDER BY last_heartbeat_at LIMIT ?",
        (cutoff, batch),
        table="runners",
        children=("runner_commands", "runner_id"),
    )


def _delete_batches(
    db: Database, select: str, params: tuple[Any, ...], *, table: str, children: tuple[str, str]
) -> tuple[int, int]:
    """Delete the rows of ``table`` that ``select`` finds, and the rows of ``children``
    (table, column) that name them, a batch a transaction until it finds no more; how many
    rows of each went."""
    child, column = children
    deleted = deleted_children = 0
    while True:
        with db.transaction() as tx:
            ids = [row["id"] for row in tx.execute(select, params)]
            if not ids:
                return deleted, deleted_children
            marks = ", ".join("?" for _ in ids)
            named = f"FROM {child} WHERE {column} IN ({marks})"
            deleted_children += _count(tx, f"SELECT COUNT(*) AS n {named}", ids)
            tx.execute(f"DELETE {named}", ids)
            tx.execute(f"DELETE FROM {table} WHERE id IN ({marks})", ids)
            deleted += len(ids)


def _trim_logs(db: Database, max_chars: int, batch: int) -> int:
    with db.transaction(write=False) as tx:
        over = [
            r["run_id"]
            for r in tx.execute(
                "SELECT l.run_id FROM run_logs l JOIN runs r ON r.id = l.run_id "
                f"WHERE r.status IN ({_FINISHED}) GROUP BY l.run_id "
                "HAVING SUM(CASE WHEN l.line_no = ? THEN 0 ELSE LENGTH(l.text) END) > ? "
                "LIMIT ?",
                (MARKER_LINE_NO, max_chars, batch),
            )
        ]
    return sum(_trim_log(db, run_id, max_chars) for run_id in over)


def _trim_log(db: Database, run_id: str, max_chars: int) -> int:
    """Keep the first and the last ``max_chars / 2`` characters of lines; delete the rest
    and put a marker line where they were (the one marker of the log: a log trimmed again,
    under a lower limit, has its marker replaced)."""
    marker = (run_id, MARKER_LINE_NO)
    with db.transaction() as tx:
        rows = tx.execute(
            "SELECT id, attempt, ts, LENGTH(text) AS n FROM run_logs "
            "WHERE run_id = ? AND line_no <> ? ORDER BY id",
            marker,
        )
        head = _within(rows, max_chars // 2)
        tail = len(rows) - _within(rows[::-1], max_chars // 2)
        if head >= tail:
            return 0
        first, last = rows[head], rows[tail - 1]
        gone = tail - head
        chars = sum(int(r["n"]) for r in rows[head:tail])
        tx.execute("DELETE FROM run_logs WHERE run_id = ? AND line_no = ?", marker)
        tx.execute(
            "DELETE FROM run_logs WHERE run_id = ? AND id >= ? AND id <= ?",
            (run_id, first["id"], last["id"]),
        )
        tx.execute(
            "INSERT INTO run_logs (id, run_id, attempt, line_no, stream, text, ts) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                first["id"],  # where the removed lines were, in the log's order
                run_id,
                first["attempt"],
                MARKER_LINE_NO,
                "stderr",
                f"[corral: {gone} lines ({chars} characters) removed: the log was over "
                f"{max_chars} characters]",
                first["ts"],
            ),
        )
    return gone


def _within(rows: list[Row], budget: int) -> int:
    """How many of ``rows``, from the first, fit in ``budget`` characters."""
    used = 0
    for i, row in enumerate(rows):
        used += int(row["n"])
        if used > budget:
            return i
    return len(rows)


def _count(tx: Tx, sql: str, params: list[object]) -> int:
    row = tx.one(sql, params)
    return int(row["n"]) if row else 0
