"""The coordinator's ASGI application: routes, error bodies, and the reconciler's lifetime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import __version__
from corral.actors.model import INPUT_MAX_BYTES
from corral.agents.profiles import load_profiles
from corral.backoff import backoff_delay
from corral.clock import Clock, SystemClock
from corral.coordinator import (
    api_actors,
    api_clients,
    api_dashboard,
    api_events,
    api_metrics,
    api_pools,
    api_runners,
    api_tasks,
    api_tokens,
    auth,
    compat_ao,
    gateway,
    socket,
)
from corral.coordinator.listener import Listener
from corral.coordinator.schemas import error_responses, refusal
from corral.coordinator.service import Coordinator
from corral.coordinator.settings import SHUTDOWN_GRACE_S, CoordinatorSettings
from corral.coordinator.sole import SoleCoordinator
from corral.dashboard import site as dashboard_site
from corral.errors import CorralError, Unavailable
from corral.protocol.limits import MAX_FRAME_BYTES
from corral.store import Store
from corral.store.db import PostgresDatabase
from corral.wire import check_parameters

log = logging.getLogger("corral.coordinator")
# How long a coordinator starting tries again to open a PostgreSQL that does not answer.
OPEN_RETRY_S = 30.0


def create_app(
    settings: CoordinatorSettings,
    *,
    store: Store | None = None,
    clock: Clock | None = None,
    reconcile: bool = True,
    sole: SoleCoordinator | None = None,
) -> FastAPI:
    """Build the app; it opens (and closes) its own store unless one is given, and gives
    back the SQLite file's ``sole`` lock when it stops."""
    owns_store = store is None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opened = store or await _open_store(settings.db_url)
        coordinator = Coordinator(
            opened, settings, clock or SystemClock(), load_profiles(settings.config_path)
        )
        app.state.coordinator = coordinator
        jobs = (
            [
                asyncio.create_task(coordinator.reconcile_forever()),
                asyncio.create_task(coordinator.deliver_callbacks_forever()),
                asyncio.create_task(coordinator.collect_forever()),
                asyncio.create_task(coordinator.analyze_forever()),
                asyncio.create_task(coordinator.autoscaler.run_forever()),
            ]
            if reconcile
            else []
        )
        # Waiting runner sockets are woken for new runs by its rounds.
        jobs.append(asyncio.create_task(coordinator.dispatch_forever()))
        # Runner sockets whose Init or runner is late are closed by it.
        jobs.append(asyncio.create_task(coordinator.deadlines.run_forever()))
        # Several coordinators may share a PostgreSQL database: hear what the others change.
        db = opened.db
        app.state.listener = None
        if isinstance(db, PostgresDatabase):
            app.state.listener = Listener(
                db.url, db.node, coordinator.notifier, rescan=coordinator.rescan
            )
            jobs.append(asyncio.create_task(app.state.listener.run_forever()))
        try:
            yield
        finally:
            await coordinator.events.close()
            await coordinator.peers.aclose()
            for job in jobs:
                job.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job
            await coordinator.writer.close()
            if owns_store:
                opened.close()
            if sole is not None:
                sole.release()

    app = CoordinatorApp(
        title="corral coordinator",
        version=__version__,
        description="Runs, sessions and runners of a corral control plane.",
        lifespan=lifespan,
        dependencies=[Depends(_storable_params)],
    )
    # Any route may answer these (the body limit and the parameter checks are app-wide).
    errors = error_responses(400, 404, 409, 413, 422, 503)
    # First: routes are matched in order, and a WebSocket to an actor comes this way (an
    # HTTP request to one is taken before routing: ``CoordinatorApp``).
    app.include_router(gateway.router)
    app.include_router(api_clients.router, responses=errors)
    app.include_router(api_runners.router, responses=errors)
    app.include_router(api_tasks.router, responses=errors)
    app.include_router(compat_ao.router, responses=errors)
    app.include_router(compat_ao.token_router, responses=errors)
    app.include_router(socket.router)
    app.include_router(api_pools.router, responses=errors)
    app.include_router(api_tokens.router, responses=errors)
    app.include_router(api_actors.router, responses=errors)
    app.include_router(api_metrics.router, responses=errors)
    app.include_router(api_dashboard.router, responses=errors)
    dashboard_site.mount(app)
    app.include_router(api_events.router, responses=errors)
    app.add_exception_handler(CorralError, _corral_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    # A wire model built inside a route from what the request said (a seed runner's
    # registration becomes a RegisterRunner) refuses it the same way.
    app.add_exception_handler(ValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    limits = {
        "max_bytes": settings.max_body_bytes,
        "runner_max_bytes": settings.max_runner_body_bytes,
    }
    hosts = auth.allowed_hosts(
        settings.host, (*settings.allowed_hosts, *_public_host(settings.public_url))
    )
    app.add_middleware(BodyLimit, **limits)
    # Outermost: nothing is read or routed before the caller is known.
    app.add_middleware(auth.Guard, allowed_hosts=hosts)
    # The same door in front of the gateway's requests.
    app.gateway = auth.Guard(BodyLimit(gateway.serve, **limits), allowed_hosts=hosts)
    app.runner_socket = auth.Guard(socket.serve, allowed_hosts=hosts)
    app.run_creator = auth.Guard(
        BodyLimit(api_clients.serve_create_run, **limits), allowed_hosts=hosts
    )
    auth.document(app)
    return app


async def _open_store(url: str) -> Store:
    """The store, for a coordinator starting. ``corral serve`` waits for its PostgreSQL
    before it starts the server, but the server may be restarting again by the time the
    app opens the store (the chaos soak found a coordinator that exited there): that is
    tried again, with backoff, for ``OPEN_RETRY_S``, before the start fails."""
    deadline = time.monotonic() + OPEN_RETRY_S
    attempt = 0
    while True:
        try:
            return Store.open(url)
        except Unavailable as exc:
            if time.monotonic() >= deadline:
                raise
            delay = backoff_delay(attempt, cap=5.0)
            log.warning("%s; trying again in %.1f s", exc.message, delay)
            await asyncio.sleep(delay)
            attempt += 1


class CoordinatorApp(FastAPI):
    """FastAPI, but an HTTP request to an actor (``/gateway/…``, the hot path of every
    warm request) goes straight to ``gateway``: the same ``Guard`` and body limit as every
    other request, then the gateway's own ASGI code, without FastAPI's routing, exception
    middleware and dependency solving (about a fifth of the coordinator's CPU a request).
    So does a runner's WebSocket (``socket.serve``): its frames then pass no middleware;
    and ``POST /runs`` (``api_clients.serve_create_run``), the request most often made."""

    gateway: ASGIApp | None = None
    runner_socket: ASGIApp | None = None  # the runner link's upgrades, likewise
    run_creator: ASGIApp | None = None  # POST /runs, likewise

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.gateway is not None and scope["type"] == "http" and gateway.route(scope):
            scope["app"] = self  # as Starlette sets it: the Guard finds the coordinator there
            await self.gateway(scope, receive, send)
            return
        if self.runner_socket is not None and socket.route(scope):
            scope["app"] = self
            await self.runner_socket(scope, receive, send)
            return
        if self.run_creator is not None and api_clients.creates_a_run(scope):
            scope["app"] = self
            await self.run_creator(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def server_config(
    settings: CoordinatorSettings,
    *,
    host: str,
    port: int,
    own_logging: bool = True,
    sole: bool = True,
) -> uvicorn.Config:
    """How corral serves its app, wherever it runs (``serve``, ``up``, ``tasks run``).
    ``own_logging=False``: uvicorn's loggers write through the root logger's handler (the
    process chose a format, ``--log-format``) rather than uvicorn's own. Refuses
    (``database_in_use``) a SQLite database another coordinator serves; ``sole=False``
    (a short-lived one: ``corral tasks status``, ``pause`` … beside a ``tasks run``) does
    not claim it."""
    claimed = SoleCoordinator.claim(settings.db_url, f"http://{host}:{port}") if sole else None
    return uvicorn.Config(
        create_app(settings, sole=claimed),
        host=host,
        port=port,
        log_level="warning",
        log_config=uvicorn.config.LOGGING_CONFIG if own_logging else None,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        # Runner frames are small JSON: compressing each costs more CPU than it saves.
        ws_per_message_deflate=False,
        # A larger frame closes the socket with 1009 (the runner cuts its frames far below).
        ws_max_size=MAX_FRAME_BYTES,
        # No transport pings: the runner pings in the protocol, on an interval that grows
        # with the sockets held (``link_core.ping_interval_s``), and a silent one is lost by
        # its session's threshold. uvicorn's own, every 20 s with a 20 s timeout, cost a
        # timer and two frames a socket (500 a second at 10,000 sockets) and would close
        # every socket of an event loop stalled that long, whatever their runners' leases.
        ws_ping_interval=None,
        ws_ping_timeout=None,
    )


class CorralServer(uvicorn.Server):
    """uvicorn's server. Stopping, it first ends the open event streams and tells the
    runners connected to this coordinator to move to another one (``Coordinator.leave``):
    uvicorn would wait for the streams until its grace ran out, and cut the runners'
    sockets with no word said, which they would take for a failure."""

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        coordinator = getattr(getattr(self.config.app, "state", None), "coordinator", None)
        if isinstance(coordinator, Coordinator) and not self.force_exit:
            # First take no new connection: a runner told to move must not land here again.
            for server in self.servers:
                server.close()
            # Open event streams and log follows of running runs do not end by themselves:
            # end them, or uvicorn would wait for them its whole grace and then cut them.
            coordinator.end_streams()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(coordinator.leave(), SHUTDOWN_GRACE_S)
        await super().shutdown(sockets)


class QuietServer(CorralServer):
    """uvicorn without its own signal handling: the caller decides how it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _public_host(public_url: str | None) -> tuple[str, ...]:
    """The host name of ``--public-url``: requests forwarded by other coordinators name it."""
    host = urlsplit(public_url).hostname if public_url else None
    return (host,) if host else ()


def _error(status: int, code: str, message: str, **details: Any) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status)


async def _storable_params(connection: HTTPConnection) -> None:
    """Path and query values reach SQL as bound text too: refuse what bodies may not hold."""
    check_parameters((*connection.path_params.items(), *connection.query_params.multi_items()))


async def _corral_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CorralError)
    return JSONResponse(exc.to_dict(), status_code=exc.http_status)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError | ValidationError)
    return await _corral_error(request, refusal(exc.errors()))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    codes = {404: "route_not_found", 405: "method_not_allowed", 413: "payload_too_large"}
    code = codes.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail))


ACTOR_CREATE_MAX_BYTES = 2 * INPUT_MAX_BYTES + 64 * 1024


class BodyLimit:
    """Refuse request bodies over the limit (declared or streamed) with 413: ``max_bytes``,
    or ``runner_max_bytes`` for the runner protocol (its batches of reports carry logs)."""

    def __init__(self, app: ASGIApp, max_bytes: int, runner_max_bytes: int) -> None:
        self.app = app
        self.client_max_bytes = max_bytes
        self.runner_max_bytes = runner_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        max_bytes = self.runner_max_bytes if path.startswith("/runner/") else self.client_max_bytes
        if path == "/actors":  # an actor's input may be 4 MiB, and JSON escapes some of it
            max_bytes = max(max_bytes, ACTOR_CREATE_MAX_BYTES)
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
                response = _error(413, "payload_too_large", f"request body over {max_bytes} bytes")
                await response(scope, receive, send)
                return
        received = 0

        async def limited_receive() -> Message:
            # A body sent without content-length (chunked) is counted as it arrives.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise HTTPException(413, f"request body over {max_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)
