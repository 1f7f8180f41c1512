"""Client commands: start and resume sessions, run commands, inspect runs, logs, results."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from corral.cli.options import coordinator_url
from corral.client import CorralClient

TERMINAL = {"completed", "failed", "cancelled", "timed_out"}
console = Console(width=160) if not sys.stdout.isatty() else Console()


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def _created(client: CorralClient, created: dict[str, Any], wait: bool) -> None:
    run_id = created["run_id"]
    if not wait:
        click.echo(run_id)
        return
    for item in client.follow_logs(run_id):
        if item["event"] == "line":
            stream = sys.stderr if item["stream"] == "stderr" else sys.stdout
            print(item["text"], file=stream, flush=True)
        else:
            run = item["run"]
            click.echo(f"{run_id} {run['status']}", err=True)
            if run.get("result"):
                click.echo(run["result"])
            if run["status"] != "completed":
                raise SystemExit(1)


def _run_options(fn: Any) -> Any:
    for decorate in reversed(
        [
            click.option(
                "--dir",
                "project_dir",
                default=None,
                help="Directory to run in (default: the runner's).",
            ),
            click.option("--label", "labels", multiple=True, help="Required runner label."),
            click.option("--timeout", "timeout_s", type=float, default=None, help="Seconds."),
            click.option(
                "--idle-timeout",
                "idle_timeout_s",
                type=float,
                default=None,
                help="Stop after this many seconds without output.",
            ),
            click.option("--priority", type=int, default=0, show_default=True),
            click.option("--max-attempts", type=int, default=3, show_default=True),
            click.option("--wait", is_flag=True, help="Stream the logs and wait for the end."),
            coordinator_url,
        ]
    ):
        fn = decorate(fn)
    return fn


@click.command()
@click.option("--session", "session_name", default=None, help="A name for the session.")
@click.option("--agent", "agent_name", default=None, help="Agent profile (default: claude).")
@_run_options
@click.argument("prompt")
def start(url: str, wait: bool, **fields: Any) -> None:
    """Start an agent session with PROMPT; prints the run id."""
    with CorralClient(url) as client:
        _created(client, client.create_run(type="start_session", **_clean(fields)), wait)


@click.command()
@click.option("--agent", "agent_name", default=None, help="Agent profile (default: the session's).")
@_run_options
@click.argument("session")
@click.argument("prompt")
def resume(url: str, wait: bool, session: str, **fields: Any) -> None:
    """Resume SESSION (its id or name) with PROMPT, on the runner that holds it."""
    fields.pop("project_dir", None)  # a resume runs where the session lives
    with CorralClient(url) as client:
        created = client.create_run(type="resume_session", session_id=session, **_clean(fields))
        _created(client, created, wait)


@click.command("run")
@_run_options
@click.argument("command", nargs=-1, required=True)
def run_command(url: str, wait: bool, command: tuple[str, ...], **fields: Any) -> None:
    """Run COMMAND (an argv: put it after --) on a runner; prints the run id."""
    with CorralClient(url) as client:
        created = client.create_run(type="command", command=list(command), **_clean(fields))
        _created(client, created, wait)


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in fields.items() if v not in (None, ())}
    if "labels" in fields:
        fields["labels"] = list(fields["labels"])
    if fields.get("project_dir"):
        fields["project_dir"] = os.path.abspath(fields["project_dir"])
    return fields


@click.group()
def runs() -> None:
    """List, inspect and cancel runs."""


@runs.command("list")
@coordinator_url
@click.option("--status", default=None, help="Comma-separated statuses.")
@click.option("--session", default=None, help="Session id or name.")
@click.option("--limit", default=20, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True)
def runs_list(url: str, status: str | None, session: str | None, limit: int, as_json: bool) -> None:
    """The newest runs first."""
    with CorralClient(url) as client:
        page = client.list_runs(status=status, session=session, limit=limit)
    if as_json:
        _print_json(page)
        return
    table = Table("run", "type", "status", "runner", "attempts", "created", "error")
    for run in page["runs"]:
        table.add_row(
            run["run_id"],
            run["type"],
            _status(run["status"]),
            run["runner_id"] or "",
            str(run["attempts"]),
            run["created_at"][:19],
            (run["error"] or "")[:60],
        )
    console.print(table)


def _status(status: str) -> str:
    color = {
        "completed": "green",
        "failed": "red",
        "timed_out": "red",
        "running": "cyan",
        "cancelled": "yellow",
    }.get(status)
    return f"[{color}]{status}[/]" if color else status


@runs.command("get")
@coordinator_url
@click.argument("run_id")
def runs_get(url: str, run_id: str) -> None:
    """One run, as JSON."""
    with CorralClient(url) as client:
        _print_json(client.get_run(run_id))


@runs.command("cancel")
@coordinator_url
@click.argument("run_id")
def runs_cancel(url: str, run_id: str) -> None:
    """Cancel a run (a running one is stopped: SIGTERM, then SIGKILL)."""
    with CorralClient(url) as client:
        run = client.cancel_run(run_id)
    state = "cancel requested" if run["status"] not in TERMINAL else run["status"]
    click.echo(f"{run_id} {state}")


@click.command()
@coordinator_url
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the run ends.")
@click.argument("run_id")
def logs(url: str, follow: bool, run_id: str) -> None:
    """Print a run's output."""
    with CorralClient(url) as client:
        if follow:
            for item in client.follow_logs(run_id):
                if item["event"] == "line":
                    print(item["text"], flush=True)
                else:
                    click.echo(f"-- {run_id} {item['run']['status']}", err=True)
            return
        after = 0
        while True:
            page = client.logs(run_id, after)
            for line in page["lines"]:
                print(line["text"])
            if not page["lines"]:
                return
            after = page["next_after"]


