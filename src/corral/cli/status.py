"""``corral status``: one screen — the coordinator, its runners, runs by state, recent
failures and what today cost."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from corral.cli.options import connect, coordinator_url, json_option
from corral.cli.output import current, local_time, money, print_json
from corral.cli.plan_progress import first_line
from corral.client import Client, Run, Runner, Stats

STATE_ORDER = (
    *("pending", "claimed", "running", "lost"),  # lost: waiting for its runner's late report
    *("completed", "failed", "timed_out", "cancelled"),
)
RECENT_FAILURES = 5
PAGE = 500


@click.command()
@coordinator_url
@json_option
def status(url: str, as_json: bool) -> None:
    """The coordinator, runners (slots, labels), runs by state, recent failures, cost today."""
    with connect(url) as client:
        found = gather(client)
    if as_json:
        print_json(found)
        return
    out = current()
    stats: Stats = found["stats"]
    runners: list[Runner] = found["runners"]
    failures: list[Run] = found["recent_failures"]
    click.echo(f"coordinator  {client.url}  (corral {stats.version})")
    live = [r for r in runners if r.state in ("active", "draining")]
    used = sum(r.slots_used for r in live)
    total = sum(r.slots_total for r in live)
    click.echo(f"runners      {len(live)} live, {used}/{total} slots in use")
    if live:
        out.table(
            ["runner", "name", "state", "slots", "labels"],
            [
                [
                    r.runner_id,
                    r.name,
                    r.state,
                    f"{r.slots_used}/{r.slots_total}",
                    ",".join(r.labels),
                ]
                for r in live
            ],
        )
    counts = stats.runs
    by_state = "  ".join(f"{s} {counts[s]}" for s in STATE_ORDER if counts.get(s))
    click.echo(f"runs         {by_state or 'none yet'}")
    click.echo(f"cost today   {money(found['cost_today_usd'])}")
    if failures:
        click.echo("recent failures")
        out.table(
            ["run", "status", "finished", "error"],
            [
                [r.run_id, r.status, local_time(r.finished_at), first_line(r.error)]
                for r in failures
            ],
        )


def gather(client: Client) -> dict[str, Any]:
    stats = client.stats()  # first: of several coordinators, the URL is the one answering
    return {
        "url": client.url,
        "stats": stats,
        "runners": client.list_runners(),
        "recent_failures": client.list_runs(
            status=["failed", "timed_out"], limit=RECENT_FAILURES
        ).runs,
        "cost_today_usd": cost_today(client),
    }


def cost_today(client: Client) -> float:
    """What the runs created since local midnight cost (newest first: stop at yesterday)."""
    midnight = datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
    total = 0.0
    before = None
    while True:
        page = client.list_runs(limit=PAGE, before=before)
        for run in page.runs:
            if run.created_at is None or run.created_at < midnight:
                return total
            total += run.cost_usd or 0.0
        before = page.next
        if before is None:
            return total
