"""The gateway's tunnel over real sockets: a real coordinator (uvicorn), the runner's real
``WebSocketTransport`` and an actor that is a real HTTP server on loopback. Requests and
responses stream both ways, a client that goes away aborts the actor's request, a runner
without the actor answers 503 and the gateway finds it again, and a link cut mid-request
loses nothing: the tunnel's replay completes it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import websockets
from api_fixtures import TOKEN, live_server, wait_until, with_token
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from corral.actors.lifecycle import ActorState, CrashPolicy, Life
from corral.actors.model import Actor, NewActor
from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import NotFound
from corral.ids import ActorId
from corral.protocol.limits import MAX_TUNNEL_WS_MESSAGE_BYTES
from corral.protocol.messages import (
    TUNNEL_PARTS,
    TUNNEL_WHOLE,
    ToClientTunnelAck,
    ToClientTunnelAcks,
)
from corral.runner.core import RunnerCore
from corral.runner.settings import RunnerSettings
from corral.runner.websocket import WebSocketTransport

pytestmark = pytest.mark.anyio
STEP_S = 15.0
ACTOR = ActorId("act_0123456789ab")


# ---- an actor: a real HTTP server -----------------------------------------------------------


@dataclass
class ActorApp:
    hits: dict[str, int] = field(default_factory=dict)
    hanging: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def app(self) -> FastAPI:
        app = FastAPI()

        app.router.routes.append(Route("/echo", Echo(), methods=["POST"]))

        @app.get("/count/{name}")
        async def count(name: str, request: Request) -> dict[str, Any]:
            self.hits[name] = self.hits.get(name, 0) + 1
            return {"name": name, "hits": self.hits[name], "query": str(request.url.query),
                    "auth": request.headers.get("authorization")}  # fmt: skip

        @app.head("/count/{name}")
        async def count_head(name: str) -> Response:
            self.hits[name] = self.hits.get(name, 0) + 1
            return Response(headers={"x-hits": str(self.hits[name]), "content-length": "42"})

        @app.get("/busy/{name}")
        async def busy(name: str) -> Response:
            # Its own 503, with the header a runner uses to say the actor never saw it.
            self.hits[name] = self.hits.get(name, 0) + 1
            return Response(status_code=503, headers={"x-corral-error": "actor_not_here"})

        @app.get("/stream")
        async def stream(n: int, size: int) -> StreamingResponse:
            async def parts() -> AsyncIterator[bytes]:
                for i in range(n):
                    yield bytes([i % 256]) * size

            return StreamingResponse(parts())

        @app.websocket("/ws")
        async def talk(ws: WebSocket) -> None:
            await ws.accept(subprotocol="chat")
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") == "bye":
                    await ws.close(1000)
                    return
                if message.get("text") is not None:
                    await ws.send_text(message["text"].upper())
                else:
                    await ws.send_bytes(message["bytes"][::-1])

        @app.get("/hang")
        async def hang(request: Request) -> dict[str, str]:
            self.hanging.set()
            message = await request.receive()  # the body (none), then the disconnect
            while message["type"] != "http.disconnect":
                message = await request.receive()
            self.disconnected.set()
            return {}

        return app


class Echo:
    """Each part of the body is written back as it is read (plain ASGI: Starlette's
    streaming response would read the body for disconnects itself)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/octet-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        more = True
        while more:
            message = await receive()
            more = message["type"] == "http.request" and message.get("more_body", False)
            data = message.get("body", b"")
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Directory:
    """The coordinator's actors as the gateway sees them, for one actor that is connectable
    on one runner (the lifecycle behind it has tests of its own)."""

    def __init__(self) -> None:
        self.placed_on: str | None = None
        self.generation = 1
        self.state = ActorState.RUNNING
        self._changed = asyncio.Event()

    def change(self, **fields: Any) -> None:
        """Change the actor and say so, as the coordinator's actors do."""
        for name, value in fields.items():
            setattr(self, name, value)
        self._changed.set()
        self._changed = asyncio.Event()

    def actor(self) -> Actor:
        life = Life(
            state=self.state,
            crash_policy=CrashPolicy.SLEEP,
            generation=self.generation,
            runner_id=self.placed_on,
        )
        return Actor(ACTOR, "echo", "k", None, "default", 0.0, life)

    def changed(self, actor_id: str) -> asyncio.Event:
        return self._changed

    async def get(self, actor_id: str) -> Actor:
        if actor_id != ACTOR:
            raise NotFound(f"no actor {actor_id}", code="actor_not_found")
        return self.actor()

    async def wake(self, actor_id: str) -> Actor:
        return self.actor()

    async def known(self, name: str, pool: str) -> bool:
        return name == "echo"

    async def create(self, spec: NewActor) -> tuple[Actor, bool]:
        return self.actor(), False

    async def list(self, **filters: Any) -> list[Actor]:
        return [self.actor()] if filters.get("key") == "k" else []


