"""``corral serverless-endpoint``: the endpoint of a serverless pool (``/start`` streams)."""

from __future__ import annotations

from pathlib import Path

import click

from corral.actors.kinds import load_kinds
from corral.cli.log_format import configure_logging, log_format_option
from corral.cli.options import option
from corral.runner.process import run_loop
from corral.runner.serverless import ServerlessEndpoint, serve
from corral.runner.settings import RunnerSettings


@click.command("serverless-endpoint")
@option("--host", env="ENDPOINT_HOST", default="127.0.0.1", help="Address to listen on.")
@option("--port", env="ENDPOINT_PORT", default=8790, type=click.IntRange(1, 65535),
        help="Port to listen on: the pool's url is http://HOST:PORT.")  # fmt: skip
@option(
    "--drain-grace",
    env="DRAIN_GRACE",
    default=10.0,
    type=float,
    help="Seconds before a stream's lifespan ends that its runner drains, and how long "
    "its work then has.",
)
@option(
    "--config",
    env="CONFIG",
    default="corral.toml",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config with the [actors.<name>] its runners host.",
)
@log_format_option
def serverless_endpoint(
    host: str, port: int, drain_grace: float, config: Path, log_format: str
) -> None:
    """Serve a serverless pool's GET /start: a runner for the life of each stream."""
    configure_logging(log_format)
    base = RunnerSettings(actor_kinds=load_kinds(config))
    endpoint = ServerlessEndpoint(base, drain_grace_s=drain_grace)
    run_loop(serve(endpoint, host, port))
