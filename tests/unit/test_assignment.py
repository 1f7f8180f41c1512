"""The run a coordinator assigns, as the runner reads it back (``corral.assignment``): what
``run_assignment_json`` (a poll answer) and ``start_run_json`` (a socket's start_run
command) write, ``Assignment.from_json`` reads, field for field."""

from __future__ import annotations

from dataclasses import replace

from claude_support import agent_run

from corral.assignment import Assignment
from corral.coordinator.schemas import run_assignment_json, start_run_json
from corral.runs import AgentSpec, RunType


def test_an_assignment_reads_back_what_the_coordinator_sent() -> None:
    run = replace(
        agent_run(
            run_id="run_0123456789ab",
            now=1_700_000_000.0,
            prompt="fix the bug",
            project_dir="/work/proj",
            type=RunType.RESUME_SESSION,
            session_id="sess-1",
            agent=AgentSpec(name="coder", executor="claude", model="opus"),
            env={"A": "1"},
        ),
        attempts=3,
        session_name="s",
        timeout_s=60.0,
        idle_timeout_s=5.0,
        task_id="tsk_1",
        task={"id": "tsk_1", "steps": {"worktree": {"path": "/w"}}},
    )
    assert Assignment.from_json(start_run_json(run)) == Assignment.from_json(
        run_assignment_json(run)
    )
    assert Assignment.from_json(run_assignment_json(run)) == Assignment(
        id=run.id,
        type=RunType.RESUME_SESSION,
        attempt=3,
        prompt="fix the bug",
        session_name="s",
        session_id="sess-1",
        agent=run.agent,
        project_dir="/work/proj",
        timeout_s=60.0,
        idle_timeout_s=5.0,
        env={"A": "1"},
        task_id="tsk_1",
        task={"id": "tsk_1", "steps": {"worktree": {"path": "/w"}}},
    )


def test_a_command_run_has_its_argv_and_no_agent() -> None:
    run = replace(
        agent_run(run_id="run_0123456789ac", now=0.0, prompt=None, project_dir=None),
        type=RunType.COMMAND,
        command=("echo", "hi"),
    )
    assignment = Assignment.from_json(run_assignment_json(run))
    assert assignment.command == ("echo", "hi") and assignment.agent is None
    assert assignment.attempt == 1 and assignment.task is None
