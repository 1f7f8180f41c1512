"""``corral runners``: the runners a coordinator knows, and draining or stopping one."""

from __future__ import annotations

import click

from corral.cli.options import connect, coordinator_url, json_option
from corral.cli.output import current, local_time, print_json
from corral.client import Client
from corral.errors import InvalidRequest, NotFound

LIVE = ("active", "draining")


@click.group()
def runners() -> None:
    """The runners known to the coordinator."""


@runners.command("list")
@coordinator_url
@json_option
def runners_list(url: str, as_json: bool) -> None:
    """Every runner: state, transport, slots in use, labels, last heartbeat."""
    with connect(url) as client:
        found = client.list_runners()
    if as_json:
        print_json(found)
        return
    rows = [
        [
            r.runner_id,
            r.name,
            r.state,
            r.transport,
            f"{r.slots_used}/{r.slots_total}",
            ",".join(r.labels),
            r.version,
            local_time(r.last_heartbeat_at),
        ]
        for r in found
    ]
    headers = ["runner", "name", "state", "transport", "slots", "labels", "version", "heartbeat"]
    current().table(headers, rows)


def resolve_runner(client: Client, key: str) -> str:
    """A runner id from an id or a name; a name means its live runner (or its newest)."""
    found = client.list_runners()
    if any(r.runner_id == key for r in found):
        return key
    named = [r for r in found if r.name == key]
    live = [r for r in named if r.state in LIVE]
    if len(live) > 1:
        ids = ", ".join(r.runner_id for r in live)
        raise InvalidRequest(f"{len(live)} live runners are named {key!r} ({ids}): give an id")
    if live:
        return live[0].runner_id
    if named:
        newest = max(named, key=lambda r: r.registered_at.timestamp() if r.registered_at else 0.0)
        return newest.runner_id
    raise NotFound(f"no runner has the id or name {key!r}", code="runner_not_found")


def _act(url: str, key: str, grace_s: float | None, as_json: bool) -> None:
    """Drain the runner (``grace_s`` given), or stop it."""
    with connect(url) as client:
        runner_id = resolve_runner(client, key)
        if grace_s is None:
            runner = client.stop_runner(runner_id)
        else:
            runner = client.drain_runner(runner_id, grace_s)
    if as_json:
        print_json(runner)
    else:
        click.echo(f"{runner_id} {runner.state}")


@runners.command("drain")
@coordinator_url
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds its running work may go on.",
)
@json_option
@click.argument("runner")
def runners_drain(url: str, grace_s: float, as_json: bool, runner: str) -> None:
    """Take no new work on RUNNER (id or name); it finishes what it has and leaves."""
    _act(url, runner, grace_s, as_json)


@runners.command("stop")
@coordinator_url
@json_option
@click.argument("runner")
def runners_stop(url: str, as_json: bool, runner: str) -> None:
    """Stop RUNNER (id or name) now; its runs go back to pending for other runners."""
    _act(url, runner, None, as_json)
