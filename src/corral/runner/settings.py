"""The runner's settings, built once from flags, then CORRAL_* variables, then defaults."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from corral.actors.kinds import ActorKind
from corral.runner.output import MAX_LINE_BYTES


@dataclass(frozen=True)
class RunnerSettings:
    # One coordinator's URL, or several separated by commas (coordinators sharing one
    # PostgreSQL database), a name possibly standing for one coordinator per address
    # (``corral.runner.coordinators``): the runner moves to the next when one fails.
    coordinator_url: str = "http://127.0.0.1:8765"
    token: str | None = field(default=None, repr=False)  # sent as a bearer token, never shown
    name: str = field(default_factory=socket.gethostname)
    slots: int = 4
    labels: tuple[str, ...] = ()
    claude_bin: str = "claude"
    # A client token the runner's agents get for corral's MCP server (``corral mcp``), so
    # that an agent can start sub-agents; None: agents get no corral MCP server.
    agent_token: str | None = field(default=None, repr=False)
    # Agents get corral's MCP server with a token minted for their own run (it acts for
    # their session only: ``corral.coordinator.scope``), asked of the coordinator as each
    # agent starts. ``agent_token``, if given, is sent instead.
    agent_mcp: bool = False
    # Names (fnmatch patterns) of the runner's environment its runs may see, beyond the
    # allow-list of ``corral.runner.environment``.
    pass_env: tuple[str, ...] = ()
    transport: str = "poll"  # "websocket" or "poll" (the seed's HTTP long-poll)
    # No output for this long stops an agent run (commands only when the run sets it).
    agent_idle_timeout_s: float = 600.0
    kill_grace_s: float = 5.0  # SIGTERM, then this long, then SIGKILL
    result_grace_s: float = 5.0  # an agent must exit this soon after its result line
    drain_grace_s: float = 120.0  # on SIGTERM, how long running work may go on
    log_flush_s: float = 0.1
    max_backoff_s: float = 30.0
    # Longer output lines are cut (with a marker) as they are read; reading goes on.
    max_line_bytes: int = MAX_LINE_BYTES
    # Actors it hosts (``[actors.NAME]`` of its config), in which pool, how many at once.
    actor_kinds: dict[str, ActorKind] = field(default_factory=dict)
    pool: str = "default"
    actor_slots: int = 16

    @property
    def coordinator_urls(self) -> tuple[str, ...]:
        return tuple(u.strip() for u in self.coordinator_url.split(",") if u.strip())
