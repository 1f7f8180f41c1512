"""What a runner is given to execute one attempt of a run: ``Assignment``.

The coordinator sends it as the ``run`` of a poll answer (HTTP), encoded by
``coordinator.schemas.run_assignment_json``: the run as clients see it, with its agent
snapshot, its environment and, for a task run, its task context; or of a ``start_run``
command (WebSocket), encoded by ``start_run_json``: only what is read here. The runner
reads back what executing the attempt takes — not a stored ``Run`` rebuilt with made-up
timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.ids import RunId
from corral.runs import AgentSpec, RunType


@dataclass(frozen=True)
class Assignment:
    id: RunId
    type: RunType
    attempt: int  # which attempt of the run this is: every report names it
    prompt: str | None = None
    command: tuple[str, ...] = ()
    session_name: str | None = None
    session_id: str | None = None  # the agent session to resume
    agent: AgentSpec | None = None  # the profile's snapshot, taken when the run was created
    project_dir: str | None = None
    timeout_s: float | None = None
    idle_timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    task_id: str | None = None
    task: dict[str, Any] | None = None  # a task run's task, project and steps already done

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Assignment:
        return cls(
            id=RunId(data["run_id"]),
            type=RunType(data["type"]),
            attempt=data["attempts"],
            prompt=data["prompt"],
            command=tuple(data["command"]),
            session_name=data["session_name"],
            session_id=data["session_id"],
            agent=AgentSpec.from_dict(data["agent"]) if data.get("agent") else None,
            project_dir=data["project_dir"],
            timeout_s=data["timeout_s"],
            idle_timeout_s=data["idle_timeout_s"],
            env=dict(data.get("env") or {}),
            task_id=data.get("task_id"),
            task=data.get("task"),
        )
