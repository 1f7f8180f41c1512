"""What each client method sends and how its answer is read, without I/O.

``Client`` and ``AsyncClient`` share these: each of their methods builds a ``Call`` here
and sends it with its own HTTP client, so the two cannot drift apart.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from corral import errors
from corral.client.models import (
    Actor,
    ActorPage,
    AgentProfiles,
    CreatedToken,
    LogLine,
    LogPage,
    NewTask,
    PlanStatus,
    Project,
    Run,
    RunCreated,
    Runner,
    RunPage,
    Session,
    SessionResult,
    Stats,
    Task,
    TasksAdded,
    Token,
)
from corral.tokens import Role

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

DEFAULT_URL = "http://127.0.0.1:8765"
# ``after`` for a log stream that should skip every line already written: only the end
# (the finished run) comes, which is how ``wait_run`` waits without polling.
SKIP_ALL_LINES = 2**63 - 1


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    # Set on the requests that create runs: sent again (its answer lost, or to another
    # coordinator), it creates nothing twice (``Idempotency-Key``).
    idempotency_key: str | None = None
    # A write that, sent twice, does no more than once (it sets a state, or adds what is
    # not there yet): its answer lost, it too may go to another coordinator. The answer is
    # then the last sending's: a plan's tasks added again count as unchanged, a plan
    # started again schedules what the first did not.
    repeatable: bool = False

    @property
    def headers(self) -> dict[str, str] | None:
        return None if self.idempotency_key is None else {"Idempotency-Key": self.idempotency_key}


def _segment(value: str) -> str:
    """One path segment: a session name with ``/`` or ``?`` stays one segment."""
    return quote(value, safe="")


def _model(cls: type[M], key: str | None = None) -> Callable[[Any], M]:
    return lambda body: cls.model_validate(body[key] if key else body)


def _models(cls: type[M], key: str) -> Callable[[Any], list[M]]:
    adapter = TypeAdapter(list[cls])  # type: ignore[valid-type]
    return lambda body: adapter.validate_python(body[key])


def _present(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def decode(response: httpx.Response) -> Any:
    """The JSON answer, or the coordinator's error raised as a ``CorralError`` (its
    ``.code`` is the API's stable code)."""
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise errors.from_wire(response.status_code, body)
    return body


def log_event(item: dict[str, Any]) -> LogLine | Run:
    """One item of a followed log: a line, or the finished run that ends the stream."""
    if item.get("event") == "end":
        return Run.model_validate(item["run"])
    return LogLine.model_validate(item)


# ---- runs ----------------------------------------------------------------------------------


def create_run(spec: dict[str, Any], key: str | None = None) -> Call[RunCreated]:
    return Call("POST", "/runs", _model(RunCreated), body=spec, idempotency_key=key or _new_key())


def run_spec(
    type: str,
    *,
    prompt: str | None = None,
    command: Sequence[str] | None = None,
    session_name: str | None = None,
    session_id: str | None = None,
    agent_name: str | None = None,
    project_dir: str | None = None,
    labels: Iterable[str] = (),
    timeout_s: float | None = None,
    idle_timeout_s: float | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    env: dict[str, str] | None = None,
    parent_session: str | None = None,
    callback: str | None = None,
) -> dict[str, Any]:
    """The body of ``POST /runs``, the fields not given left out (the API's defaults)."""
    return _present(
        type=type,
        prompt=prompt,
        command=list(command) if command is not None else None,
        session_name=session_name,
        session_id=session_id,
        agent_name=agent_name,
        project_dir=project_dir,
        labels=list(labels) or None,
        timeout_s=timeout_s,
        idle_timeout_s=idle_timeout_s,
        max_attempts=max_attempts,
        priority=priority,
        env=env,
        parent_session=parent_session,
        callback=callback,
    )


def create_runs(specs: Sequence[dict[str, Any]], key: str | None = None) -> Call[list[RunCreated]]:
    body = {"runs": list(specs)}
    parse = _models(RunCreated, "runs")
    return Call("POST", "/runs:batch", parse, body=body, idempotency_key=key or _new_key())


def _new_key() -> str:
    return uuid.uuid4().hex


def get_run(run_id: str) -> Call[Run]:
    return Call("GET", f"/runs/{_segment(run_id)}", _model(Run))


def list_runs(
    *,
    status: str | Iterable[str] | None = None,
    session: str | None = None,
    runner_id: str | None = None,
    before: str | None = None,
    limit: int = 50,
) -> Call[RunPage]:
    statuses = status if status is None or isinstance(status, str) else ",".join(status)
    params = _present(
        status=statuses, session=session, runner_id=runner_id, before=before, limit=limit
    )
    return Call("GET", "/runs", _model(RunPage), params=params)


def cancel_run(run_id: str) -> Call[Run]:
    # A cancel sent again finds the cancel asked, or the run cancelled: it changes nothing.
    return Call("POST", f"/runs/{_segment(run_id)}/cancel", _model(Run), repeatable=True)


def logs(run_id: str, after: int = 0, limit: int = 1000) -> Call[LogPage]:
    params = {"after": after, "limit": limit}
    return Call("GET", f"/runs/{_segment(run_id)}/logs", _model(LogPage), params=params)


def follow_params(after: int) -> dict[str, Any]:
    return {"after": after, "follow": "true"}


