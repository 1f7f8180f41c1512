"""Helpers shared by the ClaudeExecutor tests (``test_claude_executor``, ``test_fake_claude``)
and the dashboard's (a stored run)."""

from __future__ import annotations

from corral.assignment import Assignment
from corral.ids import RunId
from corral.runs import AgentSpec, Run, RunStatus, RunType


def agent_run(
    *,
    run_id: str,
    now: float,
    prompt: str | None,
    project_dir: str | None,
    type: RunType = RunType.START_SESSION,
    session_id: str | None = None,
    agent: AgentSpec | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """A running agent run on its first attempt, claimed and started at ``now``, for an
    executor to prepare and observe."""
    return Run(
        id=RunId(run_id),
        type=type,
        status=RunStatus.RUNNING,
        prompt=prompt,
        command=(),
        session_name=None,
        session_id=session_id,
        agent=agent,
        project_dir=project_dir,
        labels=(),
        timeout_s=None,
        idle_timeout_s=None,
        max_attempts=3,
        attempts=1,
        priority=0,
        required_runner=None,
        runner_id=None,
        env=env or {},
        exit_code=None,
        error=None,
        result=None,
        cost_usd=None,
        usage=None,
        num_turns=None,
        cancel_requested=False,
        rate_limited=0,
        available_at=now,
        created_at=now,
        claimed_at=now,
        started_at=now,
        finished_at=None,
    )


def agent_assignment(
    *,
    run_id: str,
    prompt: str | None,
    project_dir: str | None,
    type: RunType = RunType.START_SESSION,
    session_id: str | None = None,
    agent: AgentSpec | None = None,
    env: dict[str, str] | None = None,
) -> Assignment:
    """An agent run's first attempt as a runner is given it, for an executor to prepare
    and observe."""
    return Assignment(
        id=RunId(run_id),
        type=type,
        attempt=1,
        prompt=prompt,
        session_id=session_id,
        agent=agent,
        project_dir=project_dir,
        env=env or {},
    )
