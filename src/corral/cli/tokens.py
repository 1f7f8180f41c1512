"""``corral tokens``: create, list and revoke the coordinator's bearer tokens (admin only)."""

from __future__ import annotations

import click

from corral.cli.options import comma_list, connect, coordinator_url, json_option
from corral.cli.output import current, local_time, print_json
from corral.tokens import Role


@click.group()
def tokens() -> None:
    """Bearer tokens: who may call the coordinator, and as what (needs an admin token)."""


@tokens.command("create")
@coordinator_url
@click.option(
    "--role",
    # Agent tokens are minted for a run by its runner (corral.coordinator.scope).
    type=click.Choice([r.value for r in Role if r is not Role.AGENT]),
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
    labelled = None if labels is None else comma_list(labels)
    with connect(url) as client:
        created = client.create_token(role, name=name, labels=labelled)
    click.echo(f"{created.token_id} ({role}{f', {name}' if name else ''})", err=True)
    click.echo(created.token)


@tokens.command("list")
@coordinator_url
@json_option
def list_tokens(url: str, as_json: bool) -> None:
    """Every token (never their secrets), revoked ones too."""
    with connect(url) as client:
        found = client.list_tokens()
    if as_json:
        print_json(found)
        return
    rows = [
        (
            t.token_id,
            t.name,
            t.role,
            "" if t.labels is None else ",".join(t.labels) or "(none)",
            local_time(t.created_at),
            local_time(t.revoked_at),
        )
        for t in found
    ]
    current().table(("token", "name", "role", "labels", "created", "revoked"), rows)


@tokens.command("revoke")
@coordinator_url
@click.argument("token_id")
def revoke(url: str, token_id: str) -> None:
    """Refuse TOKEN_ID from now on; runners connected with it are disconnected."""
    with connect(url) as client:
        client.revoke_token(token_id)
    click.echo(f"{token_id} revoked")
