"""Sub-agent sessions in the store: the checks a child passes before it is written, the
callback a child owes its parent when it ends, and the delivery of those callbacks.

The rules are ``corral.subagents``'s; this module carries them out in transactions:

- ``check_children``: in the transaction that writes new runs, resolves each one's parent
  session and refuses (nothing written) a child too deep, beyond the parent's fan-out, or
  over the budget that covers the parent and all its descendants.
- ``record``: in the transaction that ends an ``async_callback`` child, however it ends,
  one row of ``run_callbacks`` (its primary key is the child: recorded once).
- ``CallbackStore.deliver``: the pending callbacks of idle parents become one resume run
  per parent, written with the guarded marks of the callbacks it carries in one
  transaction. A coordinator killed before it commits leaves them pending (delivered at
  the next pass); one that committed left nothing pending; two delivering at once cannot
  both mark a callback (the second's update finds it delivered, and it rolls back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.errors import Conflict, InvalidRequest, NotFound
from corral.runs import AgentSpec, NewRun, Run, RunStatus, RunType
from corral.store.db import Database, Row, Tx
from corral.store.rows import insert_runs, loads, new_run_row, sql_list
from corral.subagents import (
    CALLBACK_OUTPUT_LINES,
    ChildResult,
    Limits,
    Mode,
    Parent,
    ParentState,
    PendingCallback,
    check_spawn,
    plan_deliveries,
)

_UNFINISHED = sql_list(s for s in RunStatus if not s.is_terminal)

# The parent and every session below it (``UNION`` stops at a session seen twice).
_SUBTREE_COST = """
WITH RECURSIVE tree (id) AS (
    SELECT CAST(? AS TEXT)
    UNION
    SELECT r.session_id FROM runs r JOIN tree t ON r.parent_session_id = t.id
    WHERE r.session_id IS NOT NULL
)
SELECT COALESCE(SUM(s.cost_usd), 0) AS cost FROM sessions s WHERE s.id IN (SELECT id FROM tree)
"""


_ANY_PENDING = (
    "SELECT 1 AS pending FROM run_callbacks WHERE delivered_run_id IS NULL AND dropped IS NULL "
    "LIMIT 1"
)


def check_children(tx: Tx, db: Database, rows: Sequence[Row], limits: Limits) -> None:
    """Resolve and check the parent of each new run that names one, in place: its
    ``parent_session_id`` becomes the parent's id and ``depth`` its depth. Raises the
    refusal of the first child that may not start."""
    started: dict[str, int] = {}  # children of each parent in this same request
    for row in rows:
        key = row["parent_session_id"]
        if key is None:
            if row["callback"] == Mode.ASYNC_CALLBACK:
                raise InvalidRequest("an async_callback run needs a 'parent_session'")
            continue
        session = tx.one(f"SELECT * FROM sessions WHERE id = ? {db.lock_rows()}", (key,)) or tx.one(
            "SELECT * FROM sessions WHERE name = ? ORDER BY updated_at DESC LIMIT 1 "
            + db.lock_rows(),
            (key,),
        )
        if session is None:
            raise NotFound(f"parent session {key!r} not found", code="parent_not_found")
        parent_id = session["id"]
        row["parent_session_id"] = parent_id
        parent = _parent(tx, parent_id)
        parent = Parent(
            session_id=parent.session_id,
            depth=parent.depth,
            active_children=parent.active_children + started.get(parent_id, 0),
            budget_usd=parent.budget_usd,
            cost_with_children_usd=parent.cost_with_children_usd,
        )
        row["depth"] = check_spawn(parent, limits, nests=row["type"] != RunType.COMMAND)
        started[parent_id] = started.get(parent_id, 0) + 1


def _parent(tx: Tx, session_id: str) -> Parent:
    runs = tx.one("SELECT MAX(depth) AS depth FROM runs WHERE session_id = ?", (session_id,))
    active = tx.one(
        f"SELECT COUNT(*) AS n FROM runs WHERE parent_session_id = ? AND status IN ({_UNFINISHED})",
        (session_id,),
    )
    cost = tx.one(_SUBTREE_COST, (session_id,))
    return Parent(
        session_id=session_id,
        depth=int((runs or {}).get("depth") or 0),
        active_children=int((active or {}).get("n") or 0),
        budget_usd=_budget(_last_agent(tx, session_id)),
        cost_with_children_usd=float((cost or {}).get("cost") or 0.0),
    )


def _last_agent(tx: Tx, session_id: str) -> dict[str, Any] | None:
    row = tx.one(
        "SELECT agent FROM runs WHERE session_id = ? AND agent IS NOT NULL "
        "ORDER BY created_at DESC, id DESC LIMIT 1",
        (session_id,),
    )
    agent: dict[str, Any] | None = loads(row["agent"]) if row else None
    return agent


def _budget(agent: dict[str, Any] | None) -> float | None:
    budget = agent.get("budget_usd") if agent else None
    return float(budget) if budget is not None else None


def record(tx: Tx, run: Run, now: float) -> None:
    """The child ``run`` ended: it owes its parent a callback (once, whatever ends it)."""
    if run.callback != Mode.ASYNC_CALLBACK or run.parent_session_id is None:
        return
    tx.execute(
        "INSERT INTO run_callbacks (child_run_id, parent_session_id, finished_at) "
        "VALUES (?, ?, ?) ON CONFLICT (child_run_id) DO NOTHING",
        (run.id, run.parent_session_id, run.finished_at or now),
    )


@dataclass(frozen=True)
class Delivered:
    resumes: list[Run] = field(default_factory=list)  # one per parent resumed
    dropped: list[str] = field(default_factory=list)  # child run ids whose parent is gone


class CallbackStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def pending(self) -> list[str]:
        """The child runs whose callbacks are neither delivered nor dropped."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT child_run_id FROM run_callbacks WHERE delivered_run_id IS NULL "
                "AND dropped IS NULL ORDER BY finished_at, child_run_id"
            )
        return [r["child_run_id"] for r in rows]

    def is_child(self, session_id: str, parent_session_id: str) -> bool:
        """Whether a run of ``session_id`` was started as a child of the parent session."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT 1 AS child FROM runs WHERE parent_session_id = ? AND session_id = ? "
                "LIMIT 1",
                (parent_session_id, session_id),
            )
        return row is not None

    def delivered_by(self, child_run_id: str) -> tuple[str | None, str | None]:
        """The resume run that carried this child's callback, and why it was dropped."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT delivered_run_id, dropped FROM run_callbacks WHERE child_run_id = ?",
                (child_run_id,),
            )
        if row is None:
            raise NotFound.of("callback", child_run_id)
        return row["delivered_run_id"], row["dropped"]

    def deliver(self, now: float, limits: Limits | None = None, batch: int = 500) -> Delivered:
        """Start a resume of each idle parent with the results of its children that ended,
        and drop the callbacks of parents that are gone or failed. One transaction."""
        # Most looks find nothing (any session's run that ends wakes the deliverer): ask
        # the pending rows' index first, without taking SQLite's write lock.
        with self.db.transaction(write=False) as tx:
            if tx.one(_ANY_PENDING) is None:
                return Delivered()
        with self.db.transaction() as tx:
            rows = tx.execute(
                "SELECT c.parent_session_id, c.finished_at AS ended_at, r.* "
                "FROM run_callbacks c JOIN runs r ON r.id = c.child_run_id "
                "WHERE c.delivered_run_id IS NULL AND c.dropped IS NULL "
                "ORDER BY c.finished_at, c.child_run_id LIMIT ?",
                (batch,),
            )
            if not rows:
                return Delivered()
            pending = [PendingCallback(r["parent_session_id"], _child(tx, r)) for r in rows]
            parents = {p: _parent_state(tx, p) for p in {c.parent_session_id for c in pending}}
            deliveries, dropped = plan_deliveries(pending, parents, limits or Limits())
            done = Delivered()
            for drop in dropped:
                _settle(tx, [drop.child_run_id], now, dropped=drop.code)
                done.dropped.append(drop.child_run_id)
            for delivery in deliveries:
                resume = _resume_row(tx, delivery.parent_session_id, delivery.prompt, now)
                done.resumes.extend(insert_runs(tx, [resume]))
                children = [c.run_id for c in delivery.children]
                _settle(tx, children, now, delivered_run_id=resume["id"])
            return done


