"""Wire shapes of the REST API (pydantic models), parsed once at the edge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from corral import runners
from corral.actors.wire import ActorAlarmEvent, ActorIntentEvent, ActorStateEvent
from corral.errors import InvalidRequest, MalformedJson
from corral.protocol.limits import MAX_LOG_LINES
from corral.runners import Runner
from corral.runs import Run, RunReport, RunStatus
from corral.sessions import Session
from corral.store import LogEntry
from corral.wire import Int32, WireModel


class ErrorDetail(BaseModel):
    code: str = Field(description="stable: clients branch on it (see corral.errors)")
    message: str
    details: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


_ERROR_MEANINGS = {
    400: "malformed JSON (malformed_json)",
    404: "an unknown id or route (<kind>_not_found, route_not_found)",
    409: "a state that refuses the request (conflict, illegal_transition, lease_lost, …)",
    410: "what was asked for was deleted by retention (events_expired)",
    413: "a body or prompt over its limit (payload_too_large)",
    422: "a request that is not valid (invalid_request, unknown_agent, invalid_branch, …)",
    503: "the database is unavailable (unavailable)",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for error answers, all with the ``ErrorBody`` shape."""
    return {s: {"model": ErrorBody, "description": _ERROR_MEANINGS[s]} for s in statuses}


def refusal(errors: Sequence[Mapping[str, Any]]) -> InvalidRequest:
    """What a request is told when its body or parameters failed validation (pydantic's
    ``errors()``): ``malformed_json`` (400) if the body is not JSON, else
    ``invalid_request`` (422) naming each problem by where it is."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return MalformedJson("request body is not valid JSON")
    problems = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        what = str(e.get("msg", "")).removeprefix("Value error, ")
        problems.append(f"{where}: {what}" if where else what)
    return InvalidRequest("; ".join(problems))


def one_line(value: str | list[str] | None) -> str | list[str] | None:
    """A runner's name, labels and the like: one line of printable text each."""
    for text in [value] if isinstance(value, str) else value or []:
        if runners.text_problem(text, len(text)):
            raise ValueError("must be one line of printable text")
    return value


class CreateRun(WireModel):
    # Task runs are created by the task graph, never by a client: not offered here.
    type: Literal["start_session", "resume_session", "command"]
    session_name: str | None = Field(None, max_length=200)
    session_id: str | None = Field(None, max_length=200, description="session to resume")
    agent_name: str | None = Field(None, max_length=200)
    prompt: str | None = None
    project_dir: str | None = Field(None, max_length=4096)
    command: list[str] | None = Field(None, description="argv of a command run")
    labels: list[str] = Field(default_factory=list, max_length=64)
    timeout_s: float | None = Field(None, gt=0)
    idle_timeout_s: float | None = Field(None, gt=0)
    max_attempts: int = Field(3, ge=1, le=100)
    priority: int = Field(0, ge=-1000, le=1000)
    env: dict[str, str] = Field(default_factory=dict)
    # A sub-agent session: its parent (id or name) and how the parent hears of its end.
    parent_session: str | None = Field(None, max_length=200)
    callback: Literal["sync", "async_poll", "async_callback"] | None = None


class CreateRuns(WireModel):
    runs: list[CreateRun] = Field(min_length=1, max_length=1000)


class Held(WireModel):
    run_id: str
    attempt: Int32


class RegisterRunner(WireModel):
    """The limits of ``corral.runners``, as a WebSocket Init has them (``init_problem``)."""

    name: str = Field(min_length=1, max_length=runners.NAME_MAX_CHARS)
    hostname: str = Field("", max_length=runners.HOSTNAME_MAX_CHARS)
    labels: list[Annotated[str, Field(max_length=runners.LABEL_MAX_CHARS)]] = Field(
        default_factory=list, max_length=runners.MAX_LABELS
    )
    slots: int = Field(1, ge=1, le=runners.MAX_SLOTS)
    version: str = Field("", max_length=runners.VERSION_MAX_CHARS)
    transport: Literal["poll", "websocket"] = "poll"
    runner_id: str | None = Field(
        None, max_length=runners.RUNNER_ID_MAX_CHARS, description="the id this process had before"
    )
    # Absent: not reported (the runs are left as they are); ``[]``: holds nothing.
    held: list[Held] | None = None

    @field_validator("name", "hostname", "labels", "version", "runner_id")
    @classmethod
    def _one_line(cls, value: str | list[str] | None) -> str | list[str] | None:
        return one_line(value)


