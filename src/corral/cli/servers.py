"""``corral serve``, ``corral runner`` and ``corral up`` (both in one process)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from pathlib import Path
from typing import Any

import click
import uvicorn

from corral.cli.gc import DURATION, retention_from, retention_options
from corral.cli.options import URL, comma_list, labels_from, option
from corral.coordinator.app import QuietServer, server_config
from corral.coordinator.settings import CoordinatorSettings
from corral.runner.core import Runner
from corral.runner.process import watch_children_with_pidfds
from corral.runner.settings import RunnerSettings
from corral.store.db import redact_url

DEFAULT_DB = ".corral/corral.db"


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
                help="Seconds between a WebSocket runner's pings.",
            ),
            option(
                "--runner-lost-threshold",
                env="RUNNER_LOST_THRESHOLD",
                default=15.0,
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
    max_log_chars: int,
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
        retention=retention_from(retain_runs, retain_runners, max_log_chars),
    )


def runner_options(fn: click.decorators.FC) -> click.decorators.FC:
    for decorate in reversed(
        [
            option(
                "--name",
                env="RUNNER_NAME",
                default=None,
                help="Runner name (default: host name); resumes go back to it.",
            ),
            option(
                "--slots",
                env="SLOTS",
                default=4,
                type=click.IntRange(1, 1024),
                help="Runs executed at once.",
            ),
            option("--labels", env="LABELS", default="", help="Comma-separated labels."),
            option(
                "--claude-bin",
                env="CLAUDE_BIN",
                default="claude",
                help="The Claude Code executable.",
            ),
            option(
                "--drain-grace",
                env="DRAIN_GRACE",
                default=120.0,
                type=float,
                help="On SIGTERM, seconds running work may go on before it is stopped.",
            ),
            option(
                "--pass-env",
                env="PASS_ENV",
                default="",
                help="Comma-separated names (fnmatch patterns, e.g. 'MY_*') of this "
                "runner's environment its runs may see; beyond PATH, HOME, LANG, LC_*, "
                "TERM, USER, LOGNAME, SHELL, TMPDIR and TZ they see nothing of it.",
            ),
            option(
                "--transport",
                env="TRANSPORT",
                default="websocket",
                type=click.Choice(["websocket", "poll"]),
                help="Link to the coordinator: a WebSocket, or the HTTP long-poll.",
            ),
        ]
    ):
        fn = decorate(fn)
    return fn


def _runner_settings(
    url: str,
    name: str | None,
    slots: int,
    labels: str,
    claude_bin: str,
    drain_grace: float,
    pass_env: str,
    transport: str,
) -> RunnerSettings:
    settings = RunnerSettings(
        coordinator_url=url,
        slots=slots,
        claude_bin=claude_bin,
        drain_grace_s=drain_grace,
        transport=transport,
        labels=labels_from([labels]),
        pass_env=comma_list(pass_env),
    )
    return settings if name is None else RunnerSettings(**{**settings.__dict__, "name": name})


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


@click.command()
@coordinator_options
def serve(**kwargs: object) -> None:
    """Run the coordinator (REST API, runner endpoints, reconciler)."""
    _logging()
    settings = _coordinator_settings(**kwargs)  # type: ignore[arg-type]
    uvicorn.Server(server_config(settings, host=settings.host, port=settings.port)).run()


@click.command("runner")
@option(
    "--url",
    "--coordinator",
    "url",
    env="URL",
    type=URL,
    default="http://127.0.0.1:8765",
    help="The coordinator's URL (--coordinator: the same).",
)
@runner_options
def runner_cmd(url: str, **kwargs: object) -> None:
    """Run a runner: claim runs from the coordinator and execute them."""
    _logging()
    settings = _runner_settings(url, **kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        watch_children_with_pidfds()
        runner = Runner(settings)
        runner.install_signal_handlers()
        await runner.run()

    asyncio.run(main())


@click.command()
@coordinator_options
@runner_options
def up(**kwargs: Any) -> None:
    """Run a coordinator and one local runner in one process (SQLite by default)."""
    _logging()
    mine = inspect.signature(_coordinator_settings).parameters
    settings = _coordinator_settings(**{k: kwargs.pop(k) for k in list(kwargs) if k in mine})
    host, port, db = settings.host, settings.port, settings.db_url
    url = f"http://{host}:{port}"
    runner_settings = _runner_settings(url, **kwargs)

    async def main() -> None:
        server = QuietServer(server_config(settings, host=host, port=port))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            if serving.done():
                await serving
                raise click.ClickException(f"could not start the coordinator on {url}")
            await asyncio.sleep(0.05)
        runner = Runner(runner_settings)
        runner.install_signal_handlers()
        click.echo(
            f"corral is up: {url}  (docs {url}/docs, database {redact_url(db)}); Ctrl-C stops it"
        )
        await runner.run()
        server.should_exit = True
        await serving

    asyncio.run(main())
