"""Commands to runners in the store: numbered, acknowledged, and the events applied.

Commands to a runner (start, cancel, abandon a run) are numbered per runner and stored
before they are sent, in the same transaction as what they announce (a claim and its
start commands, a cancel request and its cancel command are one transaction): a
coordinator restart resends every command the runner has not acknowledged. A WebSocket
runner gets them pushed and acknowledges them on its socket; a long-poll runner asks for
those after the last one it handled (``GET /runner/control?after=``), which acknowledges
that one. ``last_event_idx`` is the runner's last event whose effect is committed: older
ones arriving again are dropped as duplicates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

from corral.ids import RunId
from corral.runs import Run
from corral.store.claims import fill
from corral.store.db import Database, Tx
from corral.store.rows import HELD, dumps


@dataclass(frozen=True)
class Command:
    idx: int
    body: dict[str, Any]
    # The body as stored (JSON): the socket sends it as it is (``messages.Indexed.encoded``).
    stored: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Numbering:
    """Where a runner's numbering stands: its last event applied, its last command
    acknowledged (0 for a runner the store does not know)."""

    last_event_idx: int
    acked_command_idx: int


# A runner socket's start_run command (``coordinator.link_core``: ``{"type": "start_run",
# "run": schemas.start_run_json(run)}``) as PostgreSQL writes it for the claimed run ``c``
# in the claim's statement (``claims.fill``); the task's context is not there (a task run's
# start is made in Python). Its JSON text differs (spaces, a whole float as an integer);
# what it holds does not (floats print exactly under PostgreSQL's default
# extra_float_digits): test_start_commands holds them equal.
START_RUN = (
    "json_build_object('type', 'start_run', 'run', json_build_object("
    "'run_id', c.id, 'type', c.type, 'attempts', c.attempts, 'prompt', c.prompt, "
    "'command', c.command::json, 'session_name', c.session_name, "
    "'session_id', c.session_id, 'agent', c.agent::json, 'project_dir', c.project_dir, "
    "'timeout_s', c.timeout_s, 'idle_timeout_s', c.idle_timeout_s, 'env', c.env::json, "
    "'task_id', c.task_id, 'task', NULL, 'created_at', c.created_at, "
    "'claimed_at', c.claimed_at))"
)

# The runner's events up to an index are applied (its row locked, as any write of it does).
EVENTS_APPLIED = "UPDATE runners SET last_event_idx = ? WHERE id = ? AND last_event_idx < ?"


def events_applied_values(runner_id: str, idx: int) -> tuple[object, ...]:
    return (idx, runner_id, idx)


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
        start_sql: str | None = None,
    ) -> tuple[list[Command], int]:
        """Fill the runner's free slots with pending runs, each with its start command
        (``finishing``: see ``claims.fill``); and how many of its slots are still free.
        ``start_sql``: ``start``'s body as SQL (``START_RUN``), which the claim writes
        itself on PostgreSQL, in the same round trip."""
        with self.db.transaction() as tx:
            filled = fill(tx, self.db, runner_id, now, finishing, start_sql)
            stored = [Command(idx, _parsed(body), body) for idx, body in filled.commands]
            starts = [start(run) for run in filled.runs]  # those it stored none for
            return stored + append(tx, self.db, runner_id, starts, now), filled.free

    def push(self, runner_id: str, bodies: Sequence[dict[str, Any]], now: float) -> list[Command]:
        with self.db.transaction() as tx:
            return append(tx, self.db, runner_id, bodies, now)

    def unacknowledged(self, runner_id: str, after_idx: int) -> list[Command]:
        """Commands after ``after_idx`` (what the runner says it has) not yet acknowledged."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT idx, body FROM runner_commands WHERE runner_id = ? AND idx > ? "
                "ORDER BY idx",
                (runner_id, after_idx),
            )
        return [Command(r["idx"], _parsed(r["body"]), r["body"]) for r in rows]

    def acknowledge(self, runner_id: str, idx: int) -> None:
        """The runner has durably handled commands up to ``idx``: forget them."""
        with self.db.transaction() as tx:
            _acknowledge(tx, runner_id, idx)

    def cancels_to_stop(self, runner_id: str) -> list[RunId]:
        """For a runner whose wire acknowledges nothing (the seed system's agent-runner,
        ``compat_ao``, told again until the run ends): the runs its stored cancel commands
        name that it still holds. The leading commands about runs it no longer holds are
        done: acknowledged here."""
        with self.db.transaction() as tx:
            commands = tx.execute(
                "SELECT idx, body FROM runner_commands WHERE runner_id = ? ORDER BY idx",
                (runner_id,),
            )
            held = {
                r["id"]
                for r in tx.execute(
                    f"SELECT id FROM runs WHERE runner_id = ? AND status IN ({HELD})",
                    (runner_id,),
                )
            }
            named = [(c["idx"], json.loads(c["body"])) for c in commands]
            done = 0
            for idx, body in named:
                if body.get("run_id") in held:
                    break
                done = idx
            if done:
                _acknowledge(tx, runner_id, done)
        return [
            RunId(body["run_id"])
            for _, body in named
            if body["type"] == "cancel_run" and body["run_id"] in held
        ]

    def events_applied(self, runner_id: str, idx: int) -> None:
        with self.db.transaction() as tx:
            tx.execute(EVENTS_APPLIED, events_applied_values(runner_id, idx))

    def forget(self, runner_id: str) -> None:
        """A runner process that is gone for good: its numbering starts over if it returns."""
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM runner_commands WHERE runner_id = ?", (runner_id,))


