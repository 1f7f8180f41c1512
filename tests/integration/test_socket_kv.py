"""Actors' KV requests over a real WebSocket link: a real coordinator (uvicorn, SQLite and
PostgreSQL) and the runner's real ``WebSocketTransport``; a request made while the link
is down waits and completes after the reconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from api_fixtures import TOKEN, live_server, wait_until, with_token

from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import CorralError
from corral.runner.core import Runner
from corral.runner.settings import RunnerSettings
from corral.runner.websocket import WebSocketTransport
from corral.store.db import open_database
from corral.store.kv import apply_op

pytestmark = pytest.mark.anyio
STEP_S = 10.0


@pytest.fixture
async def linked(db_url: str) -> AsyncIterator[tuple[WebSocketTransport, CoordinatorSettings]]:
    settings = with_token(CoordinatorSettings(db_url=db_url, poll_timeout_s=5.0))
    app = create_app(settings, reconcile=False)
    with live_server(app, ws="websockets-sansio", graceful_shutdown_s=2) as url:
        runner = Runner(
            RunnerSettings(coordinator_url=url, token=TOKEN, transport="websocket", slots=1)
        )
        transport = runner.transport
        assert isinstance(transport, WebSocketTransport)
        await asyncio.wait_for(transport.open(), STEP_S)
        try:
            yield transport, settings
        finally:
            await transport.close()


async def test_put_get_list_delete_over_the_link(
    linked: tuple[WebSocketTransport, CoordinatorSettings],
) -> None:
    link, _ = linked
    entries = {"state/count": "3", "state/name": "ada", "other": "x"}
    assert await link.kv("act_1", {"op": "put", "entries": entries}) == {"ok": True}
    got = await link.kv("act_1", {"op": "get", "keys": ["state/name", "nope"]})
    assert got["values"] == ["ada", None]
    listed = await link.kv("act_1", {"op": "list", "prefix": "state/"})
    assert listed["entries"] == [["state/count", "3"], ["state/name", "ada"]]
    assert (await link.kv("act_1", {"op": "delete", "keys": ["other"]}))["deleted"] == 1
    with pytest.raises(CorralError) as refused:
        await link.kv("act_1", {"op": "get", "keys": []})
    assert refused.value.code == "invalid_request"


async def test_a_request_made_while_the_link_is_down_completes_after_the_reconnect(
    linked: tuple[WebSocketTransport, CoordinatorSettings],
) -> None:
    link, settings = linked
    assert link._ws is not None
    link._ws.transport.abort()  # the connection breaks
    await wait_until(lambda: link._ws is None)  # the pump notices
    put = asyncio.ensure_future(link.kv("act_1", {"op": "put", "entries": {"k": "v"}}))
    await asyncio.sleep(0)
    assert link.conn.pending_kv  # waiting for the next socket (backoff: about 1 s)
    assert await asyncio.wait_for(put, STEP_S) == {"ok": True}
    db = open_database(settings.db_url)  # what the coordinator stored, read on our own
    try:
        assert apply_op(db, "act_1", {"op": "list"}, 0.0)["entries"] == [["k", "v"]]
    finally:
        db.close()
