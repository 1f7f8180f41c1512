"""Task graphs in the store: import tasks, claim ready ones into runs, settle attempts.

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
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.errors import Conflict, InvalidRequest, NotFound
from corral.runs import AgentSpec, NewRun, Run, RunStatus, RunType
from corral.store.db import Database, Row, Tx
from corral.store.rows import dumps, new_run_row, row_by_id, run_from_row
from corral.tasks.model import (
    TRANSITIONS,
    Project,
    Task,
    TaskSpec,
    TaskStatus,
    check_task_transition,
)
from corral.tasks.plan import check_graph

# A task run survives this many lost runners before the task attempt counts as failed.
TASK_RUN_ATTEMPTS = 5
MAX_RETRY_BACKOFF_S = 300.0
FAILURE_STATES = ("failed", "merge_conflict", "cancelled", "blocked_by_failure")


@dataclass(frozen=True)
class ImportResult:
    created: list[str]
    updated: list[str]
    unchanged: list[str]


class TaskStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ---- projects ------------------------------------------------------------------------

    def ensure_project(
        self,
        repo_path: str,
        target_branch: str,
        now: float,
        *,
        merge_strategy: str | None = None,
        on_no_changes: str | None = None,
        setup_command: Sequence[str] | None = None,
        budget_usd: float | None = None,
        retry_backoff_s: float | None = None,
        resolve_conflicts: bool | None = None,
    ) -> Project:
        """The project of this repository and branch, created on first use; settings given
        here replace the stored ones."""
        if merge_strategy not in (None, "merge", "ff"):
            raise InvalidRequest(f"merge must be 'merge' or 'ff', not {merge_strategy!r}")
        if on_no_changes not in (None, "fail", "complete"):
            raise InvalidRequest(
                f"on_no_changes must be 'fail' or 'complete', not {on_no_changes!r}"
            )
        with self.db.transaction() as tx:
            row = tx.one(
                "SELECT * FROM projects WHERE repo_path = ? AND target_branch = ? "
                + self.db.lock_rows(),
                (repo_path, target_branch),
            )
            if row is None:
                pid = f"prj_{secrets.token_hex(6)}"
                tx.execute(
                    "INSERT INTO projects (id, repo_path, target_branch, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (pid, repo_path, target_branch, now, now),
                )
            else:
                pid = row["id"]
            changes: dict[str, Any] = {
                "merge_strategy": merge_strategy,
                "on_no_changes": on_no_changes,
                "setup_command": dumps(list(setup_command)) if setup_command else None,
                "budget_usd": budget_usd,
                "retry_backoff_s": retry_backoff_s,
                "resolve_conflicts": None if resolve_conflicts is None else int(resolve_conflicts),
            }
            _update(tx, "projects", pid, now, **{k: v for k, v in changes.items() if v is not None})
            return project_from_row(row_by_id(tx, "projects", pid))

    def get_project(self, project_id: str) -> Project:
        with self.db.transaction(write=False) as tx:
            return project_from_row(row_by_id(tx, "projects", project_id))

    def find_project(self, repo_path: str, target_branch: str | None = None) -> Project:
        with self.db.transaction(write=False) as tx:
            sql = "SELECT * FROM projects WHERE repo_path = ?"
            params: list[Any] = [repo_path]
            if target_branch:
                sql += " AND target_branch = ?"
                params.append(target_branch)
            rows = tx.execute(sql + " ORDER BY updated_at DESC", params)
        if not rows:
            raise NotFound.of(
                "project", f"{repo_path}{'@' + target_branch if target_branch else ''}"
            )
        return project_from_row(rows[0])

    def list_projects(self) -> list[Project]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute("SELECT * FROM projects ORDER BY updated_at DESC")
        return [project_from_row(r) for r in rows]

    # ---- adding tasks --------------------------------------------------------------------

    def add_tasks(
        self,
        project_id: str,
        specs: Sequence[TaskSpec],
        agents: dict[str, AgentSpec],
        now: float,
        *,
        digest: str | None = None,
    ) -> ImportResult:
        """Add tasks (a plan, or one from the CLI). Idempotent: a task whose key exists with
        the same content is left alone; one not started yet takes the new content; the
        dependencies of an existing task cannot change. All or nothing."""
        result = ImportResult([], [], [])
        with self.db.transaction() as tx:
            row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            existing = {
                r["key"]: r
                for r in tx.execute("SELECT * FROM tasks WHERE project_id = ?", (project_id,))
            }
            deps = _dependency_keys(tx, project_id)
            new_specs = [s for s in specs if s.key not in existing]
            check_graph(new_specs, known=existing.keys())
            for spec in specs:
                if spec.key in existing:
                    _refresh_task(
                        tx, existing[spec.key], spec, deps.get(spec.key, ()), agents, now, result
                    )
            ids = {key: row["id"] for key, row in existing.items()}
            for spec in new_specs:
                ids[spec.key] = f"tsk_{secrets.token_hex(6)}"
            for spec in new_specs:
                _insert_task(tx, project_id, ids[spec.key], spec, agents.get(spec.key), now)
            # Dependencies once every task row exists: a plan may list a task before the
            # tasks it waits for (order inside a plan does not matter).
            tx.many(
                "INSERT INTO task_dependencies (task_id, blocked_by) VALUES (?, ?)",
                [
                    (ids[spec.key], ids[blocker])
                    for spec in new_specs
                    for blocker in dict.fromkeys(spec.after)
                ],
            )
            for spec in new_specs:  # statuses once every blocker row exists
                _settle_initial_status(tx, ids[spec.key], now)
                result.created.append(spec.key)
            if digest is not None:
                _update(tx, "projects", project_id, now, plan_digest=digest)
        return result

    # ---- reading -------------------------------------------------------------------------

    def list_tasks(self, project_id: str) -> list[Task]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                f"{_TASK_WITH_RUN} WHERE t.project_id = ? ORDER BY t.seq", (project_id,)
            )
            deps = _dependency_keys(tx, project_id)
        return [task_from_row(r, deps.get(r["key"], ())) for r in rows]

    def get_task(self, project_id: str, key: str) -> Task:
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                f"{_TASK_WITH_RUN} WHERE t.project_id = ? AND t.key = ?", (project_id, key)
            )
            if row is None:
                raise NotFound.of("task", key)
            deps = _dependency_keys(tx, project_id)
        return task_from_row(row, deps.get(key, ()))

    def task_context(self, task_id: str) -> dict[str, Any]:
        with self.db.transaction(write=False) as tx:
            return task_context_tx(tx, task_id)

    # ---- control -------------------------------------------------------------------------

    def start(self, project_id: str, workers: int, now: float) -> list[Run]:
        """Let the scheduler keep up to ``workers`` tasks going; claims what it can now."""
        if workers < 1:
            raise InvalidRequest("a plan run needs at least one worker")
        with self.db.transaction() as tx:
            project = row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            _update(tx, "projects", project_id, now, workers=workers)
            return _schedule(tx, {**project, "workers": workers}, now)

    def stop(self, project_id: str, now: float) -> Project:
        """No more claims (running tasks go on)."""
        with self.db.transaction() as tx:
            row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            _update(tx, "projects", project_id, now, workers=0)
            return project_from_row(row_by_id(tx, "projects", project_id))

    def set_paused(
        self, project_id: str, paused: bool, now: float, reason: str | None = None
    ) -> list[Run]:
        with self.db.transaction() as tx:
            project = row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            _update(
                tx,
                "projects",
                project_id,
                now,
                paused=int(paused),
                pause_reason=reason if paused else None,
            )
            if paused:
                return []
            return _schedule(tx, {**project, "paused": 0}, now)

    def schedule(self, project_id: str, now: float) -> list[Run]:
        with self.db.transaction() as tx:
            project = row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            return _schedule(tx, project, now)

    def schedule_all(self, now: float) -> list[Run]:
        """Claim ready tasks of every running project (retry backoffs that ended)."""
        with self.db.transaction(write=False) as tx:
            ids = [
                r["id"]
                for r in tx.execute(
                    "SELECT DISTINCT p.id FROM projects p JOIN tasks t ON t.project_id = p.id "
                    "WHERE p.workers > 0 AND p.paused = 0 AND t.status = 'ready' "
                    "AND (p.budget_usd IS NULL OR p.cost_usd < p.budget_usd) "
                    "AND t.available_at <= ?",
                    (now,),
                )
            ]
        return [run for pid in ids for run in self.schedule(pid, now)]

    def retry(self, project_id: str, key: str, now: float) -> tuple[Task, list[Run]]:
        """Bring a failed, conflicted or cancelled task back (attempts start over), and its
        dependents that were blocked by its failure."""
        with self.db.transaction() as tx:
            project = row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            row = _task_by_key(tx, project_id, key)
            status = TaskStatus(row["status"])
            if status not in (TaskStatus.FAILED, TaskStatus.MERGE_CONFLICT, TaskStatus.CANCELLED):
                raise Conflict(
                    f"task {key} is {status}; only failed, merge_conflict or "
                    "cancelled tasks can be retried",
                    code="not_retryable",
                )
            target = _status_from_blockers(tx, row["id"], row["remaining_blockers"])
            _set_task_status(
                tx,
                row,
                target,
                now,
                attempts=0,
                steps="{}",
                last_error=None,
                available_at=now,
                finished_at=None,
                run_id=None,
            )
            _restore_dependents(tx, row["id"], now)
            runs = _schedule(tx, project, now)
            deps = _dependency_keys(tx, project_id)
            return task_from_row(row_by_id(tx, "tasks", row["id"]), deps.get(key, ())), runs

    def cancel(self, project_id: str, key: str, now: float) -> Task:
        """Cancel a task that has not finished; its dependents become blocked_by_failure.
        The caller cancels its run, if it has one going."""
        with self.db.transaction() as tx:
            row = _task_by_key(tx, project_id, key, lock=self.db.lock_rows())
            _set_task_status(
                tx, row, TaskStatus.CANCELLED, now, finished_at=now, last_error="cancelled"
            )
            _block_dependents(tx, row["id"], now)
            deps = _dependency_keys(tx, project_id)
            return task_from_row(row_by_id(tx, "tasks", row["id"]), deps.get(key, ()))


def task_context_tx(tx: Tx, task_id: str) -> dict[str, Any]:
    """What a runner needs for a task run: the task, its project, the steps done."""
    task = row_by_id(tx, "tasks", task_id)
    project = project_from_row(row_by_id(tx, "projects", task["project_id"]))
    return {
        "id": task["id"],
        "key": task["key"],
        "title": task["title"],
        "prompt": task["prompt"],
        "attempt": task["attempts"],
        "steps": json.loads(task["steps"]),
        "conflict": task["conflict"],
        "repo_path": project.repo_path,
        "target_branch": project.target_branch,
        "merge_strategy": project.merge_strategy,
        "on_no_changes": project.on_no_changes,
        "setup_command": list(project.setup_command) if project.setup_command else None,
    }


# ---- hooks called from run operations (inside their transaction) -----------------------------


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
        _set_task_status(tx, task, target, now, **fields)
    else:
        _update(tx, "tasks", task["id"], now, **fields)


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
        _update(tx, "tasks", task["id"], now, cost_usd=task["cost_usd"] + cost)
        _update(tx, "projects", project["id"], now, cost_usd=project["cost_usd"] + cost)
        task = {**task, "cost_usd": task["cost_usd"] + cost}
        project = {**project, "cost_usd": project["cost_usd"] + cost}
    if task["run_id"] != run.id or run.status is RunStatus.PENDING:
        return []
    if TaskStatus(task["status"]).is_settled:
        return _schedule(tx, project, now)  # cancelled meanwhile: nothing more to do
    kind = (outcome or {}).get("outcome")
    if outcome:  # kept with the steps: what the attempt ended with, and its timings
        steps = {**json.loads(task["steps"]), "result": outcome}
        _update(tx, "tasks", task["id"], now, steps=dumps(steps))
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
        _set_task_status(
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
        _set_task_status(
            tx,
            task,
            TaskStatus.MERGE_CONFLICT,
            now,
            finished_at=now,
            conflict=(outcome or {}).get("conflict"),
            last_error="merge conflict",
            **done,
        )
        _block_dependents(tx, task["id"], now)
    elif run.status is RunStatus.CANCELLED:
        _set_task_status(tx, task, TaskStatus.CANCELLED, now, finished_at=now, last_error=run.error)
        _block_dependents(tx, task["id"], now)
    elif kind == "missing_program":
        # The runner lacks the agent's program: not the task's fault, and not worth
        # retrying. The task waits (its attempt given back) and the plan run stops
        # claiming, until a plan run starts again (with the program).
        _set_task_status(
            tx,
            task,
            TaskStatus.READY,
            now,
            attempts=task["attempts"] - 1,
            run_id=None,
            available_at=now,
            last_error=run.error,
        )
        _update(tx, "projects", project["id"], now, workers=0)
    else:
        error = (
            "the agent made no changes"
            if kind == "no_changes"
            else (run.error or f"task run {run.status}")
        )
        if kind == "no_changes":  # a retry must run the agent again, not reuse its result
            steps = json.loads(row_by_id(tx, "tasks", task["id"])["steps"])
            steps.pop("agent", None)
            _update(tx, "tasks", task["id"], now, steps=dumps(steps))
        _fail_attempt(tx, task, project, error, now)
    return _schedule(tx, row_by_id(tx, "projects", project["id"]), now)


# ---- helpers ---------------------------------------------------------------------------------


def _is_cost(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _schedule(tx: Tx, project: Row, now: float) -> list[Run]:
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
        row = new_run_row(spec, now)
        columns = list(row)
        tx.execute(
            f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
            list(row.values()),
        )
        _set_task_status(
            tx,
            task,
            TaskStatus.CLAIMED,
            now,
            run_id=row["id"],
            attempts=task["attempts"] + 1,
            started_at=task["started_at"] or now,
        )
        runs.append(run_from_row({**row, "exit_code": None}))
    return runs


def _complete(tx: Tx, task: Row, now: float, **fields: Any) -> None:
    _set_task_status(tx, task, TaskStatus.COMPLETED, now, finished_at=now, **fields)
    # The wake-up: decrement every dependent's counter under its row lock, then the ones
    # that reached zero (and are still waiting) become ready.
    tx.execute(
        "UPDATE tasks SET remaining_blockers = remaining_blockers - 1, updated_at = ? "
        "WHERE id IN (SELECT task_id FROM task_dependencies WHERE blocked_by = ?)",
        (now, task["id"]),
    )
    tx.execute(
        "UPDATE tasks SET status = 'ready', available_at = ?, updated_at = ? "  # blocked→ready
        "WHERE id IN (SELECT task_id FROM task_dependencies WHERE blocked_by = ?) "
        "AND status = 'blocked' AND remaining_blockers = 0",
        (now, now, task["id"]),
    )


def _fail_attempt(tx: Tx, task: Row, project: Row, error: str, now: float) -> None:
    over_budget = task["budget_usd"] is not None and task["cost_usd"] >= task["budget_usd"]
    if task["attempts"] < task["max_attempts"] and not over_budget:
        delay = min(project["retry_backoff_s"] * 2 ** (task["attempts"] - 1), MAX_RETRY_BACKOFF_S)
        _set_task_status(
            tx, task, TaskStatus.READY, now, last_error=error, available_at=now + delay, run_id=None
        )
        return
    if over_budget:
        error = f"task budget ${task['budget_usd']:.2f} reached: {error}"
    _set_task_status(tx, task, TaskStatus.FAILED, now, last_error=error, finished_at=now)
    _block_dependents(tx, task["id"], now)


def _block_dependents(tx: Tx, task_id: str, now: float) -> None:
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
            _set_task_status(tx, row, TaskStatus.BLOCKED_BY_FAILURE, now)
        frontier = [r["id"] for r in rows]


def _restore_dependents(tx: Tx, task_id: str, now: float) -> None:
    """After a retry: dependents blocked by failure wait again unless another blocker of
    theirs is still failed."""
    frontier = [task_id]
    while frontier:
        rows = tx.execute(
            "SELECT DISTINCT t.* FROM tasks t JOIN task_dependencies d ON d.task_id = t.id "
            f"WHERE d.blocked_by IN ({', '.join('?' for _ in frontier)}) "
            "AND t.status = 'blocked_by_failure'",
            frontier,
        )
        restored = []
        for row in rows:
            target = _status_from_blockers(tx, row["id"], row["remaining_blockers"])
            if target is not TaskStatus.BLOCKED_BY_FAILURE:
                _set_task_status(tx, row, target, now, available_at=now)
                restored.append(row["id"])
        frontier = restored


def _status_from_blockers(tx: Tx, task_id: str, remaining: int) -> TaskStatus:
    failed = tx.one(
        "SELECT COUNT(*) AS n FROM task_dependencies d JOIN tasks b ON b.id = d.blocked_by "
        f"WHERE d.task_id = ? AND b.status IN ({', '.join('?' for _ in FAILURE_STATES)})",
        (task_id, *FAILURE_STATES),
    )
    if failed and failed["n"]:
        return TaskStatus.BLOCKED_BY_FAILURE
    return TaskStatus.READY if remaining == 0 else TaskStatus.BLOCKED


def _settle_initial_status(tx: Tx, task_id: str, now: float) -> None:
    pending = tx.one(
        "SELECT COUNT(*) AS n FROM task_dependencies d JOIN tasks b ON b.id = d.blocked_by "
        "WHERE d.task_id = ? AND b.status <> 'completed'",
        (task_id,),
    )
    remaining = int(pending["n"]) if pending else 0
    status = _status_from_blockers(tx, task_id, remaining)
    tx.execute(
        "UPDATE tasks SET remaining_blockers = ?, status = ? WHERE id = ?",
        (remaining, str(status), task_id),
    )


def _insert_task(
    tx: Tx, project_id: str, task_id: str, spec: TaskSpec, agent: AgentSpec | None, now: float
) -> None:
    tx.execute(
        "INSERT INTO tasks (id, project_id, key, seq, title, prompt, priority, labels, agent, "
        "max_attempts, budget_usd, status, available_at, created_at, updated_at) "
        "VALUES (?, ?, ?, (SELECT COUNT(*) FROM tasks WHERE project_id = ?), "
        "?, ?, ?, ?, ?, ?, ?, 'blocked', ?, ?, ?)",
        (
            task_id,
            project_id,
            spec.key,
            project_id,
            spec.title,
            spec.prompt,
            spec.priority,
            dumps(sorted(spec.labels)),
            dumps(agent.to_dict()) if agent else None,
            spec.max_attempts,
            spec.budget_usd,
            now,
            now,
            now,
        ),
    )


def _refresh_task(
    tx: Tx,
    row: Row,
    spec: TaskSpec,
    stored_after: Sequence[str],
    agents: dict[str, AgentSpec],
    now: float,
    result: ImportResult,
) -> None:
    if sorted(set(spec.after)) != sorted(stored_after):
        raise InvalidRequest(
            f"task {spec.key} already exists with dependencies {sorted(stored_after)}; "
            f"they cannot change to {sorted(set(spec.after))}",
            code="dependencies_changed",
        )
    agent = agents.get(spec.key)
    wanted = {
        "title": spec.title,
        "prompt": spec.prompt,
        "priority": spec.priority,
        "labels": dumps(sorted(spec.labels)),
        "agent": dumps(agent.to_dict()) if agent else None,
        "max_attempts": spec.max_attempts,
        "budget_usd": spec.budget_usd,
    }
    if all(row[k] == v for k, v in wanted.items()):
        result.unchanged.append(spec.key)
        return
    if TaskStatus(row["status"]) not in (TaskStatus.BLOCKED, TaskStatus.READY):
        raise InvalidRequest(f"task {spec.key} is {row['status']}; it can no longer change")
    _update(tx, "tasks", row["id"], now, **wanted)
    result.updated.append(spec.key)


def _set_task_status(tx: Tx, row: Row, new: TaskStatus, now: float, **fields: Any) -> None:
    old = TaskStatus(row["status"])
    check_task_transition(row["key"], old, new)
    values = {**fields, "status": str(new), "updated_at": now}
    assignments = ", ".join(f"{name} = ?" for name in values)
    tx.execute(f"UPDATE tasks SET {assignments} WHERE id = ?", (*values.values(), row["id"]))


def _update(tx: Tx, table: str, row_id: str, now: float, **fields: Any) -> None:
    if not fields:
        return
    values = {**fields, "updated_at": now}
    assignments = ", ".join(f"{name} = ?" for name in values)
    tx.execute(f"UPDATE {table} SET {assignments} WHERE id = ?", (*values.values(), row_id))


def _dependency_keys(tx: Tx, project_id: str) -> dict[str, tuple[str, ...]]:
    rows = tx.execute(
        "SELECT t.key AS task, b.key AS blocker FROM task_dependencies d "
        "JOIN tasks t ON t.id = d.task_id JOIN tasks b ON b.id = d.blocked_by "
        "WHERE t.project_id = ? ORDER BY b.key",
        (project_id,),
    )
    deps: dict[str, list[str]] = {}
    for r in rows:
        deps.setdefault(r["task"], []).append(r["blocker"])
    return {k: tuple(v) for k, v in deps.items()}


def _task_by_key(tx: Tx, project_id: str, key: str, lock: str = "") -> Row:
    row = tx.one(f"SELECT * FROM tasks WHERE project_id = ? AND key = ? {lock}", (project_id, key))
    if row is None:
        raise NotFound.of("task", key)
    return row


def project_from_row(row: Row) -> Project:
    return Project(
        id=row["id"],
        repo_path=row["repo_path"],
        target_branch=row["target_branch"],
        merge_strategy=row["merge_strategy"],
        on_no_changes=row["on_no_changes"],
        setup_command=tuple(json.loads(row["setup_command"])) if row["setup_command"] else None,
        workers=row["workers"],
        paused=bool(row["paused"]),
        pause_reason=row["pause_reason"],
        budget_usd=row["budget_usd"],
        cost_usd=row["cost_usd"],
        retry_backoff_s=row["retry_backoff_s"],
        resolve_conflicts=bool(row["resolve_conflicts"]),
        plan_digest=row["plan_digest"],
    )


# A task with the state of its run and of that run's runner, which tell an interrupted task.
_TASK_WITH_RUN = (
    "SELECT t.*, r.status AS run_status, rn.state AS runner_state FROM tasks t "
    "LEFT JOIN runs r ON r.id = t.run_id LEFT JOIN runners rn ON rn.id = r.runner_id"
)


def _interrupted(row: Row) -> bool:
    status = TaskStatus(row["status"])
    if not status.is_active:
        return False
    # A claimed task's run waits for a runner as a matter of course; a started one's run
    # only after its runner was lost.
    requeued = status is not TaskStatus.CLAIMED and row.get("run_status") in ("pending", "lost")
    return requeued or row.get("runner_state") in ("lost", "stopped")


def task_from_row(row: Row, blocked_by: Sequence[str]) -> Task:
    agent = json.loads(row["agent"]) if row["agent"] else None
    return Task(
        id=row["id"],
        project_id=row["project_id"],
        key=row["key"],
        title=row["title"],
        prompt=row["prompt"],
        priority=row["priority"],
        labels=tuple(json.loads(row["labels"])),
        agent_name=agent["name"] if agent else None,
        max_attempts=row["max_attempts"],
        attempts=row["attempts"],
        budget_usd=row["budget_usd"],
        cost_usd=row["cost_usd"],
        status=TaskStatus(row["status"]),
        remaining_blockers=row["remaining_blockers"],
        blocked_by=tuple(blocked_by),
        run_id=row["run_id"],
        steps=json.loads(row["steps"]),
        conflict=row["conflict"],
        last_error=row["last_error"],
        session_id=row["session_id"],
        commit_sha=row["commit_sha"],
        merge_sha=row["merge_sha"],
        worktree_kept=row["worktree_kept"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        interrupted=_interrupted(row),
    )
