"""Actors' KV requests over a real WebSocket link: a real coordinator (uvicorn, SQLite and
PostgreSQL) and the runner's real ``WebSocketTransport``; a request made while the link
is down waits and completes after the reconnect; a runner the actor is not placed on, or
an older generation of the actor on the runner it is placed on, is refused
(``actor_not_placed``) and writes nothing."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator

import pytest
from api_fixtures import TOKEN, live_server, wait_until, with_token

from corral.actors.kinds import ActorKind
from corral.actors.model import NewActor
from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import CorralError
from corral.runner.core import RunnerCore
from corral.runner.settings import RunnerSettings
from corral.runner.websocket import WebSocketTransport
from corral.store import Store
from corral.store.db import open_database
from corral.store.kv import KvStore

pytestmark = pytest.mark.anyio
STEP_S = 10.0


Linked = tuple[WebSocketTransport, CoordinatorSettings, str]
# An actor process that only listens on its PORT.
LISTEN = (
    "import os, socket, time; s = socket.socket(); "
    "s.bind(('127.0.0.1', int(os.environ['PORT']))); s.listen(); time.sleep(3600)"
)


@pytest.fixture
async def linked(db_url: str) -> AsyncIterator[Linked]:
    """A runner linked to a coordinator, and an actor placed on it (its KV is the runner's
    to use)."""
    settings = with_token(CoordinatorSettings(db_url=db_url, poll_timeout_s=5.0))
    app = create_app(settings, reconcile=False)
    with live_server(app, ws="websockets-sansio", graceful_shutdown_s=2) as url:
        settings_ = RunnerSettings(
            coordinator_url=url,
            token=TOKEN,
            transport="websocket",
            slots=1,
            actor_kinds={"kv": ActorKind("kv", (sys.executable, "-c", LISTEN))},
        )
        runner = RunnerCore(settings_)
        transport = runner.transport
        assert isinstance(transport, WebSocketTransport)
        await asyncio.wait_for(transport.open(), STEP_S)
        store = Store.open(db_url)
        try:
            actor, _, _ = store.actors.create(NewActor("kv", "k"), time.time())
            assert actor.runner_id == transport.runner_id
            yield transport, settings, actor.id
        finally:
            store.close()
            await runner.actors.close()
            await transport.close()


async def test_put_get_list_delete_over_the_link(
    linked: Linked,
) -> None:
    link, _, act = linked
    entries = {"state/count": "3", "state/name": "ada", "other": "x"}
    assert await link.kv(act, {"op": "put", "entries": entries}) == {"ok": True}
    got = await link.kv(act, {"op": "get", "keys": ["state/name", "nope"]})
    assert got["values"] == ["ada", None]
    listed = await link.kv(act, {"op": "list", "prefix": "state/"})
    assert listed["entries"] == [["state/count", "3"], ["state/name", "ada"]]
    assert (await link.kv(act, {"op": "delete", "keys": ["other"]}))["deleted"] == 1
    with pytest.raises(CorralError) as refused:
        await link.kv(act, {"op": "get", "keys": []})
    assert refused.value.code == "invalid_request"


async def test_a_request_made_while_the_link_is_down_completes_after_the_reconnect(
    linked: Linked,
) -> None:
    link, settings, act = linked
    assert link._ws is not None
    link._ws.transport.abort()  # the connection breaks
    await wait_until(lambda: link._ws is None)  # the pump notices
    put = asyncio.ensure_future(link.kv(act, {"op": "put", "entries": {"k": "v"}}))
    await asyncio.sleep(0)
    assert link.conn.pending_kv  # waiting for the next socket (backoff: about 1 s)
    assert await asyncio.wait_for(put, STEP_S) == {"ok": True}
    db = open_database(settings.db_url)  # what the coordinator stored, read on our own
    try:
        assert KvStore(db).apply(act, {"op": "list"}, 0.0)["entries"] == [["k", "v"]]
    finally:
        db.close()


async def test_an_older_generation_on_the_same_runner_is_refused_and_writes_nothing(
    linked: Linked,
) -> None:
    link, settings, act = linked
    store = Store.open(settings.db_url)
    try:
        placed = store.actors.placement(act)
    finally:
        store.close()
    assert placed is not None and placed.runner_id == link.runner_id
    put = {"op": "put", "entries": {"k": "v"}}
    with pytest.raises(CorralError) as refused:
        await link.kv(act, put, generation=placed.generation - 1)
    assert refused.value.code == "actor_not_placed"
    assert await link.kv(act, {"op": "list"}, generation=placed.generation) == {
        "ok": True,
        "entries": [],
    }  # nothing written; the placed generation is served
    assert await link.kv(act, put, generation=placed.generation) == {"ok": True}


async def test_a_runner_the_actor_is_not_placed_on_is_refused_and_writes_nothing(
    linked: Linked,
) -> None:
    link, settings, _ = linked
    with pytest.raises(CorralError) as refused:
        await link.kv("act_elsewhere", {"op": "put", "entries": {"k": "v"}})
    assert refused.value.code == "actor_not_placed"
    db = open_database(settings.db_url)
    try:
        assert KvStore(db).apply("act_elsewhere", {"op": "list"}, 0.0)["entries"] == []
    finally:
        db.close()
