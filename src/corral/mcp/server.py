"""corral's MCP server on the official ``mcp`` SDK: the tools of ``tools.py``, over stdio or
streamable HTTP, with the coordinator's refusals as tool errors carrying their codes.

A refused call answers ``isError: true`` with the text ``<code>: <message>`` (for the
model to read) and the structured ``{"error": {"code", "message"}}`` of the REST API (for
programs): ``session_not_found``, ``unknown_agent``, ``session_exists`` … Arguments that do
not fit a tool's input schema are refused by the SDK before the tool runs, under the code
``invalid_request``; nothing reaches the coordinator then.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from corral import __version__
from corral.errors import CorralError, InvalidRequest
from corral.mcp.tools import PROGRESS_EVERY_S, Tools

INSTRUCTIONS = (
    "corral runs agent sessions and commands durably on a fleet of runners. Start a "
    "sub-agent with start_agent_session (execution_mode sync waits for its result; "
    "async_poll answers at once: poll get_agent_session_status, then read "
    "get_agent_session_result; async_callback answers at once and resumes your session "
    "with its result when it ends), continue it with resume_agent_session (the same "
    "modes). run_command takes them too: async_callback resumes your session with the "
    "command's exit code and last lines of output."
)


class CorralMCP(MCPServer[Any]):
    """The SDK's server, with corral's errors answered as tool errors with their code."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            refusal = _refusal(exc)
            if refusal is None:
                raise
            return CallToolResult(
                content=[TextContent(type="text", text=f"{refusal.code}: {refusal.message}")],
                structured_content=refusal.to_dict(),
                is_error=True,
            )


def _refusal(exc: ToolError) -> CorralError | None:
    """The corral error behind a tool error, or a refused argument as ``invalid_request``."""
    cause = exc.__cause__
    if isinstance(cause, CorralError):
        return cause
    if isinstance(cause, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'arguments'}: {error['msg']}"
            for error in cause.errors()
        )
        return InvalidRequest(f"invalid arguments: {problems}")
    return None


def build_server(
    url: str,
    token: str | None,
    *,
    forward_token: bool = False,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> CorralMCP:
    """The server for the coordinator at ``url`` (or those, comma-separated).
    ``forward_token``: send the coordinator the bearer token each MCP request carries
    (HTTP) instead of ``token`` (stdio)."""
    server = CorralMCP(
        "corral", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    tools = Tools(
        url,
        token,
        forward_token=forward_token,
        progress_every_s=progress_every_s,
        agent_run_id=os.environ.get("CORRAL_RUN_ID") or None,
    )
    described: list[tuple[Callable[..., Any], str]] = [
        (tools.start_agent_session, "Start a new agent session (a sub-agent) with a prompt."),
        (tools.resume_agent_session, "Continue an agent session with a new prompt."),
        (
            tools.get_agent_session_status,
            "Whether a session is running, finished or not_existent; optionally wait for it.",
        ),
        (tools.get_agent_session_result, "The latest result of a finished session."),
        (tools.list_agent_sessions, "Agent sessions, the most recently used first."),
        (tools.list_agents, "The agent profiles a session may name (agent_name)."),
        (tools.cancel_run, "Cancel a run (a running one is stopped)."),
        (
            tools.run_command,
            "Run a command (an argv) on a runner; sync returns its output, async_callback "
            "resumes your session with it.",
        ),
        (tools.add_tasks, "Add tasks to the task graph of a repository and branch."),
        (tools.plan_status, "The tasks of a repository's plan and their states."),
        (tools.list_actors, "Actors (long-lived processes on runners), newest first."),
    ]
    for tool, doc in described:
        server.add_tool(tool, description=doc, structured_output=True)
    return server
