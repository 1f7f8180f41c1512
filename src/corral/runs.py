"""Runs: what a run is, and the one table of the status transitions it may take.

    pending ──claim──▶ claimed ──start──▶ running ──▶ completed | failed | timed_out | cancelled
       ▲                  │                  │
       │                  ├──────────────────┴──▶ lost ──(attempts left)──▶ pending
       │                  │                        │
       │                  │                        └─(none left: waits a grace)─▶ failed
       │                  │                          (its runner stopped: at once)
       └──── requeue (rate limit: the attempt is given back) ◀── running
    pending | claimed ──▶ cancelled          claimed ──▶ failed (could not spawn)
    pending | lost ──late report──▶ completed | failed | timed_out | cancelled   (LATE_REPORT)
    lost ──cancel──▶ cancelled

A transition not in ``TRANSITIONS`` raises ``IllegalTransition`` and changes nothing.
``LATE_REPORT`` holds the one kind of move only a late final report may take: the attempt
was done when its runner's lease ran out, and the run waits for that report — back at
pending for the same attempt while attempts remain (nobody has claimed it since), or lost
for a grace when none remain (``corral.store.claims.reports_late``; the reconciler fails it
once the grace is over: ``corral.store.reconcile``). Everything else still finds
pending → completed and lost → completed illegal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from corral.errors import IllegalTransition
from corral.ids import RunId, RunnerId


class RunType(enum.StrEnum):
    START_SESSION = "start_session"
    RESUME_SESSION = "resume_session"
    COMMAND = "command"
    TASK = "task"  # one attempt of a task of a plan: worktree, agent, commit, merge


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def holds_lease(self) -> bool:
        """A runner holds the run: it was claimed and has not finished."""
        return self in (RunStatus.CLAIMED, RunStatus.RUNNING)


S = RunStatus
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.PENDING: frozenset({S.CLAIMED, S.CANCELLED, S.FAILED}),
    S.CLAIMED: frozenset({S.RUNNING, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.LOST, S.PENDING}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.LOST, S.PENDING}),
    S.LOST: frozenset({S.PENDING, S.FAILED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}
del S

# The statuses a run never leaves: the one set of them (the store, its retention, the CLI).
TERMINAL = frozenset(status for status, targets in TRANSITIONS.items() if not targets)

# A late final report: the runner finished the attempt, but its lease ran out before the
# report was stored, and the run waits for that same attempt: back at pending (attempts
# remain), or lost (none remain). While nobody has claimed it since, and while a lost one's
# grace lasts, the report still ends it (instead of running finished work again, or
# recording done work as failed).
LATE_REPORT: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.PENDING: TERMINAL,
    RunStatus.LOST: TERMINAL,
}


def check_transition(run_id: str, old: RunStatus, new: RunStatus, *, late: bool = False) -> None:
    """Refuse a move not in ``TRANSITIONS`` (nor in ``LATE_REPORT``, for a late report)."""
    if late and new in LATE_REPORT.get(old, frozenset()):
        return
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(
            f"run {run_id} cannot go from {old} to {new}", run_id=run_id, status=str(old)
        )


def may_become(new: RunStatus) -> frozenset[RunStatus]:
    """The statuses ``TRANSITIONS`` lets a run leave for ``new``: the guard of a statement
    that moves runs in bulk (a claim, a start) without reading them first."""
    return frozenset(old for old, targets in TRANSITIONS.items() if new in targets)


# ---- the decisions the transitions above are taken by ------------------------------------

# A rate-limited run gives its attempt back this many times, then fails.
MAX_RATE_LIMIT_REQUEUES = 20


def attempts_counted(attempts: int, rate_limited: int) -> int:
    """The attempts that count against ``max_attempts``: those given back after a rate
    limit do not."""
    return attempts - rate_limited


def status_reported(reported: RunStatus, cancel_requested: bool) -> RunStatus:
    """How a runner's final report ends the run: a failure after a cancel was asked is how
    the cancel showed (the runner stopped it), so the run is cancelled."""
    if cancel_requested and reported is RunStatus.FAILED:
        return RunStatus.CANCELLED
    return reported


def after_rate_limit(rate_limited: int, *, cancel_requested: bool = False) -> RunStatus:
    """A runner gave the attempt back, rate limited, after ``rate_limited`` earlier times:
    cancelled if a cancel was asked (the cancel wins: requeued, the run would be claimed
    again and the claim starts a new attempt with no cancel asked), else the run waits
    again, or fails once it has been given back too often."""
    if cancel_requested:
        return RunStatus.CANCELLED
    return RunStatus.FAILED if rate_limited >= MAX_RATE_LIMIT_REQUEUES else RunStatus.PENDING


def after_lost(
    *,
    cancel_requested: bool,
    attempts: int,
    rate_limited: int,
    max_attempts: int,
    report_may_come: bool = True,
) -> RunStatus:
    """Where a lost run goes (its runner is gone or no longer reports it): cancelled if a
    cancel was asked, pending while attempts remain, else nowhere yet: it stays lost, for
    its runner's late report of the last attempt, until the reconciler fails it
    (``lost_for_good``) — or failed at once when no report may come (``report_may_come``
    false: the runner was stopped, not lost)."""
    if cancel_requested:
        return RunStatus.CANCELLED
    if attempts_counted(attempts, rate_limited) < max_attempts:
        return RunStatus.PENDING
    return RunStatus.LOST if report_may_come else RunStatus.FAILED


def lost_for_good(reason: str, *, attempts: int, rate_limited: int, max_attempts: int) -> str:
    """The error of a run that failed lost (no late report came in its grace): why it was
    lost, and that no attempt was left."""
    counted = attempts_counted(attempts, rate_limited)
    return f"{reason}; no attempts left ({counted}/{max_attempts})"


@dataclass(frozen=True)
class AgentSpec:
    """The agent profile as it was when the run was created (a snapshot, not a reference)."""

    name: str
    executor: str
    model: str | None = None
    allowed_tools: tuple[str, ...] = ()
    system_prompt: str | None = None
    max_turns: int | None = None
    budget_usd: float | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # set in the agent's process

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "executor": self.executor,
            "model": self.model,
            "allowed_tools": list(self.allowed_tools),
            "system_prompt": self.system_prompt,
            "max_turns": self.max_turns,
            "budget_usd": self.budget_usd,
            "extra_args": list(self.extra_args),
            "env": dict(self.env),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentSpec:
        return cls(
            name=data["name"],
            executor=data["executor"],
            model=data.get("model"),
            allowed_tools=tuple(data.get("allowed_tools") or ()),
            system_prompt=data.get("system_prompt"),
            max_turns=data.get("max_turns"),
            budget_usd=data.get("budget_usd"),
            extra_args=tuple(data.get("extra_args") or ()),
            env=dict(data.get("env") or {}),
        )


@dataclass(frozen=True)
class NewRun:
    """A validated request to create a run."""

    type: RunType
    prompt: str | None = None
    command: tuple[str, ...] = ()
    session_name: str | None = None
    session_id: str | None = None
    agent: AgentSpec | None = None
    project_dir: str | None = None
    labels: tuple[str, ...] = ()
    timeout_s: float | None = None
    idle_timeout_s: float | None = None
    max_attempts: int = 3
    priority: int = 0
    # Resumes must run where the session lives: on the runner with this name.
    required_runner: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    task_id: str | None = None
    # A sub-agent's parent (a session id or name, resolved by the store) and how the
    # parent hears of its end (``corral.subagents.Mode``).
    parent_session: str | None = None
    callback: str | None = None


@dataclass(frozen=True)
class Run:
    id: RunId
    type: RunType
    status: RunStatus
    prompt: str | None
    command: tuple[str, ...]
    session_name: str | None
    session_id: str | None
    agent: AgentSpec | None
    project_dir: str | None
    labels: tuple[str, ...]
    timeout_s: float | None
    idle_timeout_s: float | None
    max_attempts: int
    # Every claim counts (the attempt number is the lease's identity); the rate-limited
    # ones are given back: ``attempts - rate_limited`` is what counts against the maximum.
    attempts: int
    priority: int
    required_runner: str | None
    runner_id: RunnerId | None
    env: dict[str, str]
    exit_code: int | None
    error: str | None
    result: str | None
    cost_usd: float | None
    usage: dict[str, Any] | None
    num_turns: int | None
    cancel_requested: bool
    rate_limited: int
    available_at: float
    created_at: float
    claimed_at: float | None
    started_at: float | None
    finished_at: float | None
    task_id: str | None = None
    # For a task run handed to a runner: the task, its project and the steps already done.
    task: dict[str, Any] | None = None
    parent_session_id: str | None = None
    callback: str | None = None
    depth: int = 0
    # An async_callback child that ended: pending, delivered (by the parent's resume
    # ``callback_run_id``) or why it was dropped (parent_gone, budget_exceeded).
    callback_state: str | None = None
    callback_run_id: str | None = None
    # When its runner was last lost with it (the grace of a run waiting lost counts from it).
    lost_at: float | None = None

    @property
    def agent_name(self) -> str | None:
        return self.agent.name if self.agent else None


@dataclass(frozen=True)
class Ended:
    """A plain run (no task, no session, no parent to call back) its runner's final report
    ended, as ``RunStore.finish_many`` tells of it: what the wake-ups read (``link_core
    .wakeups``). Its whole row read back and made a ``Run`` cost more than its update."""

    id: RunId
    status: RunStatus
    task_id: None = None
    session_id: None = None
    callback: None = None


@dataclass(frozen=True)
class RunReport:
    """How an attempt ended, as the runner tells it."""

    status: RunStatus
    exit_code: int | None = None
    error: str | None = None
    result: str | None = None
    session_id: str | None = None
    cost_usd: float | None = None
    usage: dict[str, Any] | None = None
    num_turns: int | None = None
    retry_after_s: float | None = None  # set with status PENDING: give the attempt back
    # A task run says how its attempt ended for the task: merged, no_changes,
    # merge_conflict … with the commit and merge shas (made in runner/task_attempt.py, read by
    # settle_task_run in store/task_runs.py).
    task: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # A runner ends an attempt in a terminal status, or gives it back (``pending``: rate
        # limits, a draining runner) to run again after ``retry_after_s``.
        if not self.status.is_terminal and self.status is not RunStatus.PENDING:
            raise ValueError(f"a runner cannot report status {self.status}")