def _child(tx: Tx, row: Row) -> ChildResult:
    command = row["type"] == RunType.COMMAND
    return ChildResult(
        run_id=row["id"],
        session_name=row["session_name"],
        session_id=row["session_id"],
        status=row["status"],
        result=row["result"],
        error=row["error"],
        cost_usd=row["cost_usd"],
        finished_at=row["ended_at"],
        command=tuple(loads(row["command"])) if command else None,
        exit_code=row["exit_code"],
        output=_output_tail(tx, row["id"], row["attempts"]) if command else (),
    )


def _output_tail(tx: Tx, run_id: str, attempt: int) -> tuple[str, ...]:
    """The last lines a command child wrote (of its last attempt), oldest first."""
    rows = tx.execute(
        "SELECT text FROM run_logs WHERE run_id = ? AND attempt = ? ORDER BY line_no DESC LIMIT ?",
        (run_id, attempt, CALLBACK_OUTPUT_LINES),
    )
    return tuple(r["text"] for r in reversed(rows))


def _parent_state(tx: Tx, session_id: str) -> ParentState:
    session = tx.one("SELECT is_error, runner_id FROM sessions WHERE id = ?", (session_id,))
    busy = tx.one(
        f"SELECT 1 AS busy FROM runs WHERE session_id = ? AND status IN ({_UNFINISHED}) LIMIT 1",
        (session_id,),
    )
    # A failed parent (its last run did not complete) is not resumed with its children's
    # results: they are dropped like a gone parent's, never left waiting.
    usable = session is not None and session["runner_id"] and not session["is_error"]
    parent = _parent(tx, session_id)
    spent = parent.budget_usd is not None and parent.cost_with_children_usd >= parent.budget_usd
    return ParentState(
        session_id,
        exists=bool(usable) or busy is not None,
        busy=busy is not None,
        over_budget=spent,
    )


