"""``corral agents list``: the agent profiles the coordinator has loaded."""

from __future__ import annotations

import click

from corral.cli.options import connect, coordinator_url, json_option
from corral.cli.output import current, money, print_json


@click.group()
def agents() -> None:
    """Agent profiles: `[agents.NAME]` in the coordinator's corral.toml (SIGHUP reloads it)."""


@agents.command("list")
@coordinator_url
@json_option
def agents_list(url: str, as_json: bool) -> None:
    """The profiles loaded now; after editing corral.toml, `kill -HUP` the coordinator."""
    with connect(url) as client:
        found = client.agent_profiles()
    if as_json:
        print_json(found)
        return
    rows = [
        [
            a.name,
            a.executor,
            a.model or "",
            ",".join(a.allowed_tools),
            "" if a.max_turns is None else str(a.max_turns),
            money(a.budget_usd),
        ]
        for a in found.agents
    ]
    current().table(["agent", "executor", "model", "tools", "max turns", "budget"], rows)
    click.echo(f"from {found.config or 'the built-in profile only'}", err=True)