class ActorRunner(RunnerCore):
    ports: dict[tuple[str, int], int]

    async def port_when_started(self, actor_id: str, generation: int) -> int | None:
        return self.ports.get((actor_id, generation))


@dataclass
class World:
    client: httpx.AsyncClient
    transport: WebSocketTransport
    runner: ActorRunner
    directory: Directory
    actor: ActorApp
    actor_port: int
    coordinator: Any


@pytest.fixture
def actor_server() -> Iterator[tuple[ActorApp, int]]:
    actor = ActorApp()
    with live_server(actor.app(), ws="websockets-sansio") as url:
        yield actor, int(url.rsplit(":", 1)[1])


@pytest.fixture
async def world(tmp_path: Any, actor_server: tuple[ActorApp, int]) -> AsyncIterator[World]:
    actor, port = actor_server
    settings = with_token(
        CoordinatorSettings(db_url=f"sqlite:///{tmp_path}/c.db", poll_timeout_s=5.0)
    )
    app = create_app(settings, reconcile=False)
    with live_server(app, ws="websockets-sansio", graceful_shutdown_s=2) as url:
        directory = Directory()
        app.state.coordinator.actors = directory
        runner = ActorRunner(
            RunnerSettings(coordinator_url=url, token=TOKEN, transport="websocket", slots=1)
        )
        runner.ports = {(ACTOR, 1): port}
        transport = runner.transport
        assert isinstance(transport, WebSocketTransport)
        await asyncio.wait_for(transport.open(), STEP_S)
        directory.placed_on = transport.runner_id
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=STEP_S) as client:
            try:
                coordinator = app.state.coordinator
                yield World(client, transport, runner, directory, actor, port, coordinator)
            finally:
                await transport.close()


async def test_a_request_and_its_response_go_through_the_tunnel(world: World) -> None:
    response = await world.client.get(f"/gateway/{ACTOR}/count/a?x=1&y=2")
    assert response.status_code == 200
    body = response.json()
    assert body == {"name": "a", "hits": 1, "query": "x=1&y=2", "auth": None}  # token kept back
    by_key = await world.client.get("/gateway/echo/count/a?key=k&z=3")
    assert by_key.json()["hits"] == 2 and by_key.json()["query"] == "z=3"


async def test_a_starting_actor_is_sent_its_request_once_its_start_went_out(
    world: World,
) -> None:
    """Not connectable yet, but its start command went out on the runner's socket (a
    runner at TUNNEL_STARTING holds the request until the actor accepts): the gateway does
    not wait for the report that it runs (it would answer actor_not_ready after
    WAKE_TIMEOUT_S)."""
    world.directory.change(state=ActorState.STARTING)
    request = asyncio.ensure_future(world.client.get(f"/gateway/{ACTOR}/count/early"))
    link = world.coordinator.connections.by_runner[world.transport.runner_id]
    world.coordinator.tunnels.start_sent(link, ACTOR, 1)  # as the socket's push does
    world.directory.change()  # and says so
    response = await request
    assert response.status_code == 200, response.text
    assert response.json()["hits"] == 1 and world.directory.state is ActorState.STARTING