@click.command()
@coordinator_url
@click.option("--json", "as_json", is_flag=True)
@click.argument("session")
def result(url: str, as_json: bool, session: str) -> None:
    """The latest result of SESSION (its id or name)."""
    with CorralClient(url) as client:
        found = client.session_result(session)
    if as_json:
        _print_json(found)
        return
    click.echo(found["result"] or "")
    if found["is_error"]:
        raise SystemExit(1)


@click.group()
def runners() -> None:
    """The runners known to the coordinator."""


@runners.command("list")
@coordinator_url
@click.option("--json", "as_json", is_flag=True)
def runners_list(url: str, as_json: bool) -> None:
    with CorralClient(url) as client:
        found = client.runners()
    if as_json:
        _print_json(found)
        return
    table = Table("runner", "name", "state", "transport", "slots", "version", "last heartbeat")
    for r in found:
        table.add_row(
            r["runner_id"],
            r["name"],
            r["state"],
            r["transport"],
            f"{r['slots_used']}/{r['slots_total']}",
            r["version"],
            (r["last_heartbeat_at"] or "")[:19],
        )
    console.print(table)


@runners.command("drain")
@coordinator_url
@click.option(
    "--grace",
    "grace_s",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds its running work may go on.",
)
@click.argument("runner_id")
def runners_drain(url: str, grace_s: float, runner_id: str) -> None:
    """Take no new work on RUNNER_ID; it finishes what it has and leaves."""
    with CorralClient(url) as client:
        runner = client.call("POST", f"/runners/{runner_id}/drain", json={"grace_s": grace_s})
    click.echo(f"{runner_id} {runner['state']}")


@runners.command("stop")
@coordinator_url
@click.argument("runner_id")
def runners_stop(url: str, runner_id: str) -> None:
    """Stop RUNNER_ID now; its runs go back to pending for other runners."""
    with CorralClient(url) as client:
        runner = client.call("POST", f"/runners/{runner_id}/stop")
    click.echo(f"{runner_id} {runner['state']}")
