"""The ``corral`` entry point: commands, and errors as one line with a stable exit code.

Exit statuses: ``0`` success; ``1`` a failure (a run that failed, a task that failed);
``2`` bad input (a usage error, ``invalid_request``); ``3`` not found; ``4`` conflict;
``5`` the coordinator is unreachable or unavailable; ``6`` no token or an unknown one;
``7`` a token whose role may not do that; ``130`` Ctrl-C. Following a run
(``run --wait``, ``logs -f``, ``wait``) ends with the run's own status: see
``corral.cli.follow``.
"""

from __future__ import annotations

import sys

import click

from corral import __version__
from corral.cli import (
    actors,
    agents,
    doctor,
    events,
    gc,
    mcp,
    runners,
    runs,
    serverless,
    servers,
    sessions,
    status,
    submit,
    tasks,
    tokens,
)
from corral.errors import CorralError

EPILOG = """\b
Exit status: 0 success; 1 a run or task failed; 2 bad input; 3 not found;
4 conflict; 5 coordinator unreachable; 6 no or unknown token; 7 forbidden;
130 Ctrl-C. run --wait, logs -f and wait exit with the run's: the command's
own status, 124 timed out, 125 cancelled.
Every flag also reads the CORRAL_* variable its --help names; NO_COLOR is honoured.
Shell completion: eval "$(_CORRAL_COMPLETE=bash_source corral)" (zsh_source, fish_source).
"""


def _no_color(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    ctx.meta["corral.no_color"] = value


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(__version__, prog_name="corral")
@click.option(
    "--no-color",
    is_flag=True,
    envvar="CORRAL_NO_COLOR",
    show_envvar=True,
    expose_value=False,
    callback=_no_color,
    help="No colour, even on a terminal (so does NO_COLOR).",
)
def cli() -> None:
    """corral: a durable control plane for coding agents and commands on runners."""


for command in (
    servers.serve,
    servers.runner_cmd,
    servers.up,
    submit.start,
    submit.resume,
    submit.run_command,
    runs.runs,
    runs.logs,
    runs.wait,
    runs.result,
    events.events,
    runners.runners,
    sessions.sessions,
    tasks.tasks,
    gc.gc,
    status.status,
    agents.agents,
    doctor.doctor,
    tokens.tokens,
    mcp.mcp,
    serverless.serverless_endpoint,
    actors.actors,
):
    cli.add_command(command)


def main() -> None:
    try:
        code = cli.main(standalone_mode=False)
    except CorralError as exc:
        click.echo(f"error: {exc.message} [{exc.code}]", err=True)
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