def logs_path(run_id: str) -> str:
    return f"/runs/{_segment(run_id)}/logs"


# ---- sessions, runners, agents ------------------------------------------------------------


def list_sessions(limit: int = 50) -> Call[list[Session]]:
    return Call("GET", "/sessions", _models(Session, "sessions"), params={"limit": limit})


def get_session(session: str) -> Call[Session]:
    return Call("GET", f"/sessions/{_segment(session)}", _model(Session))


def session_result(session: str) -> Call[SessionResult]:
    return Call("GET", f"/sessions/{_segment(session)}/result", _model(SessionResult))


def list_runners() -> Call[list[Runner]]:
    return Call("GET", "/runners", _models(Runner, "runners"))


def drain_runner(runner_id: str, grace_s: float | None = None) -> Call[Runner]:
    body = _present(grace_s=grace_s)
    # Sent again, a drain keeps the earliest deadline asked: it changes nothing.
    path = f"/runners/{_segment(runner_id)}/drain"
    return Call("POST", path, _model(Runner), body=body, repeatable=True)


def stop_runner(runner_id: str) -> Call[Runner]:
    return Call("POST", f"/runners/{_segment(runner_id)}/stop", _model(Runner), repeatable=True)


def list_agents() -> Call[AgentProfiles]:
    return Call("GET", "/agents", _model(AgentProfiles))


def stats() -> Call[Stats]:
    return Call("GET", "/stats", _model(Stats))


# ---- task graphs ---------------------------------------------------------------------------


def ensure_project(repo_path: str, target_branch: str, settings: dict[str, Any]) -> Call[Project]:
    body = {"repo_path": repo_path, "target_branch": target_branch, **_present(**settings)}
    return Call("POST", "/projects", _model(Project), body=body, repeatable=True)


def list_projects() -> Call[list[Project]]:
    return Call("GET", "/projects", _models(Project, "projects"))


def get_project(project_id: str) -> Call[Project]:
    return Call("GET", f"/projects/{_segment(project_id)}", _model(Project))


def add_tasks(
    project_id: str, tasks: Sequence[NewTask | dict[str, Any]], digest: str | None
) -> Call[TasksAdded]:
    body = {
        "tasks": [NewTask.model_validate(t).model_dump(exclude_none=True) for t in tasks],
        **_present(digest=digest),
    }
    path = f"/projects/{_segment(project_id)}/tasks"
    return Call("POST", path, _model(TasksAdded), body=body, repeatable=True)


def plan_status(project_id: str) -> Call[PlanStatus]:
    return Call("GET", f"/projects/{_segment(project_id)}/tasks", _model(PlanStatus))


def get_task(project_id: str, key: str) -> Call[Task]:
    path = f"/projects/{_segment(project_id)}/tasks/{_segment(key)}"
    return Call("GET", path, _model(Task))


def start_plan(project_id: str, workers: int) -> Call[list[str]]:
    path = f"/projects/{_segment(project_id)}/start"
    return Call(
        "POST",
        path,
        lambda answer: list(answer["scheduled"]),
        body={"workers": workers},
        repeatable=True,
    )


def stop_plan(project_id: str) -> Call[Project]:
    path = f"/projects/{_segment(project_id)}/stop"
    return Call("POST", path, _model(Project), repeatable=True)


def pause_plan(project_id: str, paused: bool) -> Call[bool]:
    path = f"/projects/{_segment(project_id)}/{'pause' if paused else 'resume'}"
    return Call("POST", path, lambda body: bool(body["paused"]), repeatable=True)


def task_action(project_id: str, key: str, action: str) -> Call[Task]:
    path = f"/projects/{_segment(project_id)}/tasks/{_segment(key)}/{action}"
    # A cancel sent again changes nothing; a retry would make another attempt.
    return Call("POST", path, _model(Task), repeatable=action == "cancel")


# ---- actors --------------------------------------------------------------------------------


def list_actors(
    *,
    name: str | None = None,
    key: str | None = None,
    pool: str | None = None,
    state: str | Iterable[str] | None = None,
    before: str | None = None,
    limit: int = 50,
) -> Call[ActorPage]:
    states = state if state is None or isinstance(state, str) else ",".join(state)
    params = _present(name=name, key=key, pool=pool, state=states, before=before, limit=limit)
    return Call("GET", "/actors", _model(ActorPage), params=params)


def get_actor(actor_id: str) -> Call[Actor]:
    return Call("GET", f"/actors/{_segment(actor_id)}", _model(Actor))


# ---- tokens --------------------------------------------------------------------------------


def create_token(role: Role | str, name: str, labels: Sequence[str] | None) -> Call[CreatedToken]:
    body = _present(role=str(role), name=name, labels=list(labels) if labels is not None else None)
    return Call("POST", "/tokens", _model(CreatedToken), body=body)


def list_tokens() -> Call[list[Token]]:
    return Call("GET", "/tokens", _models(Token, "tokens"))


def revoke_token(token_id: str) -> Call[Token]:
    return Call("POST", f"/tokens/{_segment(token_id)}/revoke", _model(Token), repeatable=True)


def raw(method: str, path: str, params: dict[str, Any] | None, body: Any) -> Call[Any]:
    return Call(method, path, lambda answer: answer, params=params or {}, body=body)
