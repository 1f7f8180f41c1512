"""The gateway forwarding to the coordinator that holds the actor's runner, without sockets:
the peer is an httpx transport that records what reached it. A request that may have
reached the peer (it failed after the connection was made) is never sent again, by any
path: it fails with ``tunnel_lost``. Only one the peer provably never got (its connection
was refused) is looked for again and sent. (The chaos soak's L1-6: B took a request and
died, A sent it again through the runner's new socket, and the actor ran it twice.) A
WebSocket upgrade alike."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.types import Message
from websockets.exceptions import InvalidMessage

from corral.actors.lifecycle import ActorState, CrashPolicy, Life
from corral.actors.model import Actor
from corral.coordinator import peers as peers_module
from corral.coordinator.connections import Connections
from corral.coordinator.gateway import Forward
from corral.coordinator.peers import Peers
from corral.coordinator.tunnel import TunnelHub
from corral.ids import ActorId

pytestmark = pytest.mark.anyio
ACTOR = ActorId("act_0123456789ab")
RUNNER = "rnr_000000000001"
OWN, PEER = "http://a.test", "http://b.test"


class Directory:
    """One actor, connectable on a runner whose socket is on the peer."""

    def changed(self, actor_id: str) -> asyncio.Event:
        return asyncio.Event()

    async def get(self, actor_id: str) -> Actor:
        life = Life(ActorState.RUNNING, CrashPolicy.SLEEP, generation=1, runner_id=RUNNER)
        return Actor(ACTOR, "counter", "k", None, "default", 0.0, life)


class Peer:
    """The other coordinator: each failure in turn, then 200. ``reached`` counts the
    requests its gateway took (what it may have sent on to the actor)."""

    def __init__(self, *failures: httpx.TransportError, answer: int = 200, **headers: str) -> None:
        self.failures = list(failures)
        self.answer, self.headers = answer, headers
        self.reached = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        failure = self.failures.pop(0) if self.failures else None
        if not isinstance(failure, httpx.ConnectError):
            self.reached += 1  # taken: its tunnel may have sent it to the runner already
        if failure is not None:
            raise failure
        headers = {name.replace("_", "-"): value for name, value in self.headers.items()}
        return httpx.Response(self.answer, headers=headers, stream=httpx.ByteStream(b"ran"))


async def forwarded(peer: Peer) -> tuple[int, bytes]:
    """A GET through A's gateway, for the actor whose runner is on B: (status, body)."""

    async def holder(runner_id: str) -> str | None:
        return PEER

    peers = Peers(OWN, holder)
    peers._client = httpx.AsyncClient(transport=httpx.MockTransport(peer))
    settings = SimpleNamespace(ws_lost_after_s=5.0)
    forward = Forward(Directory(), TunnelHub(Connections()), ACTOR, "count/q1", settings, peers)  # type: ignore[arg-type]
    scope: dict[str, Any] = {
        "type": "http", "method": "GET", "path": f"/gateway/{ACTOR}/count/q1",
        "query_string": b"", "headers": [],
    }  # fmt: skip
    stay = asyncio.Event()  # the client stays until answered
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Message:
        if requests:
            return requests.pop()
        await stay.wait()
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    try:
        await asyncio.wait_for(forward(scope, receive, send), 10)
    finally:
        stay.set()
        await peers.aclose()
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    return start["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def test_a_request_the_peer_took_before_it_died_is_not_sent_again() -> None:
    peer = Peer(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    status, body = await forwarded(peer)
    assert peer.reached == 1  # once: the actor may have run it
    assert (status, json.loads(body)["error"]["code"]) == (503, "tunnel_lost")


@pytest.mark.parametrize(
    "failure", [httpx.ReadError(""), httpx.WriteError(""), httpx.ReadTimeout("")]
)
async def test_any_failure_once_connected_fails_the_request(failure: httpx.TransportError) -> None:
    peer = Peer(failure)
    status, body = await forwarded(peer)
    assert peer.reached == 1
    assert (status, json.loads(body)["error"]["code"]) == (503, "tunnel_lost")


async def test_a_peer_that_refused_the_connection_never_saw_it_and_is_looked_for_again() -> None:
    peer = Peer(httpx.ConnectError("Connection refused"))
    assert await forwarded(peer) == (200, b"ran")
    assert peer.reached == 1


async def test_a_peers_503_is_passed_on_unless_it_says_the_actor_never_saw_it() -> None:
    """Only the runner's codes (and a peer's ``runner_not_here``) say the actor never saw
    it; a 503 with another is the actor's answer (or a failure after it took it)."""
    peer = Peer(answer=503, x_corral_error="actor_failed")
    assert await forwarded(peer) == (503, b"ran")
    assert peer.reached == 1


class ClientSocket:
    """The client's WebSocket, not accepted yet, as ``Peers.websocket`` uses it."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {"headers": []}
        self.closed: tuple[int, str] | None = None

    async def close(self, code: int, reason: str = "") -> None:
        self.closed = (code, reason)


@pytest.mark.parametrize(
    ("failure", "looked_again"),
    [
        (ConnectionRefusedError(), True),
        (InvalidMessage("did not receive a valid HTTP response"), False),
        (TimeoutError("timed out during opening handshake"), False),
    ],
)
async def test_a_websocket_is_forwarded_again_only_if_the_peer_refused_the_connection(
    monkeypatch: pytest.MonkeyPatch, failure: Exception, looked_again: bool
) -> None:
    async def connect(*args: Any, **kwargs: Any) -> None:
        raise failure

    monkeypatch.setattr(peers_module.websockets, "connect", connect)
    peers, ws = Peers(OWN, lambda runner_id: asyncio.sleep(0, PEER)), ClientSocket()
    done = await peers.websocket(ws, PEER, ACTOR, "/ws")  # type: ignore[arg-type]
    assert done is not looked_again
    assert ws.closed == (None if looked_again else (1013, "tunnel_lost"))
