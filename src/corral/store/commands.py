"""Commands to runners in the store (the WebSocket link): numbered, and the events applied.

Commands to a runner (start, cancel, abandon a run) are numbered per runner and stored
before they are sent, in the same transaction as what they announce (a claim and its
start command are one transaction): a coordinator restart resends every command the
runner has not acknowledged. ``last_event_idx`` is the runner's last event whose effect
is committed: older ones arriving again are dropped as duplicates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from corral.runs import Run
from corral.store.claims import claim
from corral.store.db import Database, Tx
from corral.store.rows import dumps


@dataclass(frozen=True)
class Command:
    idx: int
    body: dict[str, Any]


@dataclass(frozen=True)
class Numbering:
    """Where a runner's numbering stands: its last event applied, its last command
    acknowledged (0 for a runner the store does not know)."""

    last_event_idx: int
    acked_command_idx: int


class CommandStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def state(self, runner_id: str) -> Numbering:
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT last_event_idx, acked_command_idx FROM runners WHERE id = ?", (runner_id,)
            )
        if row is None:
            return Numbering(0, 0)
        return Numbering(row["last_event_idx"], row["acked_command_idx"])

    def claim_into_commands(
        self,
        runner_id: str,
        now: float,
        start: Callable[[Run], dict[str, Any]],
        finishing: Collection[tuple[str, int]] = (),
    ) -> list[Command]:
        """Fill the runner's free slots with pending runs, each with its start command
        (``finishing``: see ``claims.claim``)."""
        with self.db.transaction() as tx:
            runs = claim(tx, self.db, runner_id, None, now, finishing)
            return _append(tx, runner_id, [start(run) for run in runs], now)

    def push(self, runner_id: str, bodies: Sequence[dict[str, Any]], now: float) -> list[Command]:
        with self.db.transaction() as tx:
            return _append(tx, runner_id, bodies, now)

    def unacknowledged(self, runner_id: str, after_idx: int) -> list[Command]:
        """Commands after ``after_idx`` (what the runner says it has) not yet acknowledged."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT idx, body FROM runner_commands WHERE runner_id = ? AND idx > ? "
                "ORDER BY idx",
                (runner_id, after_idx),
            )
        return [Command(r["idx"], json.loads(r["body"])) for r in rows]

    def acknowledge(self, runner_id: str, idx: int) -> None:
        """The runner has durably handled commands up to ``idx``: forget them."""
        with self.db.transaction() as tx:
            tx.execute(
                "UPDATE runners SET acked_command_idx = ? WHERE id = ? AND acked_command_idx < ?",
                (idx, runner_id, idx),
            )
            tx.execute(
                "DELETE FROM runner_commands WHERE runner_id = ? AND idx <= ?", (runner_id, idx)
            )

    def events_applied(self, runner_id: str, idx: int) -> None:
        with self.db.transaction() as tx:
            tx.execute(
                "UPDATE runners SET last_event_idx = ? WHERE id = ? AND last_event_idx < ?",
                (idx, runner_id, idx),
            )

    def forget(self, runner_id: str) -> None:
        """A runner process that is gone for good: its numbering starts over if it returns."""
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM runner_commands WHERE runner_id = ?", (runner_id,))


def _append(tx: Tx, runner_id: str, bodies: Sequence[dict[str, Any]], now: float) -> list[Command]:
    if not bodies:
        return []
    row = tx.one(
        "UPDATE runners SET next_command_idx = next_command_idx + ? WHERE id = ? "
        "RETURNING next_command_idx",
        (len(bodies), runner_id),
    )
    assert row is not None
    first = row["next_command_idx"] - len(bodies)
    commands = [Command(first + i, body) for i, body in enumerate(bodies)]
    tx.many(
        "INSERT INTO runner_commands (runner_id, idx, body, created_at) VALUES (?, ?, ?, ?)",
        [(runner_id, c.idx, dumps(c.body), now) for c in commands],
    )
    return commands
