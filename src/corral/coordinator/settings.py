"""The coordinator's settings, built once from flags, then CORRAL_* variables, then defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corral.store.retention import Retention

# On shutdown, open long-polls are cut after this long instead of held to their timeout.
SHUTDOWN_GRACE_S = 2


@dataclass(frozen=True)
class CoordinatorSettings:
    db_url: str = ".corral/corral.db"
    host: str = "127.0.0.1"
    port: int = 8765
    config_path: Path | None = None
    poll_timeout_s: float = 30.0
    heartbeat_interval_s: float = 60.0
    lost_after_s: float = 120.0
    reconcile_interval_s: float = 1.0
    # A runner enforces run timeouts itself; the coordinator steps in this much later.
    timeout_grace_s: float = 30.0
    # WebSocket runners: ping often, and are lost soon after they stop pinging — but not
    # so soon that a coordinator's restart (seconds) makes them stop their work: a runner
    # holds its runs for this less its stop margin after its last answered ping.
    ws_ping_interval_s: float = 3.0
    ws_lost_after_s: float = 20.0
    ws_ack_interval_s: float = 300.0
    max_prompt_bytes: int = 256 * 1024
    # Sub-agent sessions (corral.subagents): how deep they nest, how many unfinished
    # children one session may have.
    max_subagent_depth: int = 3
    max_subagent_children: int = 8
    # Request bodies: clients' and runners' (a runner's batch of reports carries logs).
    max_body_bytes: int = 4 * 1024 * 1024
    max_runner_body_bytes: int = 8 * 1024 * 1024
    retention: Retention = field(default_factory=Retention)
    gc_interval_s: float | None = 3600.0  # None: only ``corral gc`` collects
    # The admin token (CORRAL_TOKEN, or .corral/credentials: see corral.credentials);
    # None: only tokens of the store are accepted.
    token: str | None = field(default=None, repr=False)
    # Host names requests may name, beyond loopback and the bound address ("*": any).
    allowed_hosts: tuple[str, ...] = ()
    token_cache_s: float = 2.0  # a revoke reaches other coordinator processes this late
    # GET /events: what other processes write is seen this late (this one's: at once);
    # a stream further behind than event_queue_size events is dropped (it may resume).
    events_poll_interval_s: float = 1.0
    event_queue_size: int = 10_000
    # Serverless pools: how often the autoscaler looks, and the URL their endpoints' runners
    # connect to (None: http://host:port).
    autoscale_interval_s: float = 0.5
    public_url: str | None = None

    @property
    def endpoint_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"
