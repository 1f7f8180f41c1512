"""REST routes for pools: make one serverless (``PUT``), see it, its demand and its errors;
list them. Their changes are ``pool`` events (``GET /events?kind=pool``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import AnyHttpUrl, Field, model_validator

from corral.actors.model import POOL_MAX_CHARS
from corral.coordinator.auth import Access, require
from corral.coordinator.schemas import iso
from corral.coordinator.service import Coordinator
from corral.pools import MAX_LIFESPAN_S, MAX_RUNNERS, Serverless, desired_runners
from corral.store.pools import Pool
from corral.wire import WireModel

router = APIRouter(prefix="/pools", tags=["pools"])
PoolName = Annotated[str, Path(min_length=1, max_length=POOL_MAX_CHARS, pattern=r"^[\w.-]+$")]


class ServerlessBody(WireModel):
    url: AnyHttpUrl = Field(description="the endpoint: the autoscaler opens GET {url}/start")
    headers: dict[str, str] = Field(default_factory=dict, max_length=50)
    request_lifespan: float = Field(300.0, gt=0, le=MAX_LIFESPAN_S, description="seconds")
    slots_per_runner: int = Field(1, ge=1, le=1024)
    min_runners: int = Field(0, ge=0, le=MAX_RUNNERS)
    max_runners: int = Field(10, ge=0, le=MAX_RUNNERS)
    margin: int = Field(0, ge=0, le=MAX_RUNNERS)

    @model_validator(mode="after")
    def _ordered(self) -> ServerlessBody:
        if self.min_runners > self.max_runners:
            raise ValueError("min_runners must not exceed max_runners")
        return self


class PutPool(WireModel):
    serverless: ServerlessBody | None = Field(
        None, description="null: a pool of runners that connect on their own"
    )


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


async def _pool_json(coordinator: Coordinator, name: str) -> dict[str, Any]:
    pool = await coordinator.in_thread(coordinator.store.pools.get, name)
    return await _described(coordinator, pool)


async def _described(coordinator: Coordinator, pool: Pool) -> dict[str, Any]:
    store, name = coordinator.store, pool.name
    slots = await coordinator.in_thread(store.actors.wanted_slots, name)
    errors = await coordinator.in_thread(store.pools.errors, name)
    config = pool.serverless
    return {
        "name": pool.name,
        "serverless": None if config is None else _serverless_json(config),
        "wanted_slots": slots,
        "desired_runners": None if config is None else desired_runners(slots, config),
        "runners": coordinator.autoscaler.runners(name),
        "errors": [{"kind": e.kind, "message": e.message, "at": iso(e.at)} for e in errors],
        "created_at": iso(pool.created_at),
        "updated_at": iso(pool.updated_at),
    }


def _serverless_json(config: Serverless) -> dict[str, Any]:
    body = asdict(config)
    body["request_lifespan"] = body.pop("request_lifespan_s")
    return body


@router.put("/{name}", dependencies=[require(Access.ADMIN)])
async def put_pool(name: PoolName, body: PutPool, request: Request) -> dict[str, Any]:
    """Create or replace the pool's settings; a serverless pool is scaled at once."""
    coordinator = _coordinator(request)
    config = None
    if (s := body.serverless) is not None:
        config = Serverless(
            url=str(s.url).rstrip("/"),
            headers=dict(s.headers),
            request_lifespan_s=s.request_lifespan,
            slots_per_runner=s.slots_per_runner,
            min_runners=s.min_runners,
            max_runners=s.max_runners,
            margin=s.margin,
        )
    await coordinator.in_thread(coordinator.store.pools.put, name, config, coordinator.clock.now())
    coordinator.autoscaler.bump()
    return await _pool_json(coordinator, name)


@router.get("", dependencies=[require(Access.READ)])
async def list_pools(request: Request) -> dict[str, Any]:
    """Every pool with settings of its own (``PUT``), by name, each as ``GET`` shows it.
    (A pool that only names where actors run has none: the actors show it.)"""
    coordinator = _coordinator(request)
    pools = await coordinator.in_thread(coordinator.store.pools.list_all)
    return {"pools": [await _described(coordinator, pool) for pool in pools]}


@router.get("/{name}", dependencies=[require(Access.READ)])
async def get_pool(name: PoolName, request: Request) -> dict[str, Any]:
    """The pool: its settings, wanted slots, desired and live runners, recent errors."""
    return await _pool_json(_coordinator(request), name)
