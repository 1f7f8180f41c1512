"""``corral runs``, ``logs``, ``wait`` and ``result``: what happened to runs."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import click

from corral.cli.follow import Follower, line_printer
from corral.cli.options import connect, coordinator_url, json_option, limit_option
from corral.cli.output import current, local_time, money, print_json
from corral.cli.plan_progress import first_line
from corral.client import Client, LogLine, Run
from corral.errors import InvalidRequest, NotFound
from corral.runs import TERMINAL


@click.group()
def runs() -> None:
    """List, inspect, cancel and retry runs."""


@runs.command("list")
@coordinator_url
@click.option("--status", default=None, help="Only these statuses, comma-separated.")
@click.option("--session", default=None, help="Only the runs of this session (id or name).")
@limit_option
@json_option
def runs_list(url: str, status: str | None, session: str | None, limit: int, as_json: bool) -> None:
    """The newest runs first."""
    with connect(url) as client:
        page = client.list_runs(status=status, session=session, limit=limit)
    if as_json:
        print_json(page)
        return
    rows = [
        [
            run.run_id,
            run.type,
            run.status,
            run.runner_id or "",
            str(run.attempts),
            local_time(run.created_at),
            money(run.cost_usd),
            first_line(run.error),
        ]
        for run in page.runs
    ]
    headers = ["run", "type", "status", "runner", "attempts", "created", "cost", "error"]
    current().table(headers, rows)


@runs.command("get")
@coordinator_url
@json_option
@click.argument("run_id")
def runs_get(url: str, as_json: bool, run_id: str) -> None:
    """One run: what it is, where and how it ran, and how it ended."""
    with connect(url) as client:
        run = client.get_run(run_id)
    if as_json:
        print_json(run)
        return
    for name, value in describe(run):
        click.echo(f"{name + ':':<12}{value}")


def describe(run: Run) -> list[tuple[str, str]]:
    """The fields of a run worth reading, in reading order, the empty ones left out."""
    status: str = run.status
    if run.exit_code is not None and status != "completed":
        status += f" (exit {run.exit_code})"
    if run.cancel_requested and run.status not in TERMINAL:
        status += " (cancel requested)"
    fields = [
        ("run", run.run_id),
        ("type", run.type),
        ("status", status),
        ("command", shlex.join(run.command) if run.command else ""),
        ("session", run.session_name or run.session_id or ""),
        ("agent", run.agent_name or ""),
        ("prompt", first_line(run.prompt)),
        ("task", run.task_id or ""),
        ("labels", ", ".join(run.labels)),
        ("directory", run.project_dir or ""),
        ("runner", run.runner_id or ""),
        ("attempts", f"{run.attempts} of {run.max_attempts}"),
        ("created", local_time(run.created_at)),
        ("started", local_time(run.started_at)),
        ("finished", local_time(run.finished_at)),
        ("cost", money(run.cost_usd)),
        ("turns", str(run.num_turns) if run.num_turns is not None else ""),
        ("error", run.error or ""),
        ("result", first_line(run.result)),
    ]
    return [(name, value) for name, value in fields if value]


@runs.command("cancel")
@coordinator_url
@json_option
@click.argument("run_id")
def runs_cancel(url: str, as_json: bool, run_id: str) -> None:
    """Cancel a run (a running one is stopped: SIGTERM, then SIGKILL)."""
    with connect(url) as client:
        run = client.cancel_run(run_id)
    if as_json:
        print_json(run)
        return
    state = "cancel requested" if run.status not in TERMINAL else run.status
    click.echo(f"{run_id} {state}")


# What a retry copies from the run it retries.
_RETRIED = (
    "type",
    "command",
    "prompt",
    "agent_name",
    "project_dir",
    "labels",
    "priority",
    "timeout_s",
    "idle_timeout_s",
    "max_attempts",
)


@runs.command("retry")
@coordinator_url
@json_option
@click.argument("run_id")
def runs_retry(url: str, as_json: bool, run_id: str) -> None:
    """Run a finished run again, as a new run with the same spec; prints the new id."""
    with connect(url) as client:
        run = client.get_run(run_id)
        if run.status not in TERMINAL:
            raise InvalidRequest(f"{run_id} is {run.status}: only a finished run is retried")
        if run.type == "task":
            raise InvalidRequest(f"{run_id} is a task's run: retry it with `corral tasks retry`")
        spec = {key: getattr(run, key) for key in _RETRIED if getattr(run, key) not in (None, [])}
        if run.type == "resume_session":
            spec["session_id"] = run.session_id
        elif run.session_name:
            spec["session_name"] = run.session_name
        created = client.create_run(**spec)
    if as_json:
        print_json(created)
    else:
        click.echo(created.run_id)


@click.command()
@coordinator_url
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the run ends.")
@click.option(
    "--raw",
    is_flag=True,
    help="An agent run's output as the agent printed it (stream-json), not as a transcript.",
)
@json_option
@click.argument("run_id")
def logs(url: str, follow: bool, raw: bool, as_json: bool, run_id: str) -> None:
    """Print a run's output; an agent run's as a readable transcript.

    With -f, say why a pending run waits, reconnect across a coordinator restart, and
    exit with the run's status as `run --wait` does.
    """
    with connect(url) as client:
        run = client.get_run(run_id)
        show = line_printer(run.type, raw=raw, as_json=as_json, split_streams=False)
        if follow:
            follower = Follower(client, run_id, stream=True, split_streams=False, show=show)
            code = follower.report_end(follower.run())
            if code:
                raise SystemExit(code)
            return
        for item in _all_lines(client, run_id):
            show(item)


def _all_lines(client: Client, run_id: str) -> Iterator[LogLine]:
    after = 0
    while True:
        page = client.logs(run_id, after)
        yield from page.lines
        if not page.lines:
            return
        after = page.next_after


@click.command("wait")
@coordinator_url
@json_option
@click.argument("run_ids", nargs=-1, required=True)
def wait(url: str, as_json: bool, run_ids: tuple[str, ...]) -> None:
    """Wait until every RUN has ended, saying why one waits; exit 0 when all completed,
    else with the status of the first that did not (see `run --wait`)."""
    finished = []
    code = 0
    with connect(url) as client:
        for run_id in run_ids:
            follower = Follower(client, run_id, stream=False)
            run = follower.run()
            finished.append(run)
            status = follower.report_end(run)
            code = code or status
    if as_json:
        print_json(finished)
    if code:
        raise SystemExit(code)


@click.command()
@coordinator_url
@json_option
@click.argument("session")
def result(url: str, as_json: bool, session: str) -> None:
    """The latest result of SESSION (its id or name)."""
    with connect(url) as client:
        try:
            found = client.session_result(session)
        except NotFound:
            raise NotFound(_why_no_result(client, session), code="session_not_found") from None
    if as_json:
        print_json(found)
        return
    click.echo(found.result or "")
    if found.is_error:
        raise SystemExit(1)


def _why_no_result(client: Client, session: str) -> str:
    """A session is recorded once its agent has started: say what became of its runs."""
    runs = client.list_runs(session=session, limit=1).runs
    if not runs:
        return f"no session {session!r}: no run was ever started with that name or id"
    run = runs[0]
    status = run.status
    why = f": {first_line(run.error)}" if run.error else ""
    if status == "lost":  # its last attempt's runner is gone: it may still report it
        return f"session {session!r} has no result yet: its run {run.run_id} is lost{why}"
    if status not in TERMINAL:
        return f"session {session!r} has no result yet: its run {run.run_id} is {status}"
    return f"session {session!r} has no result: its run {run.run_id} {status}{why}"
