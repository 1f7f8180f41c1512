"""``corral serve``, ``corral runner`` and ``corral up`` (both in one process)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import itertools
import logging
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import click
import uvicorn

from corral.agents.profiles import load_profiles
from corral.backoff import backoff_delay
from corral.cli.gc import DURATION, retention_from, retention_options
from corral.cli.log_format import configure_logging, log_format_option
from corral.cli.options import comma_list, option
from corral.cli.runner import runner_options, runner_settings
from corral.coordinator.app import CorralServer, QuietServer, server_config
from corral.coordinator.settings import CoordinatorSettings
from corral.credentials import coordinator_token
from corral.dashboard.site import address as dashboard_address
from corral.errors import Conflict, CorralError, InvalidRequest, Unavailable
from corral.runner.core import RunnerCore
from corral.runner.process import collect_less, run_loop
from corral.store.db import open_database, redact_url, sqlite_path

DEFAULT_DB = ".corral/corral.db"
log = logging.getLogger("corral.coordinator")


POSITIVE = click.FloatRange(min=0, min_open=True)  # seconds: 0 or less makes no sense


def coordinator_options(fn: click.decorators.FC) -> click.decorators.FC:
    for decorate in reversed(
        [
            option("--host", env="HOST", default="127.0.0.1", help="Address to listen on."),
            option("--port", env="PORT", default=8765, type=int, help="Port to listen on."),
            option(
                "--db",
                env="DB",
                default=DEFAULT_DB,
                help="SQLite file path, or a postgresql:// URL.",
            ),
            option(
                "--config",
                env="CONFIG",
                default="corral.toml",
                type=click.Path(dir_okay=False, path_type=Path),
                help="TOML config with [agents.<name>] profiles (optional).",
            ),
            option(
                "--poll-timeout",
                env="POLL_TIMEOUT",
                default=30.0,
                type=POSITIVE,
                help="Seconds a runner's long-poll is held open.",
            ),
            option(
                "--heartbeat-interval",
                env="HEARTBEAT_INTERVAL",
                default=60.0,
                type=POSITIVE,
                help="Seconds between runner heartbeats.",
            ),
            option(
                "--lost-after",
                env="LOST_AFTER",
                default=120.0,
                type=POSITIVE,
                help="Seconds without a heartbeat before a long-poll runner is lost.",
            ),
            option(
                "--ping-interval",
                env="PING_INTERVAL",
                default=3.0,
                type=POSITIVE,
                help="Seconds between a WebSocket runner's pings. A runner that joins "
                "a coordinator whose sockets already ping 1,000 times a second is asked "
                "to ping less often, up to 5 s.",
            ),
            option(
                "--runner-lost-threshold",
                env="RUNNER_LOST_THRESHOLD",
                default=20.0,
                type=POSITIVE,
                help="Seconds without a ping before a WebSocket runner is lost.",
            ),
            option(
                "--ack-interval",
                env="ACK_INTERVAL",
                default=300.0,
                type=POSITIVE,
                help="Seconds between a WebSocket runner's command acknowledgements "
                "(also sent at once after every reconnect).",
            ),
            option(
                "--gc-interval",
                env="GC_INTERVAL",
                default="1h",
                type=DURATION,
                help="How often retention deletes what it lets go ('off': only corral gc).",
            ),
            option(
                "--token",
                env="TOKEN",
                default=None,
                show_default=False,
                help="The admin token (default: the one in .corral/credentials here, made "
                "on the first start, readable by you only).",
            ),
            option(
                "--max-subagent-depth",
                env="MAX_SUBAGENT_DEPTH",
                default=3,
                type=click.IntRange(0, 100),
                help="How deep sub-agent sessions may nest (a root session is at 0; 0: no "
                "sub-agents). A deeper child is refused with depth_exceeded.",
            ),
            option(
                "--max-subagent-children",
                env="MAX_SUBAGENT_CHILDREN",
                default=8,
                type=click.IntRange(1, 10_000),
                help="Unfinished children (sub-agents, commands) one session may have at "
                "once. One more is refused with fan_out_exceeded.",
            ),
            option(
                "--allowed-hosts",
                env="ALLOWED_HOSTS",
                default="",
                help="Comma-separated host names requests may be addressed to, beyond "
                "localhost, 127.0.0.1, ::1 and --host ('*': any). Others are refused "
                "(DNS rebinding).",
            ),
            option(
                "--public-url",
                env="PUBLIC_URL",
                default=None,
                show_default=False,
                help="The URL other coordinators (their gateways forward requests for "
                "actors whose runner is connected here) and serverless endpoints reach "
                "this one at (default: http://HOST:PORT).",
            ),
        ]
    ):
        fn = decorate(fn)
    return retention_options(fn)


def _coordinator_settings(
    host: str,
    port: int,
    db: str,
    config: Path,
    poll_timeout: float,
    heartbeat_interval: float,
    lost_after: float,
    ping_interval: float,
    runner_lost_threshold: float,
    ack_interval: float,
    gc_interval: float | None,
    retain_runs: float | None,
    retain_runners: float | None,
    retain_events: float | None,
    max_log_chars: int,
    token: str | None,
    max_subagent_depth: int,
    max_subagent_children: int,
    allowed_hosts: str,
    public_url: str | None = None,
) -> CoordinatorSettings:
    return CoordinatorSettings(
        db_url=db,
        host=host,
        port=port,
        config_path=config,
        poll_timeout_s=poll_timeout,
        heartbeat_interval_s=heartbeat_interval,
        lost_after_s=lost_after,
        ws_ping_interval_s=ping_interval,
        ws_lost_after_s=runner_lost_threshold,
        ws_ack_interval_s=ack_interval,
        gc_interval_s=gc_interval,
        retention=retention_from(retain_runs, retain_runners, max_log_chars, retain_events),
        token=coordinator_token(token),
        max_subagent_depth=max_subagent_depth,
        max_subagent_children=max_subagent_children,
        allowed_hosts=comma_list(allowed_hosts),
        public_url=public_url.rstrip("/") if public_url else None,
    )


def _check_port_free(host: str, port: int) -> None:
    """Refuse at once, in one line, a port another process listens on (a second ``corral
    up``), rather than let the server fail with a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise Conflict(
                    f"port {port} is in use — is another corral running? "
                    f"(or choose another with --port)",
                    code="port_in_use",
                ) from None
            raise InvalidRequest(f"cannot listen on {host}:{port}: {exc.strerror}") from None


