"""The serverless endpoint: ``GET /start`` runs a runner for the life of the stream
(seed 002: "S → SE: GET /start; SE --> R: same process").

    GET /start  (headers: x-corral-endpoint, -token, -runner-name, -total-slots, -pool,
                 -request-lifespan; from the coordinator's autoscaler)
      ◀── event: started  data: {"runner_id": "rnr_…"}     once the runner has connected
      ◀── event: ping     data: {}                          every few seconds
      ◀── event: draining data: {}                          at lifespan − grace
    at lifespan − grace, or when the coordinator closes the stream (scale-down): the runner
    drains (its actors get GoingAway), has the grace to finish, and leaves; the stream
    ends with it.

Every stream is its own ``RunnerCore`` in this process; SIGTERM drains them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from corral.coordinator.autoscaler import (
    ENDPOINT_HEADER,
    LIFESPAN_HEADER,
    PING_INTERVAL_S,
    POOL_HEADER,
    RUNNER_NAME_HEADER,
    SLOTS_HEADER,
    TOKEN_HEADER,
)
from corral.runner.core import RunnerCore
from corral.runner.settings import RunnerSettings

log = logging.getLogger("corral.runner")
CONNECT_TIMEOUT_S = 30.0


class ServerlessEndpoint:
    def __init__(
        self,
        base: RunnerSettings,
        *,
        drain_grace_s: float = 10.0,
        ping_interval_s: float = PING_INTERVAL_S,
    ) -> None:
        self.base = base
        self.drain_grace_s = drain_grace_s
        self.ping_interval_s = ping_interval_s
        self.runners: set[RunnerCore] = set()
        self._ending: set[asyncio.Task[None]] = set()

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/start", self.start, methods=["GET"])])

    async def start(self, request: Request) -> Response:
        try:
            endpoint = request.headers[ENDPOINT_HEADER]
            token = request.headers[TOKEN_HEADER]
            name = request.headers.get(RUNNER_NAME_HEADER, self.base.name)
            slots = int(request.headers.get(SLOTS_HEADER, "1"))
            lifespan = float(request.headers.get(LIFESPAN_HEADER, "300"))
            pool = request.headers.get(POOL_HEADER, self.base.pool)
        except (KeyError, ValueError) as exc:
            body = {"error": {"code": "invalid_request", "message": f"bad /start: {exc!r}"}}
            return JSONResponse(body, status_code=400)
        settings = replace(
            self.base,
            coordinator_url=endpoint,
            token=token,
            name=name,
            slots=max(1, slots),
            actor_slots=max(1, slots),  # its slots are the pool's actor slots
            pool=pool,
            transport="websocket",
        )
        runner = RunnerCore(settings)
        return StreamingResponse(self._events(runner, lifespan), media_type="text/event-stream")

    async def _events(self, runner: RunnerCore, lifespan_s: float) -> AsyncIterator[str]:
        drain_at = time.monotonic() + max(0.0, lifespan_s - self.drain_grace_s)
        self.runners.add(runner)
        running = asyncio.create_task(
            runner.run(), name=f"serverless runner {runner.settings.name}"
        )
        try:
            runner_id = await _connected(runner, running)
            if runner_id is None:
                return  # it could not connect: the stream ends, the coordinator says why
            yield _event("started", {"runner_id": runner_id})
            while not running.done():
                wait = min(self.ping_interval_s, drain_at - time.monotonic())
                if wait <= 0:
                    log.info("runner %s: its lifespan ends: draining", runner_id)
                    yield _event("draining", {})  # the coordinator may start another now
                    runner.drain(self.drain_grace_s)
                    wait = self.ping_interval_s
                    drain_at = float("inf")
                await asyncio.wait({running}, timeout=wait)
                yield _event("ping", {})
        finally:
            # The stream is over (the coordinator closed it, or its lifespan ended): the
            # runner drains and leaves, in its own time.
            runner.drain(self.drain_grace_s)
            ending = asyncio.ensure_future(self._end(runner, running))
            self._ending.add(ending)
            ending.add_done_callback(self._ending.discard)

    async def _end(self, runner: RunnerCore, running: asyncio.Task[None]) -> None:
        try:
            await running
        except Exception:
            log.exception("serverless runner %s failed", runner.runner_id)
        finally:
            self.runners.discard(runner)

    async def drain_all(self) -> None:
        """Shutting down: every runner drains and leaves."""
        for runner in list(self.runners):
            runner.drain(self.drain_grace_s)
        await asyncio.gather(*list(self._ending), return_exceptions=True)


async def _connected(runner: RunnerCore, running: asyncio.Task[None]) -> str | None:
    """The runner's id once it has connected; None if it ended first or took too long."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while runner.runner_id is None:
        if running.done() or time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.02)
    return str(runner.runner_id)


def _event(kind: str, data: object) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


async def serve(endpoint: ServerlessEndpoint, host: str, port: int) -> None:
    """Serve ``/start`` until cancelled (SIGTERM, Ctrl-C), then drain every runner."""
    config = uvicorn.Config(
        endpoint.app(), host=host, port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    try:
        await server.serve()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(endpoint.drain_all(), endpoint.drain_grace_s + 5.0)
