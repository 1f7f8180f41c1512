"""The claim, and the lease it takes: who may still act on a run.

A claim gives pending runs to an active runner and takes their lease (runner id, attempt
number) in one transaction. Every later report about the run names that lease; a report
from anyone else is refused (``LeaseLost``). These functions run inside the caller's
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, replace

from corral.errors import LeaseLost
from corral.ids import RunId
from corral.runners import ALIVE, Runner, RunnerState
from corral.runs import Run, RunStatus, may_become
from corral.store.db import Database, Row, Tx
from corral.store.rows import HELD, row_by_id, run_from_row, sql_in
from corral.store.tasks import task_context

# The statuses a claim takes runs from, as the transition table says (pending), written as
# the index runs_claimable's condition so that the claim reads that index.
CLAIMABLE = sql_in("status", may_become(RunStatus.CLAIMED))


@dataclass(frozen=True)
class Claimable:
    """A pending run ready to be claimed, and what it requires of a runner."""

    run_id: RunId
    required_runner: str | None  # a runner name
    labels: frozenset[str]

    def fits(self, runner: Runner) -> bool:
        """Could ``runner`` claim it? (The claim's own conditions, in memory.)"""
        named = self.required_runner is None or self.required_runner == runner.name
        return named and self.labels <= set(runner.labels)


def has_claimable(tx: Tx, now: float, since: float | None) -> bool:
    sql = f"SELECT 1 AS x FROM runs WHERE {CLAIMABLE} AND available_at <= ?"
    params: tuple[float, ...] = (now,)
    if since is not None:
        sql += " AND (available_at > ? OR updated_at > ?)"
        params += (since, since)
    return tx.one(sql + " LIMIT 1", params) is not None


def claimable(tx: Tx, now: float, limit: int) -> list[Claimable]:
    rows = tx.execute(
        "SELECT id, required_runner, labels FROM runs "
        f"WHERE {CLAIMABLE} AND available_at <= ? "
        "ORDER BY priority DESC, created_at, id LIMIT ?",
        (now, limit),
    )
    return [
        Claimable(RunId(r["id"]), r["required_runner"], frozenset(json.loads(r["labels"])))
        for r in rows
    ]


def claim(
    tx: Tx,
    db: Database,
    runner_id: str,
    max_runs: int | None,
    now: float,
    finishing: Collection[tuple[str, int]] = (),
) -> list[Run]:
    """Give up to ``max_runs`` pending runs to an active runner; ``None``: fill its free
    slots. ``finishing``: (run, attempt) the runner has reported ended, in reports not yet
    applied — their slots are free on the runner though the store still counts them.

    On PostgreSQL, ``FOR UPDATE SKIP LOCKED`` makes concurrent claimers pass over each
    other's rows; the seemingly equivalent single ``UPDATE … WHERE id = (SELECT … LIMIT 1)``
    double-claims there under concurrency. On SQLite the immediate transaction holds the
    one write lock, so the same select-then-update is safe.
    """
    # Locked, so a reconciler cannot declare the runner lost (and take back what it
    # holds) between this check and the commit, stranding the new claim.
    runner = row_by_id(tx, "runners", runner_id, lock=db.lock_rows())
    check_not_lost(runner)
    if runner["state"] != RunnerState.ACTIVE:
        return []  # draining: it finishes what it has and takes nothing new
    if max_runs is None:
        held = tx.execute(
            f"SELECT id, attempts FROM runs WHERE runner_id = ? AND status IN ({HELD})",
            (runner_id,),
        )
        busy = sum((r["id"], r["attempts"]) not in finishing for r in held)
        max_runs = runner["slots"] - busy
        if max_runs <= 0:
            return []
    # Labels are matched in SQL: runs this runner cannot take never hide ones it can.
    candidates = tx.execute(
        f"SELECT id FROM runs WHERE {CLAIMABLE} AND available_at <= ? "
        "AND (required_runner IS NULL OR required_runner = ?) "
        f"AND {db.json_subset('labels')} "
        "ORDER BY priority DESC, created_at, id LIMIT ? " + db.lock_rows(skip_locked=True),
        (now, runner["name"], runner["labels"], max_runs),
    )
    chosen = [c["id"] for c in candidates]
    if not chosen:
        return []
    rows = tx.execute(
        "UPDATE runs SET status = ?, runner_id = ?, attempts = attempts + 1, "
        "claimed_at = ?, started_at = NULL, cancel_requested = 0, updated_at = ? "
        f"WHERE id IN ({', '.join('?' for _ in chosen)}) AND {CLAIMABLE} "
        "RETURNING *",
        (str(RunStatus.CLAIMED), runner_id, now, now, *chosen),
    )
    # A task run goes out with its task, project and the steps already done: read here, in
    # the claim's transaction, for every transport.
    runs = [
        replace(run, task=task_context(tx, run.task_id)) if run.task_id else run
        for run in map(run_from_row, rows)
    ]
    runs.sort(key=lambda r: (-r.priority, r.created_at, r.id))
    return runs


def check_not_lost(runner: Row) -> None:
    """A runner declared lost (or stopped) holds nothing any more: it must register again."""
    if runner["state"] not in ALIVE:
        raise LeaseLost(
            f"runner {runner['id']} is {runner['state']}; register again", code="runner_lost"
        )


def check_lease(row: Row, runner_id: str, attempt: int) -> None:
    if row["runner_id"] != runner_id:
        # Not the holder's id: the caller is not the one to learn it (issue 9).
        raise LeaseLost(
            f"run {row['id']} is not held by runner {runner_id} (status {row['status']})"
        )
    if row["attempts"] != attempt:
        raise LeaseLost(
            f"run {row['id']} is not held by runner {runner_id} attempt {attempt} "
            f"(it holds attempt {row['attempts']}, status {row['status']})",
        )


def leased_row(tx: Tx, run_id: str, runner_id: str, attempt: int) -> Row:
    """The run's row, locked, if this runner and attempt hold its lease (else LeaseLost)."""
    row = row_by_id(tx, "runs", run_id, lock=tx.lock)
    check_lease(row, runner_id, attempt)
    return row
