"""Who may call the coordinator: bearer tokens, roles, and the Host and Origin checks.

Every request passes ``Guard`` (pure ASGI, HTTP and WebSocket alike) before routing:

    Host     must be an allowed name (loopback names, the bound address, --allowed-hosts):
             a web page on a rebound DNS name cannot reach the API through the browser
    Origin   if a browser sent one, it must be the coordinator's own (a page the operator
             visits cannot open a runner socket or call the API)
    token    ``Authorization: Bearer <token>`` on everything but ``PUBLIC_PATHS``: the
             admin token of the settings, or a live token of the store

Then each route states what it needs (``require(Access.…)``, a dependency), and a role
grants it or not (``GRANTS``). A route that states nothing is refused by the test that
walks every route (tests/integration/test_auth.py), so a new one cannot be forgotten.
"""

from __future__ import annotations

import enum
import hmac
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, params
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import WebSocketException
from starlette.requests import HTTPConnection
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.errors import CorralError, Forbidden, Unauthorized
from corral.store.tokens import TokenStore
from corral.tokens import Role, digest

ADMIN_TOKEN_ID = "tok_admin"  # the settings' admin token: the owner of runners it registers
PUBLIC_PATHS = frozenset(
    # /oauth/token: the seed system's runner trades a token for itself there (compat_ao).
    {"/health", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc", "/oauth/token", "/"}
)
# The dashboard's page (``/``) and its modules hold no data; the calls they make carry a token.
PUBLIC_PREFIXES = ("/ui/",)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
CLOSE_POLICY_VIOLATION = 1008


class Access(enum.Enum):
    READ = "read"  # runs, logs, sessions, runners, tasks: look, touch nothing
    RUNS = "runs"  # create and cancel runs (an agent token: its own session's children)
    WRITE = "write"  # sessions, tasks, projects, actors, pools
    RUNNER = "runner"  # the runner link and the runner HTTP protocol
    ADMIN = "admin"  # tokens; drain and stop runners


GRANTS: dict[Access, frozenset[Role]] = {
    Access.READ: frozenset({Role.ADMIN, Role.CLIENT, Role.READER, Role.AGENT}),
    Access.RUNS: frozenset({Role.ADMIN, Role.CLIENT, Role.AGENT}),
    Access.WRITE: frozenset({Role.ADMIN, Role.CLIENT}),
    Access.RUNNER: frozenset({Role.ADMIN, Role.RUNNER}),
    Access.ADMIN: frozenset({Role.ADMIN}),
}


@dataclass(frozen=True)
class Principal:
    """The caller, as its token says."""

    token_id: str
    role: Role
    labels: tuple[str, ...] | None = None  # a runner token limited to these labels
    run_id: str | None = None  # an agent token: the run of the agent (corral.coordinator.scope)

    def check_labels(self, labels: Sequence[str]) -> None:
        if self.labels is not None and not set(labels) <= set(self.labels):
            raise Forbidden(
                f"this token's runners may only have the labels {sorted(self.labels)}",
                code="labels_not_allowed",
            )


class Authenticator:
    """Tokens to principals. A store token found is remembered ``cache_s`` seconds (a
    revoke takes effect within that time in other coordinator processes; at once here)."""

    def __init__(
        self,
        tokens: TokenStore,
        admin_token: str | None,
        *,
        cache_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.tokens = tokens
        self._now = now  # wall-clock time, as the store's expiries are written
        self._admin_digest = digest(admin_token).encode() if admin_token else None
        self._cache_s = cache_s
        self._clock = clock
        self._cache: dict[str, tuple[Principal, float]] = {}

    def admin(self, secret: str) -> Principal | None:
        """The settings' admin token, compared in constant time (digests: equal lengths)."""
        if self._admin_digest is None:
            return None
        if hmac.compare_digest(digest(secret).encode(), self._admin_digest):
            return Principal(ADMIN_TOKEN_ID, Role.ADMIN)
        return None

    def cached(self, secret: str) -> Principal | None:
        found = self._cache.get(digest(secret))
        if found is None or found[1] < self._clock():
            return None
        return found[0]

    def lookup(self, secret: str) -> Principal | None:
        """The store's live token with this secret (reads the store: off the event loop)."""
        key = digest(secret)
        token = self.tokens.find(key, self._now())
        if token is None:
            self._cache.pop(key, None)
            return None
        principal = Principal(token.id, token.role, token.labels, token.run_id)
        self._cache[key] = (principal, self._clock() + self._cache_s)
        return principal

    def forget(self, token_id: str) -> None:
        """A token was revoked: stop accepting it in this process at once."""
        for key in [k for k, (p, _) in self._cache.items() if p.token_id == token_id]:
            del self._cache[key]


# ---- routes state what they need ------------------------------------------------------


def _requirement(access: Access) -> Callable[[HTTPConnection], Awaitable[Principal]]:
    # async: FastAPI runs a plain function dependency on a worker thread, a hop per request
    # (in the gateway's warm path it cost more than the check itself).
    async def requirement(conn: HTTPConnection) -> Principal:
        principal = principal_of(conn)
        if principal.role not in GRANTS[access] and conn.scope["type"] == "websocket":
            # Closed before it is accepted: the client sees HTTP 403.
            raise WebSocketException(CLOSE_POLICY_VIOLATION, "forbidden")
        check(principal, access)
        return principal

    requirement.__name__ = f"require_{access.value}"
    return requirement


_REQUIREMENTS = {access: _requirement(access) for access in Access}


def require(access: Access) -> Any:
    """A route's dependency: the caller's principal, if its role grants ``access``."""
    return params.Depends(_REQUIREMENTS[access])


def check(principal: Principal, access: Access) -> None:
    """``forbidden`` unless the principal's role grants ``access``."""
    if principal.role not in GRANTS[access]:
        raise Forbidden(f"a {principal.role} token cannot do this ({access.value} access)")


def route_access(route: BaseRoute) -> set[Access]:
    """What a route requires (by its dependencies): for the test that walks every route."""
    dependant = getattr(route, "dependant", None)
    calls = {d.call for d in dependant.dependencies} if dependant is not None else set()
    return {access for access, call in _REQUIREMENTS.items() if call in calls}


def principal_of(conn: HTTPConnection) -> Principal:
    principal: Principal = conn.state.principal  # set by Guard before routing
    return principal


# ---- the guard at the door ------------------------------------------------------------


class Guard:
    """Host, Origin and token checks for every HTTP request and WebSocket upgrade."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.any_host = "*" in self.allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            principal = await self._admit(scope)
        except CorralError as exc:
            await _refuse(exc, scope, receive, send)
            return
        if principal is not None:
            scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _admit(self, scope: Scope) -> Principal | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if not self.any_host and host_name(host) not in self.allowed_hosts:
            raise Forbidden(
                f"Host {host[:100]!r} is not an allowed name of this coordinator "
                "(--allowed-hosts, CORRAL_ALLOWED_HOSTS)",
                code="host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and origin_netloc(origin) != host.lower():
            raise Forbidden(
                "requests from a web page of another origin are refused",
                code="origin_not_allowed",
            )
        if scope["path"] in PUBLIC_PATHS or scope["path"].startswith(PUBLIC_PREFIXES):
            return None
        secret = bearer(headers.get("authorization"))
        if secret is None:
            raise Unauthorized(
                "this coordinator needs a token: 'Authorization: Bearer <token>' (the CLI "
                "and runners send CORRAL_TOKEN, --token, or .corral/credentials)"
            )
        authenticator: Authenticator = scope["app"].state.coordinator.auth
        principal = authenticator.admin(secret) or authenticator.cached(secret)
        if principal is None:
            principal = await anyio.to_thread.run_sync(authenticator.lookup, secret)
        if principal is None:
            raise Unauthorized("unknown or revoked token", code="invalid_token")
        return principal


def bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, secret = value.strip().partition(" ")
    secret = secret.strip()
    return secret if scheme.lower() == "bearer" and secret else None


def host_name(host: str) -> str:
    """A Host header without its port: ``[::1]:8765`` → ``::1``, ``Example:80`` → ``example``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def origin_netloc(origin: str) -> str:
    """``https://host:port`` → ``host:port`` (``null`` and the like: '')."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return rest.rstrip("/") if sep and scheme in ("http", "https") else ""


def allowed_hosts(bound: str, extra: Sequence[str]) -> list[str]:
    """Loopback names, the address the coordinator is bound to, and ``extra``."""
    names = [*LOOPBACK_HOSTS, *extra]
    if bound not in ("0.0.0.0", "::", ""):
        names.append(host_name(bound) if bound.startswith("[") else bound)
    return names


async def _refuse(exc: CorralError, scope: Scope, receive: Receive, send: Send) -> None:
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    response = JSONResponse(exc.to_dict(), status_code=exc.http_status, headers=headers)
    if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
        await response(scope, receive, send)  # an upgrade refused with an HTTP answer
        return
    # A server without the denial extension answers a close before accept with 403.
    await send({"type": "websocket.close", "code": CLOSE_POLICY_VIOLATION, "reason": exc.code})


_REFUSALS = {
    "401": "no token, or an unknown or revoked one (unauthorized, invalid_token)",
    "403": "a token whose role may not, a runner of another token, a Host or Origin "
    "not allowed (forbidden, runner_not_yours, labels_not_allowed, host_not_allowed, "
    "origin_not_allowed)",
}
_ERROR_BODY = {
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
}


def document(app: FastAPI) -> None:
    """Say in the OpenAPI document that every operation but the public ones takes a bearer
    token and may answer 401 (no valid token) or 403 (its role may not)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}
            }
            for path, operations in schema.get("paths", {}).items():
                if path in PUBLIC_PATHS:
                    continue
                for operation in operations.values():
                    operation["security"] = [{"bearer": []}]
                    responses = operation.setdefault("responses", {})
                    for status, meaning in _REFUSALS.items():
                        responses.setdefault(status, {"description": meaning, **_ERROR_BODY})
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