class RunnerHeartbeat(WireModel):
    runner_id: str
    # Absent (the seed's body): not reported, so nothing is reconciled. ``[]``: holds nothing.
    held: list[Held] | None = None


class RunnerRef(WireModel):
    runner_id: str


class LeaseRef(WireModel):
    runner_id: str
    # The seed's reports carry no attempt: then the lease the runner holds decides it.
    attempt: Int32 | None = None


class AgentTokenBody(WireModel):
    runner_id: str
    attempt: Int32


class SessionSeenBody(LeaseRef):
    session_id: str = Field(min_length=1, max_length=200)


class LogLineBody(WireModel):
    line_no: Int32 = Field(ge=0)
    stream: Literal["stdout", "stderr"]
    text: str
    ts: float


class LogsBody(LeaseRef):
    lines: list[LogLineBody] = Field(max_length=MAX_LOG_LINES)


class Outcome(WireModel):
    """How an attempt ended, as a runner reports it (per-run endpoint or batched event)."""

    exit_code: Int32 | None = None
    error: str | None = None
    result: str | None = None
    session_id: str | None = None
    cost_usd: float | None = None
    usage: dict[str, Any] | None = None
    num_turns: Int32 | None = None
    retry_after_s: float | None = Field(default=None, ge=0)
    task: dict[str, Any] | None = Field(default=None, description="a task run's outcome")

    def finished(self, run_id: str, attempt: int, status: RunStatus) -> FinishedEvent:
        """This outcome as the final report a runner sends as an event."""
        fields = {name: getattr(self, name) for name in Outcome.model_fields}
        body = {"type": "finished", "run_id": run_id, "attempt": attempt, "status": status.value}
        return FinishedEvent.model_validate({**body, **fields})

    def to_report(self, status: RunStatus) -> RunReport:
        return RunReport(
            status=status,
            exit_code=self.exit_code,
            error=self.error,
            result=self.result,
            session_id=self.session_id,
            cost_usd=self.cost_usd,
            usage=self.usage,
            num_turns=self.num_turns,
            retry_after_s=self.retry_after_s,
            task=self.task,
        )


# How an attempt may end, as a runner reports it ("pending": the attempt is given back).
FinalStatus = Literal["completed", "failed", "timed_out", "cancelled", "pending"]


class ReportBody(LeaseRef, Outcome):
    status: FinalStatus | None = None


# A report of an attempt held by an earlier identity of the runner that sends it: its lease
# ran out before the report was stored (``corral.protocol.runner``, late reports). Sent
# only to a coordinator whose Init says ``late_reports``; absent, the report is the sender's.
FormerRunnerId = Annotated[str | None, Field(min_length=1, max_length=200)]


class StartedEvent(WireModel):
    type: Literal["started"]
    run_id: str
    attempt: Int32
    former_runner_id: FormerRunnerId = None


class SessionEvent(WireModel):
    type: Literal["session"]
    run_id: str
    attempt: Int32
    former_runner_id: FormerRunnerId = None
    session_id: str = Field(min_length=1, max_length=200)


class LogsEvent(WireModel):
    type: Literal["logs"]
    run_id: str
    attempt: Int32
    former_runner_id: FormerRunnerId = None
    lines: list[LogLineBody] = Field(max_length=MAX_LOG_LINES)


class FinishedEvent(Outcome):
    type: Literal["finished"]
    run_id: str
    attempt: Int32
    former_runner_id: FormerRunnerId = None
    status: FinalStatus


class TaskStepEvent(WireModel):
    type: Literal["task_step"]
    run_id: str
    attempt: Int32
    former_runner_id: FormerRunnerId = None
    step: Literal["worktree", "agent", "committed", "merging", "cleanup"]
    data: dict[str, Any] = Field(default_factory=dict)