def append(
    tx: Tx, db: Database, runner_id: str, bodies: Sequence[dict[str, Any]], now: float
) -> list[Command]:
    """Number ``bodies`` after the runner's last command and store them, in the caller's
    transaction. Numbering writes the runner's row: it is locked until commit."""
    if not bodies:
        return []
    stored = [dumps(body) for body in bodies]
    if db.dialect == "postgres" and len(bodies) <= 1000:
        # One statement, one round trip: the numbering and the rows it numbers. The bodies
        # as a VALUES list: bound as one text[], each was escaped into the array's text by
        # psycopg, and a push of 8 start commands cost the coordinator 500 µs of CPU.
        rows = tx.execute(
            "WITH numbered AS (UPDATE runners SET next_command_idx = next_command_idx + ? "
            "WHERE id = ? RETURNING next_command_idx - ? AS first) "
            "INSERT INTO runner_commands (runner_id, idx, body, created_at) "
            "SELECT ?, numbered.first + b.n - 1, b.body, ? FROM numbered, "
            f"(VALUES {', '.join(f'({n}, ?)' for n in range(1, len(bodies) + 1))}) "
            "AS b (n, body) RETURNING idx",
            (len(bodies), runner_id, len(bodies), runner_id, now, *stored),
        )
        assert rows  # its runner exists
        first = min(r["idx"] for r in rows)
        return [
            Command(first + i, body, text)
            for i, (body, text) in enumerate(zip(bodies, stored, strict=True))
        ]
    row = tx.one(
        "UPDATE runners SET next_command_idx = next_command_idx + ? WHERE id = ? "
        "RETURNING next_command_idx",
        (len(bodies), runner_id),
    )
    assert row is not None
    first = row["next_command_idx"] - len(bodies)
    commands = [
        Command(first + i, body, text)
        for i, (body, text) in enumerate(zip(bodies, stored, strict=True))
    ]
    # One statement for many rows: ``Tx.many`` costs PostgreSQL a statement a row, and the
    # coordinator ~350 µs for a push of 8 start commands, against ~250 (at most 1,000 rows
    # a statement: SQLite takes 32,766 parameters, PostgreSQL 65,535).
    for start in range(0, len(commands), 1000):
        chunk = commands[start : start + 1000]
        tx.execute(
            "INSERT INTO runner_commands (runner_id, idx, body, created_at) VALUES "
            + ", ".join("(?, ?, ?, ?)" for _ in chunk),
            [x for c in chunk for x in (runner_id, c.idx, c.stored, now)],
        )
    return commands


def _parsed(body: str) -> dict[str, Any]:
    """A stored command's body. pydantic's parser reads a start_run's in a third of
    ``json.loads``'s time (same values, floats too); it refuses a lone surrogate's escape,
    which ``json.loads`` reads (a command stored before such strings were refused)."""
    try:
        parsed: dict[str, Any] = pydantic_core.from_json(body)
    except ValueError:
        parsed = json.loads(body)
    return parsed


def _acknowledge(tx: Tx, runner_id: str, idx: int) -> None:
    tx.execute(
        "UPDATE runners SET acked_command_idx = ? WHERE id = ? AND acked_command_idx < ?",
        (idx, runner_id, idx),
    )
    tx.execute("DELETE FROM runner_commands WHERE runner_id = ? AND idx <= ?", (runner_id, idx))
