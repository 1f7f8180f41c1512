"""How the CLI prints: tables and colour on a terminal, plain aligned text when piped.

Piped output (CI logs, ``| grep``, ``| tee``) has no box drawing, no colour and no
width limit, so that lines stay whole for tools. ``--no-color`` and ``NO_COLOR``
(https://no-color.org) turn colour off on a terminal too. Money and times are shown the
way people read them: ``$0.0375``, and local time with its zone.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from corral.client.models import Model

_STATUS_COLORS = {
    "completed": "green",
    "failed": "red",
    "timed_out": "red",
    "lost": "red",
    "running": "cyan",
    "claimed": "cyan",
    "active": "green",
    "draining": "yellow",
    "cancelled": "yellow",
}


class Output:
    """One command's printing; plain when stdout is not a terminal."""

    def __init__(self, *, no_color: bool = False) -> None:
        self.terminal = sys.stdout.isatty()
        self.color = self.terminal and not no_color and not os.environ.get("NO_COLOR")
        self.console = Console(
            highlight=False,  # rich's highlighter colours stray numbers and words
            color_system="auto" if self.color else None,  # None: no escape codes at all
            soft_wrap=not self.terminal,
            width=None if self.terminal else 10_000,
        )

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if not self.terminal:
            click.echo(plain_table(headers, rows), nl=False)
            return
        table = Table(*headers)
        for row in rows:
            table.add_row(
                *(self.styled(cell, header) for cell, header in zip(row, headers, strict=True))
            )
        self.console.print(table)

    def styled(self, cell: str, header: str) -> str:
        """A status or state cell in its colour (rich markup is escaped everywhere else)."""
        color = _STATUS_COLORS.get(cell) if header in ("status", "state") else None
        escaped = cell.replace("[", r"\[")
        return f"[{color}]{escaped}[/]" if color and self.color else escaped


def current() -> Output:
    """The output of the command being run (``--no-color`` is the group's flag)."""
    ctx = click.get_current_context(silent=True)
    no_color = bool(ctx and ctx.find_root().meta.get("corral.no_color"))
    return Output(no_color=no_color)


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned with two spaces, no borders, nothing cut: what greps and awk read."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = []
    for row in [list(headers), *rows]:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def print_json(data: Any) -> None:
    """JSON as the API answers it (the client's models printed as their JSON)."""
    click.echo(json.dumps(plain(data), indent=2))


def plain(data: Any) -> Any:
    if isinstance(data, Model):
        return data.to_json()
    if isinstance(data, list | tuple):
        return [plain(item) for item in data]
    if isinstance(data, dict):
        return {key: plain(value) for key, value in data.items()}
    return data


def money(usd: float | None) -> str:
    """``$0.0375``: four decimals below a dollar (agent costs are cents), two above
    (and for nothing at all)."""
    if usd is None:
        return ""
    if usd == 0:
        return "$0.00"
    if abs(usd) >= 1:
        return f"${usd:,.2f}"
    return f"${usd:.4f}"


def local_time(when: datetime | str | None) -> str:
    """An API time (ISO 8601, UTC) in local time with its zone: ``2026-11-26 06:01:02 CET``."""
    if not when:
        return ""
    stamp = (datetime.fromisoformat(when) if isinstance(when, str) else when).astimezone()
    return stamp.strftime("%Y-%m-%d %H:%M:%S %Z")
