"""What run operations do to a task, inside their transaction: claim ready tasks into runs,
record an attempt's steps, settle a task when its run ends.

Scheduling claims a ready task and creates its run in one transaction, so a crash can
never leave a claimed task without a run or a run without its claim. Completing a task
and waking its dependents is one transaction too: each dependent keeps a counter of
blockers not yet completed, decremented under its row lock, so two blockers finishing at
the same moment on PostgreSQL cannot both see "one left" (the count-then-update of the
seed loses that wake-up). The dependent whose counter reaches zero becomes ready.
"""

from __future__ import annotations

import json
import math
from typing import Any

from corral.runs import AgentSpec, NewRun, Run, RunStatus, RunType
from corral.store.db import Row, Tx
from corral.store.projects import project_from_row
from corral.store.rows import dumps, insert_runs, new_run_row, row_by_id, update_row
from corral.tasks.model import TRANSITIONS, TaskStatus, check_task_transition

# A task run survives this many lost runners before the task attempt counts as failed.
TASK_RUN_ATTEMPTS = 5
MAX_RETRY_BACKOFF_S = 300.0
FAILURE_STATES = ("failed", "merge_conflict", "cancelled", "blocked_by_failure")


def apply_step(tx: Tx, lock: str, run: Row, step: str, data: dict[str, Any], now: float) -> None:
    """A task run finished one step of its attempt: remember it, so a later attempt after a
    crash continues from there instead of starting over."""
    task = row_by_id(tx, "tasks", run["task_id"], lock=lock)
    if task["run_id"] != run["id"]:
        return
    steps = json.loads(task["steps"])
    steps[step] = data
    fields: dict[str, Any] = {"steps": dumps(steps)}
    if step == "agent":
        fields["session_id"] = data.get("session_id")
        if data.get("run_id", run["id"]) == run["id"] and _is_cost(cost := data.get("cost_usd")):
            # The agent's cost is the run's from now on, whatever happens after: the run
            # counts it for its task, plan and session when it ends, however it ends.
            tx.execute(
                "UPDATE runs SET cost_usd = ?, updated_at = ? WHERE id = ?",
                (cost, now, run["id"]),
            )
    if step == "committed":
        fields["commit_sha"] = data.get("commit")
    if step == "cleanup":
        fields["worktree_kept"] = data.get("worktree_kept")
    status = TaskStatus(task["status"])
    target = TaskStatus.MERGING if step == "merging" else TaskStatus.IN_PROGRESS
    if status is not target and target in TRANSITIONS[status]:
        set_task_status(tx, task, target, now, **fields)
    else:
        update_row(tx, "tasks", task["id"], now, **fields)


