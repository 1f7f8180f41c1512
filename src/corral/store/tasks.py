"""Task graphs in the store: add tasks to a project, read them, and control a plan run.

What run operations do to tasks (claim ready ones into runs, settle an attempt) is in
``task_runs.py``; projects are in ``projects.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import corral.store.task_runs as task_runs
from corral.errors import Conflict, InvalidRequest, NotFound
from corral.ids import new_task_id
from corral.runs import AgentSpec, Run
from corral.store.db import Database, Row, Tx
from corral.store.projects import project_from_row
from corral.store.rows import dumps, row_by_id, update_row
from corral.tasks.model import Project, Task, TaskSpec, TaskStatus
from corral.tasks.plan import check_graph


@dataclass(frozen=True)
class ImportResult:
    created: list[str]
    updated: list[str]
    unchanged: list[str]


class TaskStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ---- adding tasks --------------------------------------------------------------------

    def add(
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
                ids[spec.key] = new_task_id()
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
                update_row(tx, "projects", project_id, now, plan_digest=digest)
        return result

    # ---- reading -------------------------------------------------------------------------

    def get(self, project_id: str, key: str) -> Task:
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                f"{_TASK_WITH_RUN} WHERE t.project_id = ? AND t.key = ?", (project_id, key)
            )
            if row is None:
                raise NotFound.of("task", key)
            deps = _dependency_keys(tx, project_id)
        return task_from_row(row, deps.get(key, ()))

    # ---- control -------------------------------------------------------------------------

    def start(self, project_id: str, workers: int, now: float) -> list[Run]:
        """Let the scheduler keep up to ``workers`` tasks going; claims what it can now."""
        if workers < 1:
            raise InvalidRequest("a plan run needs at least one worker")
        with self.db.transaction() as tx:
            project = row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            update_row(tx, "projects", project_id, now, workers=workers)
            return task_runs.schedule(tx, {**project, "workers": workers}, now)

    def stop(self, project_id: str, now: float) -> Project:
        """No more claims (running tasks go on)."""
        with self.db.transaction() as tx:
            row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            update_row(tx, "projects", project_id, now, workers=0)
            return project_from_row(row_by_id(tx, "projects", project_id))

    def set_paused(
        self, project_id: str, paused: bool, now: float, reason: str | None = None
    ) -> list[Run]:
        with self.db.transaction() as tx:
            project = row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            update_row(
                tx,
                "projects",
                project_id,
                now,
                paused=int(paused),
                pause_reason=reason if paused else None,
            )
            if paused:
                return []
            return task_runs.schedule(tx, {**project, "paused": 0}, now)

    def schedule(self, project_id: str, now: float) -> list[Run]:
        with self.db.transaction() as tx:
            project = row_by_id(tx, "projects", project_id, lock=self.db.lock_rows())
            return task_runs.schedule(tx, project, now)

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
            target = task_runs.status_from_blockers(tx, row["id"], row["remaining_blockers"])
            task_runs.set_task_status(
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
            runs = task_runs.schedule(tx, project, now)
            deps = _dependency_keys(tx, project_id)
            return task_from_row(row_by_id(tx, "tasks", row["id"]), deps.get(key, ())), runs

    def cancel(self, project_id: str, key: str, now: float) -> Task:
        """Cancel a task that has not finished; its dependents become blocked_by_failure.
        A cancelled task's cancel (sent again) changes nothing. The caller cancels its run,
        if it has one going."""
        with self.db.transaction() as tx:
            row = _task_by_key(tx, project_id, key, lock=self.db.lock_rows())
            if row["status"] != TaskStatus.CANCELLED:
                task_runs.set_task_status(
                    tx, row, TaskStatus.CANCELLED, now, finished_at=now, last_error="cancelled"
                )
                task_runs.block_dependents(tx, row["id"], now)
            deps = _dependency_keys(tx, project_id)
            return task_from_row(row_by_id(tx, "tasks", row["id"]), deps.get(key, ()))

    def list(self, project_id: str) -> list[Task]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                f"{_TASK_WITH_RUN} WHERE t.project_id = ? ORDER BY t.seq", (project_id,)
            )
            deps = _dependency_keys(tx, project_id)
        return [task_from_row(r, deps.get(r["key"], ())) for r in rows]


def task_context(tx: Tx, task_id: str) -> dict[str, Any]:
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


# ---- helpers ---------------------------------------------------------------------------------


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
            target = task_runs.status_from_blockers(tx, row["id"], row["remaining_blockers"])
            if target is not TaskStatus.BLOCKED_BY_FAILURE:
                task_runs.set_task_status(tx, row, target, now, available_at=now)
                restored.append(row["id"])
        frontier = restored


def _settle_initial_status(tx: Tx, task_id: str, now: float) -> None:
    pending = tx.one(
        "SELECT COUNT(*) AS n FROM task_dependencies d JOIN tasks b ON b.id = d.blocked_by "
        "WHERE d.task_id = ? AND b.status <> 'completed'",
        (task_id,),
    )
    remaining = int(pending["n"]) if pending else 0
    status = task_runs.status_from_blockers(tx, task_id, remaining)
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
    wanted: dict[str, Any] = {
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
    update_row(tx, "tasks", row["id"], now, **wanted)
    result.updated.append(spec.key)


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
