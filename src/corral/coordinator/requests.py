"""Turning a client's run request into a validated ``NewRun`` (agents, sessions, limits)."""

from __future__ import annotations

from dataclasses import replace

from corral.agents.profiles import resolve
from corral.coordinator.schemas import CreateRun
from corral.errors import Conflict, InvalidRequest, PayloadTooLarge, SessionNotReady
from corral.runs import AgentSpec, NewRun, RunType
from corral.store import Store


def build_new_run(
    body: CreateRun, store: Store, profiles: dict[str, AgentSpec], max_prompt_bytes: int
) -> NewRun:
    """Validate one request; reads the store for resumes, so call it off the event loop."""
    if body.prompt is not None and len(body.prompt.encode()) > max_prompt_bytes:
        raise PayloadTooLarge(
            f"prompt is {len(body.prompt.encode())} bytes; the limit is {max_prompt_bytes}"
        )
    kind = RunType(body.type)
    if kind is RunType.COMMAND:
        if not body.command or not body.command[0]:
            raise InvalidRequest("a command run needs a non-empty 'command' argv list")
        return _new_run(body, kind, command=tuple(body.command))
    if not body.prompt or not body.prompt.strip():
        raise InvalidRequest(f"a {kind} run needs a 'prompt'")
    if body.command:
        raise InvalidRequest(f"a {kind} run takes a prompt, not a 'command'")
    if kind is RunType.START_SESSION:
        return _new_run(body, kind, agent=resolve(profiles, body.agent_name))
    return _resume(_new_run(body, kind), body, store, profiles)


def _new_run(
    body: CreateRun, kind: RunType, command: tuple[str, ...] = (), agent: AgentSpec | None = None
) -> NewRun:
    """The request's run, with what its kind adds, made in one go: a ``replace`` of it
    afterwards would cost more than the rest of the request's validation."""
    return NewRun(
        type=kind,
        prompt=body.prompt,
        command=command,
        session_name=body.session_name,
        agent=agent,
        project_dir=body.project_dir,
        labels=tuple(body.labels),
        timeout_s=body.timeout_s,
        idle_timeout_s=body.idle_timeout_s,
        max_attempts=body.max_attempts,
        priority=body.priority,
        env=dict(body.env),
        parent_session=body.parent_session,
        callback=body.callback,
    )


def _resume(base: NewRun, body: CreateRun, store: Store, profiles: dict[str, AgentSpec]) -> NewRun:
    key = body.session_id or body.session_name
    if not key:
        raise InvalidRequest("a resume_session run needs 'session_id' or 'session_name'")
    session = store.sessions.get(key)
    if session.runner_id is None:
        raise SessionNotReady(f"session {session.id} has not started on any runner yet")
    agent = resolve(profiles, body.agent_name or session.agent_name)
    if agent.budget_usd is not None and session.cost_usd >= agent.budget_usd:
        raise Conflict(
            f"session {session.id} has cost ${session.cost_usd:.4f}, at or over the "
            f"${agent.budget_usd:.2f} budget of agent {agent.name!r}",
            code="budget_exceeded",
        )
    runner = store.runners.get(session.runner_id)
    return replace(
        base,
        agent=agent,
        session_id=session.id,
        session_name=session.name,
        # The agent keeps its session on that host, keyed by directory: go back to both.
        project_dir=session.project_dir,
        required_runner=runner.name,
    )