def settle_task_run(
    tx: Tx, lock: str, run: Run, outcome: dict[str, Any] | None, now: float
) -> list[Run]:
    """A task's run has ended (or was handed back): move the task on and schedule more."""
    # Project first, then task: the order retry() takes them in (no deadlock between them).
    project = row_by_id(
        tx, "projects", row_by_id(tx, "tasks", str(run.task_id))["project_id"], lock=lock
    )
    task = row_by_id(tx, "tasks", str(run.task_id), lock=lock)
    cost = run.cost_usd or 0.0
    if cost:  # spent, even by a run the task has moved on from
        update_row(tx, "tasks", task["id"], now, cost_usd=task["cost_usd"] + cost)
        update_row(tx, "projects", project["id"], now, cost_usd=project["cost_usd"] + cost)
        task = {**task, "cost_usd": task["cost_usd"] + cost}
        project = {**project, "cost_usd": project["cost_usd"] + cost}
    if task["run_id"] != run.id or run.status is RunStatus.PENDING:
        return []
    if TaskStatus(task["status"]).is_settled:
        return schedule(tx, project, now)  # cancelled meanwhile: nothing more to do
    kind = (outcome or {}).get("outcome")
    if outcome:  # kept with the steps: what the attempt ended with, and its timings
        steps = {**json.loads(task["steps"]), "result": outcome}
        update_row(tx, "tasks", task["id"], now, steps=dumps(steps))
    done = {
        "worktree_kept": (outcome or {}).get("worktree_kept"),
        "commit_sha": (outcome or {}).get("commit") or task["commit_sha"],
        "merge_sha": (outcome or {}).get("merge_commit"),
    }
    if run.status is RunStatus.COMPLETED and (
        kind in ("merged", "already_merged")
        or (kind == "no_changes" and project["on_no_changes"] == "complete")
    ):
        _complete(tx, task, now, last_error="no changes" if kind == "no_changes" else None, **done)
    elif kind == "merge_conflict" and project["resolve_conflicts"] and not task["conflict_retries"]:
        # Once, the agent gets the conflict to resolve: a fresh attempt, in its worktree.
        set_task_status(
            tx,
            task,
            TaskStatus.READY,
            now,
            conflict=(outcome or {}).get("conflict"),
            conflict_retries=1,
            steps="{}",
            run_id=None,
            available_at=now,
            last_error="merge conflict: handed back to the agent",
        )
    elif kind == "merge_conflict":
        set_task_status(
            tx,
            task,
            TaskStatus.MERGE_CONFLICT,
            now,
            finished_at=now,
            conflict=(outcome or {}).get("conflict"),
            last_error="merge conflict",
            **done,
        )
        block_dependents(tx, task["id"], now)
    elif run.status is RunStatus.CANCELLED:
        set_task_status(tx, task, TaskStatus.CANCELLED, now, finished_at=now, last_error=run.error)
        block_dependents(tx, task["id"], now)
    elif kind == "missing_program":
        # The runner lacks the agent's program: not the task's fault, and not worth
        # retrying. The task waits (its attempt given back) and the plan run stops
        # claiming, until a plan run starts again (with the program).
        set_task_status(
            tx,
            task,
            TaskStatus.READY,
            now,
            attempts=task["attempts"] - 1,
            run_id=None,
            available_at=now,
            last_error=run.error,
        )
        update_row(tx, "projects", project["id"], now, workers=0)
    else:
        error = (
            "the agent made no changes"
            if kind == "no_changes"
            else (run.error or f"task run {run.status}")
        )
        if kind == "no_changes":  # a retry must run the agent again, not reuse its result
            steps = json.loads(row_by_id(tx, "tasks", task["id"])["steps"])
            steps.pop("agent", None)
            update_row(tx, "tasks", task["id"], now, steps=dumps(steps))
        _fail_attempt(tx, task, project, error, now)
    return schedule(tx, row_by_id(tx, "projects", project["id"]), now)


# ---- helpers ---------------------------------------------------------------------------------


def schedule(tx: Tx, project: Row, now: float) -> list[Run]:
    """Claim ready tasks up to the free workers, highest priority first; each claim and the
    run it creates are one transaction (the caller's). A paused plan, or one that has cost
    its budget, claims nothing (its running tasks go on)."""
    if not project["workers"] or project["paused"] or project_from_row(project).budget_reached:
        return []
    active = tx.one(
        "SELECT COUNT(*) AS n FROM tasks WHERE project_id = ? "
        "AND status IN ('claimed', 'in_progress', 'merging')",
        (project["id"],),
    )
    free = project["workers"] - int(active["n"] if active else 0)
    if free <= 0:
        return []
    ready = tx.execute(
        "SELECT * FROM tasks WHERE project_id = ? AND status = 'ready' AND available_at <= ? "
        "ORDER BY priority DESC, seq LIMIT ?",
        (project["id"], now, free),
    )
    runs = []
    for task in ready:
        agent = AgentSpec.from_dict(json.loads(task["agent"])) if task["agent"] else None
        spec = NewRun(
            type=RunType.TASK,
            prompt=task["prompt"],
            agent=agent,
            session_name=f"task {task['key']}",
            project_dir=project["repo_path"],
            labels=tuple(json.loads(task["labels"])),
            priority=task["priority"],
            max_attempts=TASK_RUN_ATTEMPTS,
            task_id=task["id"],
        )
        (run,) = insert_runs(tx, [new_run_row(spec, now)])
        set_task_status(
            tx,
            task,
            TaskStatus.CLAIMED,
            now,
            run_id=run.id,
            attempts=task["attempts"] + 1,
            started_at=task["started_at"] or now,
        )
        runs.append(run)
    return runs


