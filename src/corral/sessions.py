"""Sessions: an agent conversation that runs start and resume."""

from __future__ import annotations

from dataclasses import dataclass

from corral.ids import RunnerId


@dataclass(frozen=True)
class Session:
    """An agent conversation: the runner and directory that hold it, and its latest result."""

    id: str
    name: str | None
    agent_name: str | None
    runner_id: RunnerId | None
    project_dir: str | None
    last_run_id: str | None
    result: str | None
    is_error: bool
    cost_usd: float
    runs: int
    created_at: float
    updated_at: float
