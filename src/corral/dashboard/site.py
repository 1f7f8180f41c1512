"""Serving the dashboard: its page at ``/`` and its modules under ``/ui/``, without a token.

They hold no data: every call the page makes to the API carries the token the operator
gave it (``corral up`` prints a URL with it in the fragment, which no request carries).
The page may only load its own scripts and talk to its own origin (the CSP below), so a
script injected through a run's output could not send the token anywhere else.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles

PAGE_PATH = "/"
ASSETS_PREFIX = "/ui"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_STATIC = files("corral.dashboard") / "static"


def mount(app: FastAPI) -> None:
    """Add the dashboard's page and assets to ``app`` (outside the API and its OpenAPI)."""
    app.add_route(PAGE_PATH, _page, methods=["GET"], include_in_schema=False)
    app.mount(ASSETS_PREFIX, _Assets(directory=str(_STATIC)), name="dashboard")


def address(url: str, token: str | None, page: str = "") -> str:
    """The dashboard's address to print, opening ``page`` (``/plans/ID``). With ``token`` in
    its fragment the page signs in with it: browsers send no fragment, so it reaches no
    server and no access log."""
    root = f"{url.rstrip('/')}/"
    if token:
        return f"{root}#{urlencode({'token': token, 'page': page} if page else {'token': token})}"
    return f"{root}#{page}" if page else root


async def _page(request: Request) -> Response:
    return HTMLResponse((_STATIC / "index.html").read_text(), headers=SECURITY_HEADERS)


class _Assets(StaticFiles):
    """The modules and styles, revalidated on every load (a new corral's files show at once)."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(SECURITY_HEADERS)
        return response
