"""The other coordinators on the same database, as the gateway reaches them.

A runner's socket is on one coordinator; the store records which (``runners.coordinator_url``,
written when the socket registers, so a runner that moved away from a dead coordinator is
re-owned by the next one it connects to). A gateway request for an actor whose runner is
connected elsewhere is forwarded there over HTTP, streamed both ways, and marked
(``FORWARDED_HEADER``) so that the peer never forwards it again: if the runner is not
there either (it moved meanwhile), the peer answers 503 with ``x-corral-error`` and this
coordinator looks again.

    client ──▶ A /gateway/… ──(runner on B)──▶ B /gateway/{actor_id}/… ──tunnel──▶ runner

A request goes to the actor at most once. Only a peer that refused the connection
provably never saw it; one that failed once connected (it died, say) may have sent it
through the runner's tunnel already, and the actor may be running it: looking again
would send it a second time (the runner's next socket is on A, a new request there). So
it fails instead (503 ``tunnel_lost``), and kept connections are let go before the peer
would close them as idle (``KEEPALIVE_S``), so that a live peer never fails one that way.

A WebSocket is forwarded the same way: A opens one to B's gateway and, once B accepted
(the actor did), accepts the client's with the same subprotocol and passes messages both
ways until either side closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import websockets
from starlette.types import Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.typing import Subprotocol

from corral.errors import Unavailable
from corral.http_transport import SetupSafeTransport
from corral.protocol.limits import MAX_TUNNEL_CHUNK_BYTES
from corral.runner.tunnel import ERROR_HEADER, HOP_BY_HOP, NEVER_SEEN

log = logging.getLogger("corral.coordinator")

# On a forwarded request: the coordinator that forwarded it (it is not forwarded again).
FORWARDED_HEADER = "x-corral-forwarded-by"
# A forwarded request whose runner is not connected here: the forwarding coordinator looks
# again (503 with x-corral-error, as a runner says an actor is not on it).
RUNNER_NOT_HERE = "runner_not_here"
# A peer's 503 whose x-corral-error says the actor never saw the request: look again.
_LOOK_AGAIN = NEVER_SEEN | {RUNNER_NOT_HERE}
CONNECT_TIMEOUT_S = 2.0
KEEPALIVE_S = 2.0  # below the peer's keep-alive (uvicorn's 5 s): it never closes one we reuse
# Not passed to the coordinator a request is forwarded to (its client writes its own; the
# caller's token goes: the peer checks it too).
_NOT_TO_PEER = HOP_BY_HOP | {FORWARDED_HEADER}
# Never passed back: the coordinator's server writes its own.
_NOT_RETURNED = HOP_BY_HOP | {"date", "server"}
# Close codes a WebSocket may be closed with (1005, 1006 and 1015 are only reported).
_SENDABLE = frozenset({1000, 1001, 1008, 1009, 1011, 1013})


class Peers:
    def __init__(self, own_url: str, owner: Callable[[str], Awaitable[str | None]]) -> None:
        self.own_url = own_url
        self._owner = owner  # runner id → the URL of the coordinator holding its socket
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """Made at the first forward (most coordinators never forward)."""
        if self._client is None:
            # No read timeout: an actor may take its time to answer, or stream for long.
            timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
            limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
            self._client = httpx.AsyncClient(
                timeout=timeout, transport=SetupSafeTransport(limits=limits)
            )
        return self._client

    async def holding(self, runner_id: str) -> str | None:
        """The other coordinator holding the runner's socket; None if it is this one, or
        the store knows of none (the runner is away: it may come back here)."""
        url = await self._owner(runner_id)
        return None if url is None or url == self.own_url else url

    async def forward(
        self,
        url: str,
        scope: Scope,
        send: Send,
        upload: asyncio.Queue[bytes | None] | None,
        gone: asyncio.Event,
    ) -> bool:
        """Forward an HTTP request (its body read from ``upload``, None at its end) to a
        peer's gateway at ``url``, and stream the answer back until it ends or the client
        is ``gone``. False if the peer refused the connection or does not have the runner,
        before any of the body went (the caller looks again); ``tunnel_lost`` if it may
        have taken the request (see the top)."""
        body_sent = False

        async def body(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
            nonlocal body_sent
            while (data := await queue.get()) is not None:
                body_sent = True
                yield data

        headers = [
            (name, value)
            for name, value in scope["headers"]
            if name.decode("latin-1").lower() not in _NOT_TO_PEER
        ]
        headers.append((FORWARDED_HEADER.encode(), self.own_url.encode("latin-1")))
        content = None if upload is None else body(upload)
        outgoing = self.client.build_request(scope["method"], url, headers=headers, content=content)
        try:
            response = await self.client.send(outgoing, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            log.info("gateway: %s not reached (%s)", url, exc)
            return False
        except httpx.TransportError as exc:
            log.info("gateway: %s went away with %s (%r)", url, scope["path"], exc)
            raise Unavailable(f"{url} went away with the request", code="tunnel_lost") from exc
        try:
            unseen = response.headers.get(ERROR_HEADER) in _LOOK_AGAIN
            if response.status_code == 503 and unseen and not body_sent:
                return False
            relay = asyncio.ensure_future(_relay_response(response, send))
            left = asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({relay, left}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                left.cancel()
                if not relay.done():  # the client left: closing the stream tells the peer
                    relay.cancel()
            if not relay.cancelled():
                relay.result()  # broken off once started: raised, the response is cut
            return True
        finally:
            await response.aclose()

    async def websocket(self, ws: WebSocket, peer: str, actor_id: str, path: str) -> bool:
        """Forward the client's WebSocket (not accepted yet) to the peer's gateway, then
        relay messages both ways. False if the peer refused the connection or answered that
        the runner is not there (the caller looks again); any other refusal or failure
        closes the client's socket (1013: the peer may have opened the actor's already)."""
        base = peer.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        protocols = [
            part.strip()
            for name, value in ws.scope["headers"]
            if name == b"sec-websocket-protocol"
            for part in value.decode("latin-1").split(",")
        ]
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in ws.scope["headers"]
            if name == b"authorization"
        ]
        try:
            upstream = await websockets.connect(
                f"{base}/gateway/{actor_id}{path}",
                additional_headers=[*headers, (FORWARDED_HEADER, self.own_url)],
                subprotocols=[Subprotocol(p) for p in protocols] or None,
                max_size=MAX_TUNNEL_CHUNK_BYTES,
                open_timeout=CONNECT_TIMEOUT_S + 10.0,  # the peer may wake the actor first
                compression=None,
            )
        except websockets.InvalidStatus as exc:
            unseen = exc.response.headers.get(ERROR_HEADER) in _LOOK_AGAIN
            if exc.response.status_code == 503 and unseen:
                return False  # the runner is not there (any more): look again
            await ws.close(WS_CLOSE_TRY_AGAIN, f"refused: {exc.response.status_code}")
            return True
        except (TimeoutError, websockets.WebSocketException) as exc:  # once connected, maybe
            await ws.close(WS_CLOSE_TRY_AGAIN, "tunnel_lost")
            log.info("gateway: %s went away with a WebSocket (%r)", peer, exc)
            return True
        except OSError:  # its connection refused (TimeoutError is one, caught above)
            return False
        async with upstream:
            await ws.accept(subprotocol=upstream.subprotocol)
            await _relay(ws, upstream)
        return True

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


WS_CLOSE_TRY_AGAIN = 1013


async def _relay_response(response: httpx.Response, send: Send) -> None:
    headers = [
        (name, value)
        for name, value in response.headers.raw
        if name.decode("latin-1").lower() not in _NOT_RETURNED
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    async for chunk in response.aiter_raw():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _relay(ws: WebSocket, upstream: ClientConnection) -> None:
    """Messages both ways until one side closes; the other is closed with its code."""

    async def to_peer() -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            await upstream.send(text if text is not None else message.get("bytes") or b"")

    async def to_client() -> None:
        async for message in upstream:
            if isinstance(message, str):
                await ws.send_text(message)
            else:
                await ws.send_bytes(message)

    both = [asyncio.ensure_future(to_peer()), asyncio.ensure_future(to_client())]
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in both:
            task.cancel()
        await asyncio.gather(*both, return_exceptions=True)
    await upstream.close()
    code = upstream.close_code if upstream.close_code in _SENDABLE else 1000
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await ws.close(code)
