"""REST routes for actors: get-or-create, list, show, wake, sleep, destroy, read their KV.

    POST   /actors {name, key, input, pool, crash_policy}   201 created, 200 found (same key)
    GET    /actors?name=&key=&pool=&state=&before=&limit=   newest first, paged by ``next``
    GET    /actors/{id}
    POST   /actors/{id}/wake | /actors/{id}/sleep
    DELETE /actors/{id}                                       stops it, drops its KV
    GET    /actors/{id}/kv?prefix=&after=&limit=              its KV (reading only)

Refusals: ``invalid_request`` (422: a bad name, policy, field), ``key_too_long`` (413: a key
over 1 KiB), ``input_too_large`` (413: over 4 MiB), ``unknown_actor_name`` (422: no runner
of the pool has ever offered that name and no serverless endpoint grows the pool),
``actor_not_found`` (404).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import Field

from corral.actors.lifecycle import ActorState, CrashPolicy
from corral.actors.model import (
    DEFAULT_POOL,
    INPUT_MAX_BYTES,
    KEY_MAX_BYTES,
    NAME_MAX_CHARS,
    NAME_PATTERN,
    POOL_MAX_CHARS,
    Actor,
    NewActor,
)
from corral.coordinator.auth import Access, require
from corral.coordinator.schemas import iso
from corral.coordinator.service import Coordinator
from corral.errors import InvalidRequest, PayloadTooLarge
from corral.store.kv import MAX_LIST
from corral.wire import WireModel

router = APIRouter(prefix="/actors", tags=["actors"])
READ, WRITE = require(Access.READ), require(Access.WRITE)


class CreateActor(WireModel):
    name: str = Field(min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN.pattern)
    key: str | None = Field(None, description=f"one actor per name and key; ≤ {KEY_MAX_BYTES} B")
    input: str | None = Field(None, description=f"what its process reads; ≤ {INPUT_MAX_BYTES} B")
    pool: str = Field(DEFAULT_POOL, min_length=1, max_length=POOL_MAX_CHARS)
    crash_policy: CrashPolicy = CrashPolicy.SLEEP


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


def actor_json(actor: Actor) -> dict[str, Any]:
    life = actor.life
    return {
        "actor_id": actor.id,
        "name": actor.name,
        "key": actor.key,
        "pool": actor.pool,
        "state": actor.state,
        "generation": actor.generation,
        "runner_id": actor.runner_id,
        "connectable": life.connectable,
        "crash_policy": actor.crash_policy,
        "will_wake": life.will_wake,
        "alarm_at": iso(life.alarm_at),
        "created_at": iso(actor.created_at),
        "started_at": iso(life.started_at),
        "pending_allocation_at": iso(life.pending_allocation_at),
        "connectable_at": iso(life.connectable_at),
        "sleep_at": iso(life.sleep_at),
        "reschedule_at": iso(life.reschedule_at),
        "destroyed_at": iso(life.destroyed_at),
    }


@router.post("", status_code=201, dependencies=[WRITE])
async def create_actor(body: CreateActor, request: Request, response: Response) -> dict[str, Any]:
    """Get or create the actor of this name and key (an actor without a key is always new);
    a new actor starts at once (placed, or queued in its pool)."""
    if body.key is not None and len(body.key.encode()) > KEY_MAX_BYTES:
        raise PayloadTooLarge(f"the key is over {KEY_MAX_BYTES} bytes", code="key_too_long")
    if body.input is not None and len(body.input.encode()) > INPUT_MAX_BYTES:
        raise PayloadTooLarge(f"the input is over {INPUT_MAX_BYTES} bytes", code="input_too_large")
    actors = _coordinator(request).actors
    if not await actors.known(body.name, body.pool):
        raise InvalidRequest(
            f"no runner of pool {body.pool!r} hosts actors named {body.name!r}",
            code="unknown_actor_name",
        )
    spec = NewActor(body.name, body.key, body.input, body.pool, body.crash_policy)
    actor, created = await actors.create(spec)
    if not created:
        response.status_code = 200
    return {**actor_json(actor), "created": created}


@router.get("", dependencies=[READ])
async def list_actors(
    request: Request,
    name: str | None = None,
    key: str | None = None,
    pool: str | None = None,
    state: Annotated[str | None, Query(description="comma-separated states")] = None,
    before: Annotated[str | None, Query(description="the 'next' of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    states = [_state(s) for s in (state or "").split(",") if s]
    actors = await _coordinator(request).actors.list(
        name=name, key=key, pool=pool, states=states, before=before, limit=limit
    )
    return {
        "actors": [actor_json(a) for a in actors],
        "next": actors[-1].id if len(actors) == limit else None,
    }


def _state(text: str) -> ActorState:
    try:
        return ActorState(text.strip())
    except ValueError:
        known = ", ".join(ActorState)
        raise InvalidRequest(f"unknown state {text!r}; one of {known}") from None


@router.get("/{actor_id}", dependencies=[READ])
async def get_actor(actor_id: str, request: Request) -> dict[str, Any]:
    return actor_json(await _coordinator(request).actors.get(actor_id))


@router.post("/{actor_id}/wake", dependencies=[WRITE])
async def wake_actor(actor_id: str, request: Request) -> dict[str, Any]:
    """Sleeping: placed again (or once it has stopped, if it is still stopping). Otherwise
    nothing changes."""
    return actor_json(await _coordinator(request).actors.wake(actor_id))


@router.post("/{actor_id}/sleep", dependencies=[WRITE])
async def sleep_actor(actor_id: str, request: Request) -> dict[str, Any]:
    """Intent Sleep, as if the actor asked: stopped now, woken by the next request."""
    return actor_json(await _coordinator(request).actors.sleep(actor_id))


@router.delete("/{actor_id}", dependencies=[WRITE])
async def destroy_actor(actor_id: str, request: Request) -> dict[str, Any]:
    """Stop it (if it runs) and destroy it: its KV is dropped once it has stopped."""
    return actor_json(await _coordinator(request).actors.destroy(actor_id))


@router.get("/{actor_id}/kv", dependencies=[READ])
async def read_kv(
    actor_id: str,
    request: Request,
    prefix: str = "",
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
) -> dict[str, Any]:
    """The actor's KV entries in byte order of their keys, paged by ``after``."""
    coordinator = _coordinator(request)
    await coordinator.actors.get(actor_id)  # actor_not_found for an unknown one
    op: dict[str, Any] = {"op": "list", "prefix": prefix, "limit": limit}
    if after is not None:
        op["after"] = after
    result = await coordinator.in_thread(
        coordinator.store.kv.apply, actor_id, op, coordinator.clock.now()
    )
    if not result["ok"]:
        raise InvalidRequest(result["error"], code=result["code"])
    entries = result["entries"]
    return {
        "entries": [{"key": k, "value": v} for k, v in entries],
        "next": entries[-1][0] if len(entries) == limit else None,
    }
