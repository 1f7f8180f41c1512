"""``corral tokens``: create, list and revoke the coordinator's bearer tokens (admin only)."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from corral.cli.options import comma_list, connect, coordinator_url
from corral.tokens import Role

console = Console()


@click.group()
def tokens() -> None:
    """Bearer tokens: who may call the coordinator, and as what (needs an admin token)."""


@tokens.command("create")
@coordinator_url
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    required=True,
    help="admin: everything; client: create and cancel work, read; reader: read; "
    "runner: the runner endpoints only.",
)
@click.option("--name", default="", help="What the token is for (shown by `tokens list`).")
@click.option(
    "--labels",
    default=None,
    help="A runner token: the only labels (comma-separated) its runners may have.",
)
def create(url: str, role: str, name: str, labels: str | None) -> None:
    """Create a token; prints it once (only its hash is kept)."""
    body = {"role": role, "name": name, "labels": None if labels is None else comma_list(labels)}
    with connect(url) as client:
        created = client.call("POST", "/tokens", json=body)
    click.echo(f"{created['token_id']} ({role}{f', {name}' if name else ''})", err=True)
    click.echo(created["token"])


@tokens.command("list")
@coordinator_url
@click.option("--json", "as_json", is_flag=True)
def list_tokens(url: str, as_json: bool) -> None:
    """Every token (never their secrets), revoked ones too."""
    with connect(url) as client:
        found = client.call("GET", "/tokens")["tokens"]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    table = Table("token", "name", "role", "labels", "created", "revoked")
    for t in found:
        labels = "" if t["labels"] is None else ",".join(t["labels"]) or "(none)"
        table.add_row(
            t["token_id"],
            t["name"],
            t["role"],
            labels,
            t["created_at"][:19],
            (t["revoked_at"] or "")[:19],
        )
    console.print(table)


@tokens.command("revoke")
@coordinator_url
@click.argument("token_id")
def revoke(url: str, token_id: str) -> None:
    """Refuse TOKEN_ID from now on; runners connected with it are disconnected."""
    with connect(url) as client:
        client.call("POST", f"/tokens/{token_id}/revoke")
    click.echo(f"{token_id} revoked")