def _complete(tx: Tx, task: Row, now: float, **fields: Any) -> None:
    set_task_status(tx, task, TaskStatus.COMPLETED, now, finished_at=now, **fields)
    # The wake-up: decrement every dependent's counter under its row lock, then the ones
    # that reached zero (and are still waiting) become ready.
    tx.execute(
        "UPDATE tasks SET remaining_blockers = remaining_blockers - 1, updated_at = ? "
        "WHERE id IN (SELECT task_id FROM task_dependencies WHERE blocked_by = ?)",
        (now, task["id"]),
    )
    # Blocked → ready, in one statement for all of them: the table must allow it.
    check_task_transition(f"dependents of {task['key']}", TaskStatus.BLOCKED, TaskStatus.READY)
    tx.execute(
        "UPDATE tasks SET status = ?, available_at = ?, updated_at = ? "
        "WHERE id IN (SELECT task_id FROM task_dependencies WHERE blocked_by = ?) "
        "AND status = ? AND remaining_blockers = 0",
        (str(TaskStatus.READY), now, now, task["id"], str(TaskStatus.BLOCKED)),
    )


def _fail_attempt(tx: Tx, task: Row, project: Row, error: str, now: float) -> None:
    over_budget = task["budget_usd"] is not None and task["cost_usd"] >= task["budget_usd"]
    if task["attempts"] < task["max_attempts"] and not over_budget:
        delay = min(project["retry_backoff_s"] * 2 ** (task["attempts"] - 1), MAX_RETRY_BACKOFF_S)
        set_task_status(
            tx, task, TaskStatus.READY, now, last_error=error, available_at=now + delay, run_id=None
        )
        return
    if over_budget:
        error = f"task budget ${task['budget_usd']:.2f} reached: {error}"
    set_task_status(tx, task, TaskStatus.FAILED, now, last_error=error, finished_at=now)
    block_dependents(tx, task["id"], now)


def block_dependents(tx: Tx, task_id: str, now: float) -> None:
    """Every task waiting (directly or not) on a failed task can never run: say so."""
    frontier = [task_id]
    while frontier:
        rows = tx.execute(
            "SELECT t.* FROM tasks t JOIN task_dependencies d ON d.task_id = t.id "
            f"WHERE d.blocked_by IN ({', '.join('?' for _ in frontier)}) "
            "AND t.status IN ('blocked', 'ready')",
            frontier,
        )
        for row in rows:
            set_task_status(tx, row, TaskStatus.BLOCKED_BY_FAILURE, now)
        frontier = [r["id"] for r in rows]


def status_from_blockers(tx: Tx, task_id: str, remaining: int) -> TaskStatus:
    failed = tx.one(
        "SELECT COUNT(*) AS n FROM task_dependencies d JOIN tasks b ON b.id = d.blocked_by "
        f"WHERE d.task_id = ? AND b.status IN ({', '.join('?' for _ in FAILURE_STATES)})",
        (task_id, *FAILURE_STATES),
    )
    if failed and failed["n"]:
        return TaskStatus.BLOCKED_BY_FAILURE
    return TaskStatus.READY if remaining == 0 else TaskStatus.BLOCKED


def set_task_status(tx: Tx, row: Row, new: TaskStatus, now: float, **fields: Any) -> None:
    old = TaskStatus(row["status"])
    check_task_transition(row["key"], old, new)
    update_row(tx, "tasks", row["id"], now, status=str(new), **fields)


def _is_cost(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
