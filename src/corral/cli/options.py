"""Shared click options: every flag also reads a CORRAL_* variable, shown in --help."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from corral.client import DEFAULT_URL, Client
from corral.client.coordinators import check_url

F = TypeVar("F", bound=Callable[..., Any])


def option(*names: str, env: str, **kwargs: Any) -> Callable[[F], F]:
    kwargs.setdefault("show_default", True)
    return click.option(*names, envvar=f"CORRAL_{env}", show_envvar=True, **kwargs)


class CoordinatorURL(click.ParamType[str, Any]):
    """An http(s) URL; ``127.0.0.1:8765`` alone is refused with the URL it probably means."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return check_url(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


URL = CoordinatorURL()


class CoordinatorURLs(click.ParamType[str, Any]):
    """One coordinator URL, or several separated by commas (each checked as ``URL``)."""

    name = "url[,url…]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        urls = [URL.convert(u, param, ctx) for u in str(value).split(",") if u.strip()]
        if not urls:
            self.fail("no coordinator URL given", param, ctx)
        return ",".join(urls)


URLS = CoordinatorURLs()


def coordinator_url(fn: F) -> F:
    """``--url`` (passed to the command) and ``--token`` (kept for ``connect``)."""
    return option(
        "--url",
        env="URL",
        type=URLS,
        default=DEFAULT_URL,
        help="The coordinator's URL; several, comma-separated: coordinators on one database, "
        "the next one used when one cannot be reached.",
    )(token_option(fn))


def json_option(fn: F) -> F:
    return option("--json", "as_json", env="JSON", is_flag=True, help="Print JSON.")(fn)


def limit_option(fn: F) -> F:
    return click.option(
        "--limit",
        default=20,
        show_default=True,
        type=click.IntRange(1, 500),
        help="At most this many, newest first.",
    )(fn)


def token_option(fn: F) -> F:
    return option(
        "--token",
        env="TOKEN",
        default=None,
        expose_value=False,
        callback=_keep_token,
        show_default=False,
        help="Bearer token for the coordinator (default: .corral/credentials here).",
    )(fn)


_TOKEN = "corral.token"


def _keep_token(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[_TOKEN] = value  # meta is shared with subcommands (``tasks …``)


def given_token() -> str | None:
    """``--token`` or ``CORRAL_TOKEN`` of the command being run, if any."""
    ctx = click.get_current_context(silent=True)
    token: str | None = ctx.meta.get(_TOKEN) if ctx is not None else None
    return token


def connect(url: str) -> Client:
    """A client of the coordinator at ``url`` (or of those, comma-separated) with the token
    the user gave (or the local ``.corral/credentials``)."""
    return Client(url, token=given_token())


def comma_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` → ``("a", "b", "c")``: a flag's comma-separated values."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def labels_from(values: Iterable[str]) -> tuple[str, ...]:
    """The one rule for labels, a run's (``--label``, repeatable) and a runner's
    (``--labels``): comma-separated, blanks dropped, each once, sorted."""
    return tuple(sorted({label for value in values for label in comma_list(value)}))
