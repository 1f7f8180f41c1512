"""Tasks: what a task is, and the one table of the status transitions it may take.

    blocked ──(last blocker completed)──▶ ready ──claim──▶ claimed ──▶ in_progress ──▶ merging
    blocked | ready ──(a blocker failed)──▶ blocked_by_failure
    claimed | in_progress | merging ──(attempt done)──▶ completed | merge_conflict
                                    ──(attempt failed, attempts left)──▶ ready (after a backoff)
                                    ──(no attempts left)──▶ failed
    failed | merge_conflict | cancelled ──retry──▶ ready | blocked
    blocked_by_failure ──(its failed blockers retried)──▶ ready | blocked
    any but completed and cancelled ──cancel──▶ cancelled

A transition not in ``TRANSITIONS`` raises ``IllegalTransition`` and changes nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from corral.errors import IllegalTransition


class TaskStatus(enum.StrEnum):
    BLOCKED = "blocked"
    READY = "ready"
    CLAIMED = "claimed"
    IN_PROGRESS = "in_progress"
    MERGING = "merging"
    COMPLETED = "completed"
    FAILED = "failed"
    MERGE_CONFLICT = "merge_conflict"
    BLOCKED_BY_FAILURE = "blocked_by_failure"
    CANCELLED = "cancelled"

    @property
    def is_active(self) -> bool:
        """A worker is on it."""
        return self in (TaskStatus.CLAIMED, TaskStatus.IN_PROGRESS, TaskStatus.MERGING)

    @property
    def is_settled(self) -> bool:
        """Nothing more happens to it unless somebody retries it."""
        return self in SETTLED


SETTLED = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.MERGE_CONFLICT,
        TaskStatus.BLOCKED_BY_FAILURE,
        TaskStatus.CANCELLED,
    }
)

T = TaskStatus
TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    T.BLOCKED: frozenset({T.READY, T.BLOCKED_BY_FAILURE, T.CANCELLED}),
    T.READY: frozenset({T.CLAIMED, T.CANCELLED, T.BLOCKED_BY_FAILURE}),
    # Straight to an end from claimed: an attempt that finds its work already done (a
    # crash after the merge) may report before it records any step.
    T.CLAIMED: frozenset(
        {T.IN_PROGRESS, T.READY, T.FAILED, T.CANCELLED, T.COMPLETED, T.MERGE_CONFLICT}
    ),
    T.IN_PROGRESS: frozenset(
        {T.MERGING, T.COMPLETED, T.READY, T.FAILED, T.MERGE_CONFLICT, T.CANCELLED}
    ),
    T.MERGING: frozenset({T.COMPLETED, T.READY, T.FAILED, T.MERGE_CONFLICT, T.CANCELLED}),
    T.COMPLETED: frozenset(),
    T.FAILED: frozenset({T.READY, T.BLOCKED, T.CANCELLED}),
    T.MERGE_CONFLICT: frozenset({T.READY, T.BLOCKED, T.CANCELLED}),
    T.BLOCKED_BY_FAILURE: frozenset({T.BLOCKED, T.READY, T.CANCELLED}),
    T.CANCELLED: frozenset({T.READY, T.BLOCKED}),
}
del T


def check_task_transition(task: str, old: TaskStatus, new: TaskStatus) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(
            f"task {task} cannot go from {old} to {new}", task=task, status=str(old)
        )


@dataclass(frozen=True)
class TaskSpec:
    """A task as a plan or the CLI describes it; ``key`` is the id the user chose."""

    key: str
    title: str
    prompt: str
    after: tuple[str, ...] = ()  # keys of the tasks that must complete first
    priority: int = 0
    labels: tuple[str, ...] = ()
    agent: str | None = None
    max_attempts: int = 3
    budget_usd: float | None = None


@dataclass(frozen=True)
class Project:
    """A repository and the branch its plan merges into, with how a plan run behaves."""

    id: str
    repo_path: str
    target_branch: str
    merge_strategy: str  # "merge" (always a merge commit) or "ff" (fast-forward if possible)
    on_no_changes: str  # "fail" or "complete"
    setup_command: tuple[str, ...] | None
    workers: int  # 0: no plan run going on; else at most this many tasks at once
    paused: bool
    pause_reason: str | None
    budget_usd: float | None
    cost_usd: float
    retry_backoff_s: float
    plan_digest: str | None
    resolve_conflicts: bool = False

    @property
    def budget_reached(self) -> bool:
        """No new claims: the plan has cost its budget (a higher budget lifts this)."""
        return self.budget_usd is not None and self.cost_usd >= self.budget_usd


@dataclass(frozen=True)
class Task:
    id: str
    project_id: str
    key: str
    title: str
    prompt: str
    priority: int
    labels: tuple[str, ...]
    agent_name: str | None
    max_attempts: int
    attempts: int
    budget_usd: float | None
    cost_usd: float
    status: TaskStatus
    remaining_blockers: int
    blocked_by: tuple[str, ...]  # keys
    run_id: str | None
    steps: dict[str, object]
    conflict: str | None
    last_error: str | None
    session_id: str | None
    commit_sha: str | None
    merge_sha: str | None
    worktree_kept: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    # Active, but the runner working on it is gone (its run went back to pending, or its
    # runner was lost or stopped): the next runner, or ``tasks run``, picks it up again.
    interrupted: bool = False
