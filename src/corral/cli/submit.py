"""``corral start``, ``resume`` and ``run``: create a run, print its id, or follow it."""

from __future__ import annotations

import os
from typing import Any

import click

from corral.cli.follow import Follower, line_printer, no_match_warning
from corral.cli.options import connect, coordinator_url, labels_from, option
from corral.cli.output import print_json
from corral.client import Client, RunCreated
from corral.errors import Conflict, NotFound

# A first word that is one of corral's own commands is almost surely a typo of one.
_RUNS_SUBCOMMANDS = ("list", "get", "cancel", "retry")
_TOP_COMMANDS = (
    "status",
    "logs",
    "result",
    "runs",
    "runners",
    "sessions",
    "tasks",
    "wait",
    "doctor",
    "start",
    "resume",
    "up",
    "serve",
)


def _created(client: Client, created: RunCreated, wait: bool, as_json: bool) -> None:
    run_id = created.run_id
    if not wait:
        if as_json:
            print_json(created)
        else:
            click.echo(run_id)
        run = client.get_run(run_id)
        if warning := no_match_warning(client, run.labels):
            click.echo(f"warning: {warning}", err=True)
        return
    click.echo(f"{run_id} queued", err=True)  # first: the id is known whatever happens next
    show = line_printer(client.get_run(run_id).type)
    follower = Follower(client, run_id, stream=True, show=show)
    run = follower.run()
    code = follower.report_end(run)
    if as_json:
        print_json(run)
    elif run.result:
        click.echo(run.result)  # an agent's answer, last: `| tail -1` gets it
    if code:
        raise SystemExit(code)


def _run_options(fn: Any) -> Any:
    for decorate in reversed(
        [
            option(
                "--dir",
                "project_dir",
                env="DIR",
                default=None,
                help="Directory to run in, on the runner (default: the runner's own).",
            ),
            option(
                "--label",
                "labels",
                env="LABEL",
                multiple=True,
                help="Labels a runner must carry, comma-separated or repeated "
                "(--label gpu,linux or --label gpu --label linux).",
            ),
            option(
                "--timeout",
                "timeout_s",
                env="TIMEOUT",
                type=click.FloatRange(min=0, min_open=True),
                default=None,
                help="Seconds the run may take in all; then it is stopped (timed_out).",
            ),
            option(
                "--idle-timeout",
                "idle_timeout_s",
                env="IDLE_TIMEOUT",
                type=click.FloatRange(min=0, min_open=True),
                default=None,
                help="Seconds without output before it is stopped (timed_out).",
            ),
            option(
                "--priority",
                env="PRIORITY",
                type=int,
                default=0,
                help="Higher is claimed first; equal priorities in order of creation.",
            ),
            option(
                "--max-attempts",
                env="MAX_ATTEMPTS",
                type=click.IntRange(min=1),
                default=3,
                help="Attempts in all when a runner is lost while holding the run. A run "
                "that fails (non-zero exit, timeout) is not retried.",
            ),
            option(
                "--wait",
                env="WAIT",
                is_flag=True,
                help="Follow the run: print its id, why it waits, its output, and exit "
                "with the command's own status (124 timed out, 125 cancelled).",
            ),
            option(
                "--json",
                "as_json",
                env="JSON",
                is_flag=True,
                help="Print the created run as JSON (with --wait: the finished run).",
            ),
            coordinator_url,
        ]
    ):
        fn = decorate(fn)
    return fn


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in fields.items() if v not in (None, ())}
    if "labels" in fields:
        fields["labels"] = list(labels_from(fields["labels"]))
    if fields.get("project_dir"):
        fields["project_dir"] = os.path.abspath(fields["project_dir"])
    return fields


def _refuse_taken_name(client: Client, name: str) -> None:
    try:
        session = client.get_session(name)
    except NotFound:
        return
    raise Conflict(
        f"session {name!r} exists (last run {session.last_run_id}): continue it with "
        f"`corral resume {name} PROMPT`, or start another with the same name with --new",
        code="session_exists",
    )


@click.command()
@option("--session", "session_name", env="SESSION", default=None, help="A name for the session.")
@option(
    "--new",
    env="NEW",
    is_flag=True,
    help="Start a new session even if one has this name (the name then means the new one).",
)
@option("--agent", "agent_name", env="AGENT", default=None, help="Agent profile (default: claude).")
@_run_options
@click.argument("prompt")
def start(url: str, wait: bool, as_json: bool, new: bool, **fields: Any) -> None:
    """Start an agent session with PROMPT; prints the run id."""
    with connect(url) as client:
        if fields["session_name"] and not new:
            _refuse_taken_name(client, fields["session_name"])
        created = client.create_run("start_session", **_clean(fields))
        _created(client, created, wait, as_json)


@click.command()
@option(
    "--agent",
    "agent_name",
    env="AGENT",
    default=None,
    help="Agent profile (default: the session's).",
)
@_run_options
@click.argument("session")
@click.argument("prompt")
def resume(url: str, wait: bool, as_json: bool, session: str, **fields: Any) -> None:
    """Resume SESSION (its id or name) with PROMPT, on the runner that holds it."""
    fields.pop("project_dir", None)  # a resume runs where the session lives
    with connect(url) as client:
        created = client.create_run("resume_session", session_id=session, **_clean(fields))
        _created(client, created, wait, as_json)


class _CommandAfterDashes(click.Command):
    """``corral run -- CMD``: the command must follow ``--``, so that a typo of a corral
    command (``corral run list``) is refused instead of run on a runner."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        after = args[args.index("--") + 1 :] if "--" in args else None
        rest = super().parse_args(ctx, args)
        command = tuple(ctx.params.get("command") or ())
        if after is None or tuple(after) != command:
            raise click.UsageError(_dashes_message(command), ctx)
        return rest


def _dashes_message(command: tuple[str, ...]) -> str:
    hint = ""
    if command and command[0] in _RUNS_SUBCOMMANDS:
        hint = f"; did you mean `corral runs {command[0]}`?"
    elif command and command[0] in _TOP_COMMANDS:
        hint = f"; did you mean `corral {command[0]}`?"
    given = " ".join(command)
    return f"put the command after --: corral run [OPTIONS] -- {given or 'CMD ARGS…'}{hint}"


@click.command("run", cls=_CommandAfterDashes)
@_run_options
@click.argument("command", nargs=-1, required=True)
def run_command(
    url: str, wait: bool, as_json: bool, command: tuple[str, ...], **fields: Any
) -> None:
    """Run COMMAND (an argv, after --) on a runner; prints the run id.

    \b
    corral run -- make test
    corral run --wait --label gpu -- python train.py
    """
    with connect(url) as client:
        created = client.create_run("command", command=list(command), **_clean(fields))
        _created(client, created, wait, as_json)
