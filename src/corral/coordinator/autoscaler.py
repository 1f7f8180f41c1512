"""The serverless autoscaler: as many ``GET {url}/start`` streams per pool as it wants
runners (seed 002: "Bump → Desired: 1 → GET /start").

    wanted slots (placed + queued actors) ──desired_runners──▶ N
    fewer live streams than N ──▶ open one: headers name the coordinator, slots, runner
        name, pool, lifespan and a join token; the first event names the runner, then pings
    more than N ──▶ close the newest: the endpoint drains its runner (GoingAway to its
        actors, a grace, then it leaves; they are placed elsewhere, or queued)
    a stream lives at most ``request_lifespan``; the endpoint drains its runner a grace
        before and says so (``draining``): from then on it no longer counts as live

Errors (refused or unreachable, ended before its lifespan unasked, a first event that does
not name a runner) are recorded per pool and the pool waits a backoff before the next
try. One coordinator scales a pool at a time: it holds the pool's lease while it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from httpx_sse import aconnect_sse

from corral.backoff import backoff_delay
from corral.http_transport import SetupSafeTransport
from corral.ids import new_coordinator_id
from corral.pools import PoolError, Serverless, desired_runners
from corral.tokens import Role

if TYPE_CHECKING:
    from corral.coordinator.service import Coordinator

log = logging.getLogger("corral.coordinator")

# Headers of a /start request (what the endpoint needs to run a runner for us).
ENDPOINT_HEADER = "x-corral-endpoint"
TOKEN_HEADER = "x-corral-token"
SLOTS_HEADER = "x-corral-total-slots"
RUNNER_NAME_HEADER = "x-corral-runner-name"
POOL_HEADER = "x-corral-pool"
LIFESPAN_HEADER = "x-corral-request-lifespan"
PING_INTERVAL_S = 5.0  # the endpoint pings this often; three missed and the stream is dead
JOIN_TOKEN_KEEP_S = 120.0  # a stream's runner token outlives it this long (its drain)


@dataclass
class _Stream:
    pool: str
    opened_at: float
    task: asyncio.Task[None] | None = None
    runner_id: str | None = None
    closing: bool = False  # asked to go (scale-down): its end is not an error


@dataclass
class _PoolState:
    streams: list[_Stream] = field(default_factory=list)
    failures: int = 0
    retry_at: float = 0.0


class Autoscaler:
    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._pools: dict[str, _PoolState] = {}
        self._bumped = asyncio.Event()
        self.scaler_id = new_coordinator_id()
        self._tasks: set[asyncio.Task[None]] = set()

    def bump(self) -> None:
        """Look again now (a pool changed, an actor wants a slot)."""
        self._bumped.set()

    def runners(self, pool: str) -> list[dict[str, Any]]:
        """The pool's live streams, as ``GET /pools/{name}`` shows them."""
        state = self._pools.get(pool)
        return [
            {"runner_id": s.runner_id, "opened_at": s.opened_at, "closing": s.closing}
            for s in (state.streams if state else [])
        ]

    async def run_forever(self) -> None:
        interval = self._coordinator.settings.autoscale_interval_s
        try:
            while True:
                try:
                    await self.scale_once()
                except Exception:
                    log.exception("autoscaling failed; trying again")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._bumped.wait(), interval)
                self._bumped.clear()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def scale_once(self) -> None:
        coordinator = self._coordinator
        store, now = coordinator.store, coordinator.clock.now()
        pools = await coordinator.in_thread(store.pools.serverless)
        if not pools and not self._pools:
            return  # nothing to scale: no write (SQLite has one writer at a time)
        lease_until = now + 3 * coordinator.settings.autoscale_interval_s + 5.0
        held = set(
            await coordinator.in_thread(
                store.pools.lease, [p.name for p in pools], self.scaler_id, lease_until, now
            )
        )
        for pool in pools:
            if pool.name not in held or pool.serverless is None:
                continue
            slots = await coordinator.in_thread(store.actors.wanted_slots, pool.name)
            desired = desired_runners(slots, pool.serverless)
            if (pool.wanted_slots, pool.desired_runners) != (slots, desired):
                # Kept (a pool event) only when it changed: no write on a quiet tick.
                await coordinator.in_thread(
                    store.pools.record_demand, pool.name, slots, desired, coordinator.clock.now()
                )
            self._scale(pool.name, pool.serverless, desired)
        for other in set(self._pools) - held:
            self._scale(other, None, 0)  # no longer serverless, or scaled by another now

    def _scale(self, pool: str, config: Serverless | None, desired: int) -> None:
        state = self._pools.setdefault(pool, _PoolState())
        live = [s for s in state.streams if not s.closing]
        if len(live) > desired:
            for stream in live[desired:]:  # the newest go: the oldest hold the most actors
                log.info("pool %s: scaling down runner %s", pool, stream.runner_id)
                stream.closing = True
                if stream.task is not None:
                    stream.task.cancel()
        elif config is not None and len(live) < desired and time.monotonic() >= state.retry_at:
            for _ in range(desired - len(live)):
                stream = _Stream(pool, self._coordinator.clock.now())
                state.streams.append(stream)
                stream.task = asyncio.create_task(self._stream(stream, config))
                self._tasks.add(stream.task)
                stream.task.add_done_callback(self._tasks.discard)

    # ---- one stream ------------------------------------------------------------------------

    async def _stream(self, stream: _Stream, config: Serverless) -> None:
        coordinator = self._coordinator
        token, secret = await coordinator.in_thread(
            coordinator.store.tokens.create,
            f"serverless:{stream.pool}",
            Role.RUNNER,
            coordinator.clock.now(),
        )
        headers = {
            **config.headers,
            ENDPOINT_HEADER: coordinator.settings.endpoint_url,
            TOKEN_HEADER: secret,
            SLOTS_HEADER: str(config.slots_per_runner),
            RUNNER_NAME_HEADER: f"{stream.pool}-serverless",
            POOL_HEADER: stream.pool,
            LIFESPAN_HEADER: f"{config.request_lifespan_s:g}",
        }
        problem: tuple[PoolError, str] | None = None
        try:
            async with asyncio.timeout(config.request_lifespan_s):
                problem = await self._listen(stream, config, headers)
        except TimeoutError:
            pass  # its lifespan is over: the endpoint drained its runner before
        except asyncio.CancelledError:
            if not stream.closing:
                raise
        finally:
            self._ended(stream, problem)
            self._later(lambda: self._revoke(token.id), JOIN_TOKEN_KEEP_S)

    async def _listen(
        self, stream: _Stream, config: Serverless, headers: dict[str, str]
    ) -> tuple[PoolError, str] | None:
        """Follow the stream until it ends; what went wrong, if anything."""
        timeout = httpx.Timeout(10.0, read=3 * PING_INTERVAL_S)
        try:
            async with (
                httpx.AsyncClient(
                    timeout=timeout, trust_env=False, transport=SetupSafeTransport()
                ) as client,
                aconnect_sse(client, "GET", f"{config.url}/start", headers=headers) as source,
            ):
                response = source.response
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[:200]
                    return PoolError.HTTP_ERROR, f"GET /start: HTTP {response.status_code}: {text}"
                async for event in source.aiter_sse():
                    if event.event == "draining":  # its lifespan ends: a new one may start
                        stream.closing = True
                        self.bump()
                    elif stream.runner_id is None:
                        runner_id = _runner_id(event.data)
                        if runner_id is None:
                            return PoolError.BAD_PAYLOAD, f"first event: {event.data[:200]!r}"
                        stream.runner_id = runner_id
                        self._pools[stream.pool].failures = 0
                        log.info("pool %s: runner %s started", stream.pool, runner_id)
        except httpx.HTTPError as exc:
            if stream.closing:
                return None
            return PoolError.HTTP_ERROR, f"GET /start: {type(exc).__name__}: {exc}"
        if stream.closing:
            return None
        lived = self._coordinator.clock.now() - stream.opened_at
        return PoolError.STREAM_ENDED_EARLY, f"ended after {lived:.1f} s of its lifespan"

    def _ended(self, stream: _Stream, problem: tuple[PoolError, str] | None) -> None:
        state = self._pools[stream.pool]
        state.streams.remove(stream)
        if problem is not None:
            kind, message = problem
            log.warning("pool %s: %s: %s", stream.pool, kind, message)
            state.failures += 1
            delay = backoff_delay(state.failures - 1, base=1.0, cap=30.0, jitter=0.0)
            state.retry_at = time.monotonic() + delay
            self._later(lambda: self._record(stream.pool, kind, message), 0.0)
        self.bump()

    async def _record(self, pool: str, kind: PoolError, message: str) -> None:
        coordinator = self._coordinator
        now = coordinator.clock.now()
        await coordinator.in_thread(coordinator.store.pools.record_error, pool, kind, message, now)

    async def _revoke(self, token_id: str) -> None:
        coordinator = self._coordinator
        await coordinator.in_thread(
            coordinator.store.tokens.revoke, token_id, coordinator.clock.now()
        )
        coordinator.auth.forget(token_id)

    def _later(self, work: Callable[[], Awaitable[None]], delay: float) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            await work()

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _runner_id(data: str) -> str | None:
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    runner_id = payload.get("runner_id") if isinstance(payload, dict) else None
    return runner_id if isinstance(runner_id, str) and runner_id else None
