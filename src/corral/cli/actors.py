"""``corral actors``: create (get-or-create by name and key), list, show, wake, put to sleep
and destroy actors, and read their KV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from corral.actors.lifecycle import ActorState, CrashPolicy
from corral.cli.options import connect, coordinator_url, json_option
from corral.cli.output import current, local_time, print_json


@click.group()
def actors() -> None:
    """Actors: long-lived processes on runners that sleep when idle and wake on a request."""


def _row(actor: dict[str, Any]) -> tuple[str, ...]:
    return (
        actor["actor_id"],
        actor["name"],
        actor["key"] or "",
        actor["state"],
        str(actor["generation"]),
        actor["runner_id"] or "",
        local_time(actor["created_at"]),
    )


_HEADERS = ("actor", "name", "key", "state", "gen", "runner", "created")


def _show(actor: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(actor)
        return
    width = max(len(k) for k in actor)
    for field, value in actor.items():
        shown = local_time(value) if field.endswith("_at") else value
        click.echo(f"{field.ljust(width)}  {'' if shown is None else shown}")


@actors.command("create")
@coordinator_url
@click.argument("name")
@click.option("--key", default=None, help="One actor per name and key: an existing one is shown.")
@click.option("--input", "input_text", default=None, help="What its process reads.")
@click.option(
    "--input-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the input from this file.",
)
@click.option("--pool", default="default", show_default=True, help="The runners that host it.")
@click.option(
    "--crash-policy",
    type=click.Choice([p.value for p in CrashPolicy]),
    default=CrashPolicy.SLEEP.value,
    show_default=True,
    help="When it crashes or its runner is lost: start it again (with backoff), let it "
    "sleep until woken, or destroy it.",
)
@json_option
def create(
    url: str,
    name: str,
    key: str | None,
    input_text: str | None,
    input_file: Path | None,
    pool: str,
    crash_policy: str,
    as_json: bool,
) -> None:
    """Get or create the actor NAME (with --key); prints its id."""
    if input_file is not None:
        if input_text is not None:
            raise click.UsageError("--input and --input-file: give one")
        input_text = input_file.read_text()
    body = {"name": name, "key": key, "input": input_text, "pool": pool}
    body["crash_policy"] = crash_policy
    with connect(url) as client:
        actor = client.request("POST", "/actors", json=body)
    if as_json:
        print_json(actor)
        return
    made = "created" if actor["created"] else "found"
    click.echo(f"{made} ({actor['state']})", err=True)
    click.echo(actor["actor_id"])


@actors.command("list")
@coordinator_url
@click.option("--name", default=None, help="Only actors of this name.")
@click.option("--key", default=None, help="Only the actor with this key.")
@click.option("--pool", default=None, help="Only actors of this pool.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in ActorState]),
    help="Only actors in this state (repeatable).",
)
@click.option(
    "--limit", type=click.IntRange(1, 500), default=50, show_default=True, help="At most this many."
)
@json_option
def list_actors(
    url: str,
    name: str | None,
    key: str | None,
    pool: str | None,
    states: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    """Actors, newest first."""
    params: dict[str, Any] = {"name": name, "key": key, "pool": pool, "limit": limit}
    if states:
        params["state"] = ",".join(states)
    with connect(url) as client:
        page = client.request(
            "GET", "/actors", params={k: v for k, v in params.items() if v is not None}
        )
    if as_json:
        print_json(page)
        return
    current().table(_HEADERS, [_row(a) for a in page["actors"]])


@actors.command("get")
@coordinator_url
@click.argument("actor_id")
@json_option
def get(url: str, actor_id: str, as_json: bool) -> None:
    """One actor: its state, generation, runner and times."""
    with connect(url) as client:
        _show(client.request("GET", f"/actors/{actor_id}"), as_json)


def _change(verb: str, method: str, path: str, help_text: str) -> click.Command:
    @coordinator_url
    @click.argument("actor_id")
    @json_option
    def change(url: str, actor_id: str, as_json: bool) -> None:
        with connect(url) as client:
            actor = client.request(method, path.format(actor_id=actor_id))
        if as_json:
            print_json(actor)
        else:
            click.echo(f"{actor['actor_id']} {actor['state']}")

    change.__doc__ = help_text
    return actors.command(verb)(change)


_change("wake", "POST", "/actors/{actor_id}/wake", "Wake a sleeping actor (placed again).")
_change("sleep", "POST", "/actors/{actor_id}/sleep", "Put an actor to sleep (its process stops).")
_change("destroy", "DELETE", "/actors/{actor_id}", "Stop an actor for good and drop its KV.")


@actors.command("kv")
@coordinator_url
@click.argument("actor_id")
@click.option("--prefix", default="", help="Only keys that start with this.")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="At most this many.",
)
@json_option
def kv(url: str, actor_id: str, prefix: str, limit: int, as_json: bool) -> None:
    """An actor's KV entries (key, then value), in byte order of their keys."""
    with connect(url) as client:
        page = client.request(
            "GET", f"/actors/{actor_id}/kv", params={"prefix": prefix, "limit": limit}
        )
    if as_json:
        print_json(page)
        return
    for entry in page["entries"]:
        click.echo(f"{entry['key']}\t{entry['value']}")