@click.command()
@coordinator_options
@log_format_option
def serve(log_format: str, **kwargs: object) -> None:
    """Run the coordinator (REST API, runner endpoints, reconciler)."""
    configure_logging(log_format)
    settings = _coordinator_settings(**kwargs)  # type: ignore[arg-type]
    _check_port_free(settings.host, settings.port)
    try:
        _wait_for_database(settings.db_url)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    config = server_config(settings, host=settings.host, port=settings.port, own_logging=False)
    server = _StoppingServer(config, settings)
    collect_less()
    server.run()
    click.echo("corral serve stopped", err=True)
    if server.stopped_by == signal.SIGINT:
        raise SystemExit(130)  # Ctrl-C, as every command that it stops


def _wait_for_database(url: str) -> None:
    """Wait for a PostgreSQL that cannot be reached yet (starting with the machine, or
    restarting), saying why at each try, rather than exit: a coordinator started during
    an outage serves once it ends, as its runners reconnect. SQLite is a file: nothing to
    wait for. Ctrl-C or SIGTERM stop the wait (nothing is open yet)."""
    if sqlite_path(url) is not None:
        return
    for attempt in itertools.count():
        try:
            open_database(url).close()  # and migrate, once the server answers
        except Unavailable as exc:
            delay = backoff_delay(attempt, cap=10.0)
            log.warning("%s; trying again in %.1f s", exc.message, delay)
            time.sleep(delay)
        else:
            return


def reload_agents(app: Any, config: Path | None) -> None:
    """SIGHUP: read the agent profiles again; a config that does not load keeps the old."""
    coordinator = getattr(app.state, "coordinator", None)
    if coordinator is None:  # not started yet
        return
    try:
        profiles = load_profiles(config)
    except CorralError as exc:
        log.error("agent profiles not reloaded (the loaded ones stay): %s", exc.message)
        return
    coordinator.profiles = profiles
    log.info("agent profiles reloaded from %s: %s", config, ", ".join(sorted(profiles)))


class _StoppingServer(CorralServer):
    """uvicorn's server, stopped by SIGINT or SIGTERM after its graceful shutdown, which
    remembers the signal instead of raising it again once stopped (a KeyboardInterrupt's
    traceback, or death by SIGTERM with no word said)."""

    stopped_by: int | None = None

    def __init__(self, config: uvicorn.Config, settings: CoordinatorSettings) -> None:
        super().__init__(config)
        self.settings = settings

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(sig: int, frame: FrameType | None) -> None:
            self.stopped_by = self.stopped_by or sig
            self.handle_exit(sig, frame)

        def reload(sig: int, frame: FrameType | None) -> None:
            reload_agents(self.config.app, self.settings.config_path)

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, reload)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _dashboard_line(url: str, token: str | None) -> str:
    """Where the dashboard is. Its token only on a terminal: piped output may be logged."""
    if sys.stdout.isatty():
        return f"dashboard: {dashboard_address(url, token)}"
    return f"dashboard: {dashboard_address(url, None)}  (sign in with the admin token)"


@click.command()
@coordinator_options
@runner_options
@log_format_option
def up(log_format: str, **kwargs: Any) -> None:
    """Run a coordinator and one local runner in one process (SQLite by default)."""
    configure_logging(log_format)
    mine = inspect.signature(_coordinator_settings).parameters
    settings = _coordinator_settings(**{k: kwargs.pop(k) for k in list(kwargs) if k in mine})
    host, port, db = settings.host, settings.port, settings.db_url
    _check_port_free(host, port)
    # Listening on every address: the local runner and the banner use loopback.
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"
    local_runner = replace(
        runner_settings(url, config=settings.config_path, **kwargs), token=settings.token
    )

    async def main() -> None:
        server = QuietServer(server_config(settings, host=host, port=port, own_logging=False))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            if serving.done():  # it could not listen (the port taken since the check)
                with contextlib.suppress(SystemExit):
                    await serving
                raise Unavailable(f"could not start the coordinator on {url}")
            await asyncio.sleep(0.05)
        runner = RunnerCore(local_runner)
        runner.install_signal_handlers()
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGHUP, reload_agents, server.config.app, settings.config_path
        )
        click.echo(
            f"corral is up: {url}  (docs {url}/docs, database {redact_url(db)}); Ctrl-C stops it"
        )
        click.echo(_dashboard_line(url, settings.token))
        await runner.run()
        server.should_exit = True
        await serving

    run_loop(main())