RunnerEvent = Annotated[
    StartedEvent
    | SessionEvent
    | LogsEvent
    | FinishedEvent
    | TaskStepEvent
    | ActorStateEvent
    | ActorIntentEvent
    | ActorAlarmEvent,
    Field(discriminator="type"),
]


class EventsBody(WireModel):
    """Several reports in one request, applied in order (what a busy runner sends)."""

    runner_id: str
    events: list[RunnerEvent] = Field(min_length=1, max_length=10000)


def iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None


def run_json(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "type": run.type,
        "status": run.status,
        "session_name": run.session_name,
        "session_id": run.session_id,
        "agent_name": run.agent_name,
        "prompt": run.prompt,
        "command": list(run.command),
        "project_dir": run.project_dir,
        "labels": list(run.labels),
        "priority": run.priority,
        "timeout_s": run.timeout_s,
        "idle_timeout_s": run.idle_timeout_s,
        "max_attempts": run.max_attempts,
        "attempts": run.attempts,
        "runner_id": run.runner_id,
        "exit_code": run.exit_code,
        "error": run.error,
        "result": run.result,
        "cost_usd": run.cost_usd,
        "usage": run.usage,
        "num_turns": run.num_turns,
        "cancel_requested": run.cancel_requested,
        "rate_limited": run.rate_limited,
        "task_id": run.task_id,
        "parent_session_id": run.parent_session_id,
        "callback": run.callback,
        "callback_state": run.callback_state,
        "callback_run_id": run.callback_run_id,
        "created_at": iso(run.created_at),
        "claimed_at": iso(run.claimed_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "lost_at": iso(run.lost_at),
    }


def run_assignment_json(run: Run) -> dict[str, Any]:
    """What a runner needs to execute a run: the whole spec, with its agent snapshot."""
    return {
        **run_json(run),
        "task": run.task,
        "agent": run.agent.to_dict() if run.agent else None,
        "env": run.env,
        "required_runner": run.required_runner,
    }


def start_run_json(run: Run) -> dict[str, Any]:
    """The run of a ``start_run`` command (the runner socket's): what a runner reads of it
    (``Assignment.from_json``), and when it was created and claimed (the coordinator's
    metrics read them as the command goes out). Not the whole run ``run_assignment_json``
    writes: a start_run is encoded twice (stored, then sent), and with the whole run it
    cost the coordinator 23 µs of CPU a run, 13 with this (half the bytes), 9 with its
    times as numbers."""
    return {
        "run_id": run.id,
        "type": run.type,
        "attempts": run.attempts,
        "prompt": run.prompt,
        "command": list(run.command),
        "session_name": run.session_name,
        "session_id": run.session_id,
        "agent": run.agent.to_dict() if run.agent else None,
        "project_dir": run.project_dir,
        "timeout_s": run.timeout_s,
        "idle_timeout_s": run.idle_timeout_s,
        "env": run.env,
        "task_id": run.task_id,
        "task": run.task,
        # Seconds since the epoch, not ISO 8601 as elsewhere: only the metrics read them.
        "created_at": run.created_at,
        "claimed_at": run.claimed_at,
    }


def runner_json(runner: Runner) -> dict[str, Any]:
    return {
        "runner_id": runner.id,
        "name": runner.name,
        "hostname": runner.hostname,
        "labels": list(runner.labels),
        "state": runner.state,
        "transport": runner.transport,
        "version": runner.version,
        "slots_total": runner.slots,
        "slots_used": runner.slots_used,
        "registered_at": iso(runner.registered_at),
        "last_heartbeat_at": iso(runner.last_heartbeat_at),
        "coordinator_url": runner.coordinator_url,
    }


def session_json(session: Session) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "session_name": session.name,
        "agent_name": session.agent_name,
        "runner_id": session.runner_id,
        "project_dir": session.project_dir,
        "last_run_id": session.last_run_id,
        "result": session.result,
        "is_error": session.is_error,
        "cost_usd": session.cost_usd,
        "runs": session.runs,
        "created_at": iso(session.created_at),
        "updated_at": iso(session.updated_at),
    }


def log_json(entry: LogEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "attempt": entry.attempt,
        "line_no": entry.line_no,
        "stream": entry.stream,
        "text": entry.text,
        "ts": entry.ts,
    }
