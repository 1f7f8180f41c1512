"""The ``corral`` entry point: commands, and errors as one line with a stable exit code."""

from __future__ import annotations

import sys

import click

from corral import __version__
from corral.cli import gc, runs, servers, tasks
from corral.errors import CorralError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """corral: a durable control plane for coding agents and commands on runners."""


for command in (
    servers.serve,
    servers.runner_cmd,
    servers.up,
    runs.start,
    runs.resume,
    runs.run_command,
    runs.runs,
    runs.logs,
    runs.result,
    runs.runners,
    tasks.tasks,
    gc.gc,
):
    cli.add_command(command)


def main() -> None:
    try:
        code = cli.main(standalone_mode=False)
    except CorralError as exc:
        click.echo(f"error: {exc.message} [{exc.code}]", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
