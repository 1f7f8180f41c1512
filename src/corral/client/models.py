"""What the coordinator answers, as typed models: runs, sessions, runners, plans, tokens.

Each model names the fields of the API's JSON answer (``GET /docs`` shows them all); a
field the coordinator adds in a later version is kept (``extra="allow"``), so an older
client reads a newer coordinator. Times are timezone-aware ``datetime`` values in UTC.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.actors.lifecycle import ActorState, CrashPolicy
from corral.runs import RunStatus
from corral.tasks.model import TaskStatus
from corral.tokens import Role

RunType = Literal["start_session", "resume_session", "command", "task"]


class Model(BaseModel):
    """An answer of the coordinator: read-only, unknown fields kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object the coordinator sent: times as its ISO 8601 strings
        (``…+00:00``, where pydantic would write ``Z``)."""
        plain: dict[str, Any] = _as_sent(self.model_dump())
        return plain


def _as_sent(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _as_sent(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_sent(item) for item in value]
    return value


class RunCreated(Model):
    run_id: str
    status: RunStatus


class Run(Model):
    """A run: what to execute (an agent session or a command), where, and how it ended."""

    run_id: str
    type: RunType
    status: RunStatus
    session_name: str | None = None
    session_id: str | None = None
    agent_name: str | None = None
    prompt: str | None = None
    command: list[str] = Field(default_factory=list)
    project_dir: str | None = None
    labels: list[str] = Field(default_factory=list)
    priority: int = 0
    timeout_s: float | None = None
    idle_timeout_s: float | None = None
    max_attempts: int = 1
    attempts: int = 0
    runner_id: str | None = None
    exit_code: int | None = None
    error: str | None = None
    result: str | None = None
    cost_usd: float | None = None
    usage: dict[str, Any] | None = None
    num_turns: int | None = None
    cancel_requested: bool = False
    rate_limited: bool = False
    task_id: str | None = None
    parent_session_id: str | None = None
    callback: str | None = None
    callback_state: str | None = None
    callback_run_id: str | None = None
    created_at: datetime | None = None
    claimed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lost_at: datetime | None = None
    # A run waiting lost (``GET /runs/{id}`` alone): when it fails unless its runner's
    # late report of the attempt comes first.
    lost_until: datetime | None = None

    @property
    def finished(self) -> bool:
        """Whether the run has ended (completed, failed, cancelled or timed out)."""
        return self.status.is_terminal


class RunPage(Model):
    """One page of ``list_runs``, newest first; ``next`` is the ``before`` of the next page."""

    runs: list[Run]
    next: str | None = None


class LogLine(Model):
    id: int
    attempt: int
    line_no: int
    stream: Literal["stdout", "stderr"]
    text: str
    ts: float


class LogPage(Model):
    lines: list[LogLine]
    next_after: int


class Session(Model):
    """An agent session: its runs, the runner and directory that hold it, latest result."""

    session_id: str
    session_name: str | None = None
    agent_name: str | None = None
    runner_id: str | None = None
    project_dir: str | None = None
    last_run_id: str | None = None
    result: str | None = None
    is_error: bool = False
    cost_usd: float | None = None
    runs: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None


class SessionResult(Model):
    session_id: str
    result: str | None = None
    is_error: bool = False
    cost_usd: float | None = None
    last_run_id: str | None = None


class Runner(Model):
    runner_id: str
    name: str
    hostname: str = ""
    labels: list[str] = Field(default_factory=list)
    state: str
    transport: str = ""
    version: str = ""
    slots_total: int = 1
    slots_used: int = 0
    registered_at: datetime | None = None
    last_heartbeat_at: datetime | None = None


class Agent(Model):
    """An agent profile the coordinator has loaded (only the names of its env variables)."""

    name: str
    executor: str
    model: str | None = None
    allowed_tools: list[str] = Field(default_factory=list)
    max_turns: int | None = None
    budget_usd: float | None = None
    env: list[str] = Field(default_factory=list)


class AgentProfiles(Model):
    config: str = Field(description="the corral.toml they came from ('' for built-ins only)")
    agents: list[Agent]


class Stats(Model):
    runs: dict[str, int]
    runners: dict[str, int]
    version: str
    schema_version: int | None = None


class Project(Model):
    """A task graph: a repository and the branch its tasks are merged into."""

    project_id: str
    repo_path: str
    target_branch: str
    merge: str | None = None
    on_no_changes: str | None = None
    setup_command: list[str] | None = None
    workers: int | None = None
    paused: bool = False
    pause_reason: str | None = None
    budget_usd: float | None = None
    budget_reached: bool = False
    cost_usd: float | None = None
    plan_digest: str | None = None
    resolve_conflicts: bool | None = None
    counts: dict[str, int] | None = Field(None, description="tasks per status")


class Task(Model):
    id: str = Field(description="the task's key in its plan")
    task_id: str
    title: str
    prompt: str | None = None
    status: TaskStatus
    after: list[str] = Field(default_factory=list)
    priority: int = 0
    labels: list[str] = Field(default_factory=list)
    agent: str | None = None
    attempts: int = 0
    max_attempts: int = 1
    cost_usd: float | None = None
    budget_usd: float | None = None
    run_id: str | None = None
    steps: dict[str, Any] | None = None
    last_error: str | None = None
    conflict: Any = None
    session_id: str | None = None
    commit: str | None = None
    merge_commit: str | None = None
    worktree_kept: str | None = None  # the path of a worktree kept dirty, for the user
    interrupted: bool | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class PlanStatus(Model):
    """A project with its task counts, and every task."""

    project: Project
    tasks: list[Task]


class TasksAdded(Model):
    """The ids of the tasks an import created, changed, and found as they were."""

    created: list[str]
    updated: list[str]
    unchanged: list[str]


class NewTask(BaseModel):
    """A task to add to a plan (what a plan file's task says)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    prompt: str | None = None
    after: list[str] = Field(default_factory=list)
    priority: int = 0
    labels: list[str] = Field(default_factory=list)
    agent: str | None = None
    max_attempts: int = 3
    budget_usd: float | None = None


class Actor(Model):
    """A long-lived process of a runner, one per name and key, asleep when idle."""

    actor_id: str
    name: str
    key: str | None = None
    pool: str
    state: ActorState
    generation: int = 0
    runner_id: str | None = None
    connectable: bool = False
    crash_policy: CrashPolicy
    will_wake: bool = False
    alarm_at: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    sleep_at: datetime | None = None
    destroyed_at: datetime | None = None


class ActorPage(Model):
    """One page of ``list_actors``, newest first; ``next`` is the ``before`` of the next."""

    actors: list[Actor]
    next: str | None = None


class Token(Model):
    token_id: str
    name: str
    role: Role
    labels: list[str] | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None


class CreatedToken(Token):
    token: str = Field(description="the secret: in this answer only")
