"""Which executor runs a run: its agent profile's executor, or the command executor."""

from __future__ import annotations

from corral.agents.base import Executor
from corral.agents.claude import AgentMcp, ClaudeExecutor
from corral.agents.command import CommandExecutor
from corral.assignment import Assignment
from corral.errors import InvalidRequest
from corral.runs import RunType


def executor_for(
    run: Assignment, *, claude_bin: str, result_grace_s: float, mcp: AgentMcp | None = None
) -> Executor:
    if run.type is RunType.COMMAND:
        return CommandExecutor()
    kind = run.agent.executor if run.agent else "claude"
    if kind == "claude":
        return ClaudeExecutor(binary=claude_bin, result_grace_s=result_grace_s, mcp=mcp)
    raise InvalidRequest(f"this runner has no executor {kind!r}")