def _resume_row(tx: Tx, session_id: str, prompt: str, now: float) -> Row:
    session = tx.one("SELECT * FROM sessions WHERE id = ?", (session_id,))
    assert session is not None  # planned as existing, in this transaction
    runner = tx.one("SELECT name FROM runners WHERE id = ?", (session["runner_id"],))
    last = tx.one(
        "SELECT * FROM runs WHERE session_id = ? ORDER BY created_at DESC, id DESC LIMIT 1",
        (session_id,),
    )
    agent = _last_agent(tx, session_id)
    spec = NewRun(
        type=RunType.RESUME_SESSION,
        prompt=prompt,
        session_id=session_id,
        session_name=session["name"],
        agent=AgentSpec.from_dict(agent) if agent else None,
        project_dir=session["project_dir"],
        labels=tuple(loads(last["labels"])) if last else (),
        required_runner=runner["name"] if runner else None,
    )
    row = new_run_row(spec, now)
    # The resume is a run of the parent: as deep as the parent, owing its own parent nothing.
    row["depth"] = int(last["depth"]) if last else 0
    return row


def _settle(
    tx: Tx,
    child_run_ids: Sequence[str],
    now: float,
    *,
    delivered_run_id: str | None = None,
    dropped: str | None = None,
) -> None:
    """Mark callbacks delivered or dropped, only while still pending: if another
    coordinator settled one first, roll the whole delivery back (it is theirs)."""
    marks = ", ".join("?" for _ in child_run_ids)
    settled = tx.execute(
        "UPDATE run_callbacks SET delivered_run_id = ?, dropped = ?, settled_at = ? "
        f"WHERE child_run_id IN ({marks}) AND delivered_run_id IS NULL AND dropped IS NULL "
        "RETURNING child_run_id",
        (delivered_run_id, dropped, now, *child_run_ids),
    )
    if len(settled) != len(child_run_ids):
        raise Conflict(
            f"callbacks of {', '.join(child_run_ids)} were settled meanwhile",
            code="callback_settled",
        )