async def test_a_request_without_a_body_reaches_the_runner_as_one_message(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[object] = []
    receive = world.transport.conn.receive

    def recording(message: Any, now: float) -> Any:
        received.append(message)
        return receive(message, now)

    monkeypatch.setattr(world.transport.conn, "receive", recording)
    assert (await world.client.get(f"/gateway/{ACTOR}/count/one")).json()["hits"] == 1
    tunnelled = [m for m in received if type(m).__name__.startswith("ToClientRequest")]
    assert [(type(m).__name__, getattr(m, "end", None)) for m in tunnelled] == [
        ("ToClientRequestStart", True)  # no ToClientRequestEnd after it
    ]


@pytest.mark.parametrize("version", [TUNNEL_WHOLE, TUNNEL_PARTS])
async def test_a_small_response_comes_back_whole_in_one_message(
    world: World, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    """To a coordinator at TUNNEL_WHOLE: one message; to an older one, start, chunk, end."""
    replies: list[object] = []
    send = world.transport.conn.tunnel_send

    def recording(message: Any, now: float) -> Any:
        replies.append(message)
        return send(message, now)

    monkeypatch.setattr(world.transport.conn, "tunnel_send", recording)
    monkeypatch.setattr(world.transport.conn, "coordinator_tunnel", version)
    response = await world.client.get(f"/gateway/{ACTOR}/count/one")
    assert response.json()["hits"] == 1
    kinds = [(type(m).__name__, getattr(m, "end", None)) for m in replies]
    if version == TUNNEL_WHOLE:
        assert kinds == [("ToServerResponseStart", True)]
        assert json.loads(getattr(replies[0], "data", b""))["name"] == "one"
    else:
        assert kinds == [
            ("ToServerResponseStart", False),
            ("ToServerResponseChunk", None),
            ("ToServerResponseEnd", None),
        ]
    await wait_until(lambda: world.transport.tunnel.open_requests == 0, what="acknowledged")


async def test_the_ends_of_responses_are_acknowledged_in_gathered_frames(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[object] = []
    receive = world.transport.conn.receive

    def recording(message: Any, now: float) -> Any:
        received.append(message)
        return receive(message, now)

    monkeypatch.setattr(world.transport.conn, "receive", recording)
    answers = await asyncio.gather(
        *(world.client.get(f"/gateway/{ACTOR}/count/together") for _ in range(5))
    )
    assert sorted(a.json()["hits"] for a in answers) == [1, 2, 3, 4, 5]
    await wait_until(lambda: world.transport.tunnel.open_requests == 0, what="acknowledged")
    assert not [m for m in received if isinstance(m, ToClientTunnelAck)]  # none alone
    gathered = [m for m in received if isinstance(m, ToClientTunnelAcks)]
    assert sum(len(m.acks) for m in gathered) == 5


async def test_head_is_forwarded_and_answered_without_a_body(world: World) -> None:
    response = await world.client.head(f"/gateway/{ACTOR}/count/h")
    assert response.status_code == 200
    assert response.headers["x-hits"] == "1" and world.actor.hits["h"] == 1  # it got there
    assert response.headers["content-length"] == "42" and response.content == b""


async def test_bodies_stream_both_ways_in_chunks(world: World) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: many chunks, more than the window
    response = await world.client.post(f"/gateway/{ACTOR}/echo", content=payload)
    assert response.status_code == 200
    assert hashlib.sha256(response.content).digest() == hashlib.sha256(payload).digest()

    async def parts() -> AsyncIterator[bytes]:  # a chunked upload of unknown length
        for i in range(40):
            yield bytes([i]) * 50_000

    streamed = await world.client.post(f"/gateway/{ACTOR}/echo", content=parts())
    assert streamed.content == b"".join(bytes([i]) * 50_000 for i in range(40))
    big = await world.client.get(f"/gateway/{ACTOR}/stream", params={"n": 300, "size": 10_000})
    assert len(big.content) == 3_000_000 and big.content[-1] == 299 % 256


async def test_text_that_cannot_be_stored_is_refused_before_the_actor(world: World) -> None:
    """Taken before FastAPI's routing, the gateway still checks what the app's routes check."""
    for url in (f"/gateway/{ACTOR}/count/n?x=%00", "/gateway/act%00/count/n"):
        response = await world.client.get(url)
        assert (response.status_code, response.json()["error"]["code"]) == (
            422,
            "invalid_request",
        ), url
    assert "n" not in world.actor.hits


async def test_a_client_that_goes_away_aborts_the_actors_request(world: World) -> None:
    request = asyncio.ensure_future(world.client.get(f"/gateway/{ACTOR}/hang"))
    await wait_until(world.actor.hanging.is_set, what="the actor handling the request")
    request.cancel()  # the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await request
    await wait_until(world.actor.disconnected.is_set, timeout=STEP_S, what="the actor sees it")
    await wait_until(lambda: world.transport.tunnel.open_requests == 0, what="the request over")


async def test_a_runner_without_the_actor_answers_503_and_the_gateway_finds_it_again(
    world: World,
) -> None:
    world.directory.change(generation=2)  # the runner only has generation 1
    response = await world.client.get(f"/gateway/{ACTOR}/count/b")
    assert response.status_code == 503
    assert response.headers["x-corral-error"] == "actor_not_here"
    assert json.loads(response.content)["error"]["code"] == "actor_not_here"
    assert "b" not in world.actor.hits  # the actor never saw it
    world.runner.ports[(ACTOR, 2)] = world.actor_port  # it moved to generation 2 meanwhile
    assert (await world.client.get(f"/gateway/{ACTOR}/count/b")).json()["hits"] == 1


async def test_an_actors_own_503_is_answered_once_whatever_its_headers_say(
    world: World,
) -> None:
    """The actor ran it: only the runner may say it did not (x-corral-error), never the
    actor's own response, which would have the gateway send it again."""
    response = await world.client.get(f"/gateway/{ACTOR}/busy/c")
    assert (response.status_code, world.actor.hits["c"]) == (503, 1)
    assert "x-corral-error" not in response.headers  # the runner kept it back


async def test_a_request_the_runner_fails_to_forward_is_answered_not_left_waiting(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure in the runner's own code (a bug) is said to the gateway: its client gets
    a 500 with a stable code, not a request that never ends."""

    async def broken(*_: object) -> None:
        raise RuntimeError("a bug in the runner")

    monkeypatch.setattr(world.transport.tunnel, "_exchange", broken)
    response = await world.client.get(f"/gateway/{ACTOR}/count/d")
    assert (response.status_code, response.json()["error"]["code"]) == (500, "runner_failed")
    assert "d" not in world.actor.hits
    await wait_until(lambda: world.transport.tunnel.open_requests == 0, what="the request over")


async def test_unknown_and_destroyed_actors_are_404_with_stable_codes(world: World) -> None:
    unknown = await world.client.get("/gateway/act_ffffffffffff/x")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "actor_not_found")
    no_key = await world.client.get("/gateway/echo/x?key=other")
    assert (no_key.status_code, no_key.json()["error"]["code"]) == (404, "actor_not_found")
    world.directory.change(state=ActorState.DESTROYED)
    gone = await world.client.get(f"/gateway/{ACTOR}/x")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "actor_destroyed")


async def test_a_link_cut_mid_response_loses_nothing(world: World) -> None:
    async with world.client.stream(
        "GET", f"/gateway/{ACTOR}/stream", params={"n": 400, "size": 20_000}
    ) as response:
        received = bytearray()
        cut = False
        async for part in response.aiter_bytes():
            received += part
            if not cut and len(received) > 1_000_000:
                assert world.transport._ws is not None
                world.transport._ws.transport.abort()  # the runner's socket breaks
                cut = True
    assert cut and len(received) == 8_000_000
    expected = b"".join(bytes([i % 256]) * 20_000 for i in range(400))
    assert hashlib.sha256(received).digest() == hashlib.sha256(expected).digest()


async def test_a_websocket_is_tunnelled_message_by_message(world: World) -> None:
    url = str(world.client.base_url).replace("http://", "ws://") + f"/gateway/{ACTOR}/ws"
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, subprotocols=["chat"]
    ) as ws:
        assert ws.subprotocol == "chat"
        await ws.send("hello")
        assert await ws.recv() == "HELLO"
        await ws.send(b"\x00\x01\x02")
        assert await ws.recv() == b"\x02\x01\x00"
        big_text = "é" * 150_000  # 300 KB: five chunks each way, joined again
        await ws.send(big_text)
        assert await ws.recv() == big_text.upper()
        big_bytes = bytes(range(256)) * 1000
        await ws.send(big_bytes)
        assert await ws.recv() == big_bytes[::-1]
        await ws.send("bye")  # the actor closes: so does the gateway
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()
    await wait_until(lambda: world.transport.tunnel.open_requests == 0, what="the tunnel over")


async def test_a_websocket_message_over_the_limit_closes_it_with_1009(world: World) -> None:
    url = str(world.client.base_url).replace("http://", "ws://") + f"/gateway/{ACTOR}/ws"
    async with websockets.connect(
        url,
        additional_headers={"Authorization": f"Bearer {TOKEN}"},
        subprotocols=["chat"],
        max_size=None,
    ) as ws:
        await ws.send(b"x" * (MAX_TUNNEL_WS_MESSAGE_BYTES + 1))
        with pytest.raises(websockets.ConnectionClosedError) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    await wait_until(lambda: world.transport.tunnel.open_requests == 0, what="the tunnel over")


async def test_a_websocket_the_actor_refuses_is_refused_and_over_at_the_runner(
    world: World,
) -> None:
    """The actor answers the upgrade with an HTTP response (no WebSocket there): the client
    is refused, and the runner is told the request is over (it would keep the rest of that
    response for the gateway otherwise)."""
    url = str(world.client.base_url).replace("http://", "ws://") + f"/gateway/{ACTOR}/stream"
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websockets.connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.value.response.status_code == 403
    await wait_until(lambda: world.transport.tunnel.open_requests == 0, what="the tunnel over")
