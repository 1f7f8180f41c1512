"""``corral events``: the coordinator's event stream (``GET /events``) in a terminal.

Without ``-f`` it prints the kept events (after ``--after``) up to the newest and ends;
with ``-f`` it goes on printing them as they come. A coordinator restart, a broken
connection or a stream dropped for falling behind is followed by a resume after the last
event printed: nothing is printed twice, nothing is skipped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import click

from corral.cli.follow import EXIT_INTERRUPTED, RECONNECT_MAX_S
from corral.cli.options import connect, coordinator_url, json_option
from corral.client import Client
from corral.errors import Gone, Unavailable
from corral.events import EventKind


class EventReader:
    """The stream's events from ``after`` on, resumed after each interruption; with
    ``follow`` False it ends once the stored ones are read (``caught_up``)."""

    def __init__(
        self,
        client: Client,
        after: int | None,
        filters: dict[str, str | None],
        *,
        follow: bool,
    ) -> None:
        self.client = client
        self.after = after
        self.filters = filters
        self.follow = follow
        self.connected = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        delay = 0.2
        while True:
            try:
                for message in self.client.events(self.after, **self.filters):
                    self.connected, delay = True, 0.2
                    if message["event"] == "keepalive":
                        continue
                    self.after = message["id"]
                    if message["event"] == "caught_up" and not self.follow:
                        return
                    if message["event"] == "dropped":
                        break  # resume from its position at once
                    if message["event"] not in ("ready", "caught_up"):
                        yield message["data"]
                else:
                    self._pause("the coordinator closed the stream", delay)
            except Unavailable as exc:
                if not self.connected:  # never reached: a wrong URL, not a restart
                    raise
                self._pause(exc.message, delay)
                delay = min(delay * 2, RECONNECT_MAX_S)

    def _pause(self, why: str, delay: float) -> None:
        click.echo(f"{why}; resuming after event {self.after}", err=True)
        time.sleep(delay)


def describe(event: dict[str, Any]) -> str:
    """One line for people: time, kind, whose, what."""
    when = datetime.fromtimestamp(event["at"]).strftime("%H:%M:%S")
    data, kind = event["data"], EventKind(event["kind"])
    if kind is EventKind.LOG:
        return f"{when} log     {event['run_id']} {data['stream']}: {data['text']}"
    if kind is EventKind.RUN:
        where = f" on {event['runner_id']}" if event["runner_id"] else ""
        return f"{when} run     {event['run_id']} {data['status']}{where}"
    if kind is EventKind.RUNNER:
        return f"{when} runner  {event['runner_id']} ({data['name']}) {data['state']}"
    if kind is EventKind.SESSION:
        return f"{when} session {event['session_id']} ({data['name']}) runs {data['runs']}"
    if kind is EventKind.TASK:
        steps = data.get("steps") or []
        step = f" ({steps[-1]} done)" if steps and data["status"] == "in_progress" else ""
        return f"{when} task    {event['plan_id']}/{data['key']} {data['status']}{step}"
    if kind is EventKind.ACTOR:
        where = f" on {event['runner_id']}" if data["placed"] else ""
        return (
            f"{when} actor   {event['actor_id']} ({data['name']}) {data['state']} "
            f"gen {data['generation']}{where}"
        )
    if kind is EventKind.POOL:
        if "error" in data:
            return f"{when} pool    {event['pool']} error {data['error_kind']}: {data['error']}"
        desired = data["desired_runners"]
        wants = f" wants {desired} runners" if desired is not None else ""
        return f"{when} pool    {event['pool']}{wants}"
    return f"{when} plan    {event['plan_id']} {'paused' if data['paused'] else 'active'}"


@click.command()
@coordinator_url
@click.option("-f", "--follow", is_flag=True, help="Keep printing events as they come.")
@click.option("--kind", default=None, help="Comma-separated kinds: " + ", ".join(EventKind))
@click.option("--run", "run_id", default=None, help="Only this run's events.")
@click.option("--session", default=None, help="Only this session's (id or name).")
@click.option("--plan", default=None, help="Only this task plan's (its project id).")
@click.option("--runner", default=None, help="Only this runner's.")
@click.option("--actor", default=None, help="Only this actor's (its id).")
@click.option("--pool", default=None, help="Only this pool's (its actors' and its own).")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=None,
    help="Start after this event id (default: all kept events; with -f, from now).",
)
@json_option
def events(
    url: str,
    follow: bool,
    kind: str | None,
    run_id: str | None,
    session: str | None,
    plan: str | None,
    runner: str | None,
    actor: str | None,
    pool: str | None,
    after: int | None,
    as_json: bool,
) -> None:
    """Print the coordinator's events: runs, log lines, sessions, tasks, plans, runners,
    actors and pools."""
    filters = {
        "kind": kind,
        "run_id": run_id,
        "session": session,
        "plan": plan,
        "runner": runner,
        "actor": actor,
        "pool": pool,
    }
    start = after if after is not None or follow else 0
    with connect(url) as client:
        try:
            try:
                _print(EventReader(client, start, filters, follow=follow), as_json)
            except Gone as exc:
                if after is not None:
                    raise
                # All kept events: they begin after those retention deleted.
                start = int(exc.details["deleted_through"])
                _print(EventReader(client, start, filters, follow=follow), as_json)
        except KeyboardInterrupt:
            raise SystemExit(EXIT_INTERRUPTED) from None


def _print(reader: EventReader, as_json: bool) -> None:
    for event in reader:
        click.echo(json.dumps(event) if as_json else describe(event))
