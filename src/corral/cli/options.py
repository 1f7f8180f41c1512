"""Shared click options: every flag also reads a CORRAL_* variable, shown in --help."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from corral.client import DEFAULT_URL

F = TypeVar("F", bound=Callable[..., Any])


def option(*names: str, env: str, **kwargs: Any) -> Callable[[F], F]:
    return click.option(
        *names, envvar=f"CORRAL_{env}", show_envvar=True, show_default=True, **kwargs
    )


def coordinator_url(fn: F) -> F:
    return option("--url", env="URL", default=DEFAULT_URL, help="Coordinator URL.")(fn)


def comma_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` → ``("a", "b", "c")``: a flag's comma-separated values."""
    return tuple(x.strip() for x in text.split(",") if x.strip())
