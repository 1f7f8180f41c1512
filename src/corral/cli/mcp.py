"""``corral mcp``: corral's MCP server (stdio, or streamable HTTP with ``--http``)."""

from __future__ import annotations

import anyio
import click

from corral.cli.options import coordinator_url, given_token, option
from corral.credentials import read_token

HELP = """corral's MCP server: agent sessions, runs and plans as MCP tools.

\b
Claude Code, over stdio (the server sends --token / CORRAL_TOKEN, else the
.corral/credentials of the directory it starts in):
  claude mcp add corral -- corral mcp --url http://127.0.0.1:8765
Over HTTP (each request's bearer token is sent on to the coordinator):
  corral mcp --http --port 8766
  claude mcp add --transport http corral http://127.0.0.1:8766/mcp \\
      --header "Authorization: Bearer $CORRAL_TOKEN"
"""


@click.command("mcp", help=HELP)
@coordinator_url
@option("--http", "http", env="MCP_HTTP", is_flag=True, help="Serve streamable HTTP at /mcp.")
@option("--host", env="MCP_HOST", default="127.0.0.1", help="Address to serve HTTP on.")
@option("--port", env="MCP_PORT", default=8766, type=click.IntRange(1, 65535), help="HTTP port.")
@option(
    "--progress-every",
    env="MCP_PROGRESS_EVERY",
    default=10.0,
    type=click.FloatRange(min=0.01),
    help="Seconds between progress notifications while a sync call waits for its run.",
)
def mcp(url: str, http: bool, host: str, port: int, progress_every: float) -> None:
    from corral.mcp.server import build_server  # the SDK loads only for this command

    if not http:
        server = build_server(url, given_token() or read_token(), progress_every_s=progress_every)
        anyio.run(server.run_stdio_async)
        return
    server = build_server(url, None, forward_token=True, progress_every_s=progress_every)
    anyio.run(lambda: server.run_streamable_http_async(host=host, port=port))
