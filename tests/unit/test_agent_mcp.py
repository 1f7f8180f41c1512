"""The MCP server a runner gives its agents (``agent_mcp``)."""

from __future__ import annotations

from corral.runner.core import agent_mcp
from corral.runner.settings import RunnerSettings

A, B = "http://a:8765", "http://b:8765"


def test_a_runners_agents_get_every_coordinator_url() -> None:
    """So that an agent keeps its tools when the first coordinator dies mid-session."""
    settings = RunnerSettings(coordinator_url=f"{A}, {B}", agent_mcp=True)
    mcp = agent_mcp(settings)
    assert mcp is not None
    assert mcp.command[1:] == ("mcp", "--url", f"{A},{B}")


def test_no_agent_token_and_no_minting_no_server() -> None:
    assert agent_mcp(RunnerSettings(coordinator_url=A)) is None
