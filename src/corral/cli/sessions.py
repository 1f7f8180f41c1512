"""``corral sessions``: agent sessions, their runs, latest result and total cost."""

from __future__ import annotations

import click

from corral.cli.options import connect, coordinator_url, json_option, limit_option
from corral.cli.output import current, local_time, money, print_json
from corral.cli.plan_progress import first_line
from corral.client import Run


@click.group()
def sessions() -> None:
    """Agent sessions: started with `corral start`, continued with `corral resume`."""


@sessions.command("list")
@coordinator_url
@limit_option
@json_option
def sessions_list(url: str, limit: int, as_json: bool) -> None:
    """The most recently used sessions first."""
    with connect(url) as client:
        found = client.list_sessions(limit)
    if as_json:
        print_json(found)
        return
    rows = [
        [
            s.session_name or "",
            s.session_id,
            s.agent_name or "",
            str(s.runs),
            money(s.cost_usd),
            local_time(s.updated_at),
            ("error: " if s.is_error else "") + first_line(s.result),
        ]
        for s in found
    ]
    headers = ["name", "session", "agent", "runs", "cost", "updated", "latest result"]
    current().table(headers, rows)


@sessions.command("show")
@coordinator_url
@json_option
@click.argument("session")
def sessions_show(url: str, as_json: bool, session: str) -> None:
    """SESSION (its id or name): where it lives, its latest result, total cost, its runs."""
    with connect(url) as client:
        found = client.get_session(session)
        runs = client.list_runs(session=found.session_id, limit=500).runs
    if as_json:
        print_json({**found.to_json(), "run_list": runs})
        return
    fields = [
        ("session", found.session_id),
        ("name", found.session_name or ""),
        ("agent", found.agent_name or ""),
        ("runner", found.runner_id or ""),
        ("directory", found.project_dir or ""),
        ("runs", str(found.runs)),
        ("total cost", money(found.cost_usd)),
        ("updated", local_time(found.updated_at)),
        ("result", ("error: " if found.is_error else "") + first_line(found.result)),
    ]
    for name, value in fields:
        if value:
            click.echo(f"{name + ':':<12}{value}")
    click.echo("")
    current().table(
        ["run", "type", "status", "created", "cost", "prompt"],
        [_run_row(run) for run in reversed(runs)],  # oldest first: the conversation's order
    )


def _run_row(run: Run) -> list[str]:
    return [
        run.run_id,
        run.type,
        run.status,
        local_time(run.created_at),
        money(run.cost_usd),
        first_line(run.prompt)[:80],
    ]
