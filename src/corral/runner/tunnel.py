"""The runner's end of the tunnel: a request the gateway sent for an actor goes to the
actor's local port, and its response comes back, both streamed (seed 002).

    ToClientRequestStart ──▶ port_when_started(actor, generation) ──▶ HTTP/1.1 ──▶ the actor
    ToClientRequestChunk … ToClientRequestEnd ──▶ the request body, as the actor reads it
    ToServerResponseStart, …Chunk (≤ 64 KiB, within the window), …End ◀── the response
    ToServerResponseStart with data and end ◀── a response of a declared length ≤ 64 KiB,
        whole in one message (to a coordinator at ``TUNNEL_WHOLE``)

A request for a generation of an actor that is starting here waits until it accepts
connections (the gateway sends it once the start command went out: ``TUNNEL_STARTING``).
A request for an actor this runner does not have (not here, another generation, its port
not accepting connections, a start that failed) is answered 503 with an
``x-corral-error`` header naming why (``NEVER_SEEN``): the actor never saw it, so the
gateway may find the actor again and retry. The actor's own responses never carry that
header (it is kept back): whatever they say, the actor ran the request. A failure once
the actor may have seen it is a 502 (before the response started) or a
``ToServerResponseAbort`` (after), never retried. ``ToClientRequestAbort`` (the client
went away) closes the connection to the actor. A WebSocket upgrade (``websocket``) opens
one to the actor: its messages are the chunks both ways, a large one in several (101
once open; the end closes it). Numbering, acknowledgements and replay are the link's
(``RunnerConnection``); this module only moves bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Protocol

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.typing import Subprotocol

from corral.protocol import messages as wire
from corral.protocol.limits import MAX_TUNNEL_CHUNK_BYTES, MAX_TUNNEL_WS_MESSAGE_BYTES
from corral.protocol.runner import TunnelReply
from corral.runner.actor_http import ActorBroke, ActorClient, ActorRefused

log = logging.getLogger("corral.runner")

ERROR_HEADER = "x-corral-error"
ACTOR_NOT_HERE = "actor_not_here"  # not on this runner (or another generation): retry elsewhere
ACTOR_UNREACHABLE = "actor_unreachable"  # its port refused the connection: it never saw it
WS_CLOSE_TOO_BIG = 1009
ACTOR_FAILED = "actor_failed"  # the connection broke once the actor may have seen the request
RUNNER_FAILED = "runner_failed"  # forwarding it failed here (a bug): said, never left hanging
# The codes of a 503 that the gateway may send again: the actor never saw the request.
NEVER_SEEN = frozenset({ACTOR_NOT_HERE, ACTOR_UNREACHABLE})
# Hop-by-hop headers (RFC 9110 §7.6.1) and Host: they belong to one connection, not the message.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)


class ActorPorts(Protocol):
    async def port_when_started(self, actor_id: str, generation: int) -> int | None:
        """The local port of that generation of the actor, once it accepts connections;
        None if it is not here, or never will (waiting while it starts)."""
        ...


class TunnelLink(Protocol):
    """What the tunnel needs of the runner's link (the WebSocket transport)."""

    def tunnel_send(self, message: TunnelReply) -> None: ...

    def tunnel_room(self, request_id: str) -> int: ...

    def tunnel_consumed(self, request_id: str, seq: int, nbytes: int, *, final: bool) -> None: ...

    def tunnel_unacknowledged(self, request_id: str) -> int: ...

    def tunnel_forget(self, request_id: str) -> None: ...

    def tunnel_version(self) -> int:
        """What the coordinator's Init says in ``metadata.tunnel`` (``wire.TUNNEL_…``)."""
        ...


def forwarded(headers: wire.Headers) -> list[tuple[str, str]]:
    return [(name, value) for name, value in headers if name.lower() not in HOP_BY_HOP]


@dataclass
class _Forward:
    start: wire.ToClientRequestStart
    body: asyncio.Queue[wire.ToClientRequestChunk | None] = field(default_factory=asyncio.Queue)
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class RunnerTunnel:
    def __init__(self, ports: ActorPorts, link: TunnelLink) -> None:
        self._ports = ports
        self._link = link
        self._forwards: dict[str, _Forward] = {}
        # No read timeout: an actor may stream (server-sent events) for as long as its
        # client listens.
        self._client = ActorClient()

    @property
    def open_requests(self) -> int:
        return len(self._forwards)

    def received(self, message: wire.ToClientRequestStart | wire.ToClientRequestChunk
                 | wire.ToClientRequestEnd | wire.ToClientRequestAbort) -> None:  # fmt: skip
        """A new tunnel message (each once, in order: the link sees to that)."""
        if isinstance(message, wire.ToClientRequestStart):
            forward = _Forward(message)
            if message.end:  # no body, and no ToClientRequestEnd to say so
                forward.body.put_nowait(None)
            self._forwards[message.request_id] = forward
            forward.task = asyncio.get_running_loop().create_task(self._forward(forward))
            return
        found = self._forwards.get(message.request_id)
        if found is None:  # over already (answered 503, or failed): take and drop
            self._link.tunnel_consumed(message.request_id, message.seq, 0, final=True)
            return
        if isinstance(message, wire.ToClientRequestChunk):
            found.body.put_nowait(message)
        elif isinstance(message, wire.ToClientRequestEnd):
            found.body.put_nowait(None)
            self._link.tunnel_consumed(message.request_id, message.seq, 0, final=True)
        else:
            self._link.tunnel_consumed(message.request_id, message.seq, 0, final=True)
            if found.task is not None:
                found.task.cancel()

    def acked(self, request_id: str) -> None:
        """The coordinator consumed some of the response: there may be room for more."""
        forward = self._forwards.get(request_id)
        if forward is not None:
            forward.acked.set()

    def abort_all(self) -> None:
        """The work stopped (the lease ran out): the requests are over with it."""
        for forward in list(self._forwards.values()):
            if forward.task is not None:
                forward.task.cancel()

    async def aclose(self) -> None:
        self.abort_all()
        tasks = [f.task for f in self._forwards.values() if f.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    # ---- one request -----------------------------------------------------------------------

    async def _forward(self, forward: _Forward) -> None:
        start = forward.start
        request_id = start.request_id
        try:
            port = await self._ports.port_when_started(start.actor_id, start.generation)
            if port is None:
                self._answer_error(
                    request_id, 503, ACTOR_NOT_HERE, "the actor is not on this runner"
                )
            elif start.websocket:
                await self._websocket(forward, port)
            else:
                await self._exchange(forward, port)
            await self._until_acknowledged(forward)
        except asyncio.CancelledError:
            pass  # aborted by the client, or the work stopped: nothing more is said
        except Exception:
            log.exception("tunnelled request %s failed", request_id)
            # Said (a 500, or a response cut where it stood), or the gateway's client would
            # wait for an answer that never comes.
            reason = "the runner failed forwarding the request (its log says why)"
            self._send(wire.ToServerResponseAbort(request_id, 0, RUNNER_FAILED, reason))
            await self._until_acknowledged(forward)
        finally:
            self._forwards.pop(request_id, None)
            self._link.tunnel_forget(request_id)

    async def _exchange(self, forward: _Forward, port: int) -> None:
        start = forward.start
        request_id = start.request_id
        names = {name.lower() for name, _ in start.headers}
        has_body = "content-length" in names or "transfer-encoding" in names
        try:
            response = await self._client.send(
                port,
                start.method,
                start.path,
                forwarded(start.headers),
                self._body(forward) if has_body else None,
            )
        except ActorRefused:
            # Refused: the actor's process is gone or not listening; it never saw this.
            self._answer_error(request_id, 503, ACTOR_UNREACHABLE, "the actor's port refused")
            return
        except ActorBroke as exc:
            self._answer_error(request_id, 502, ACTOR_FAILED, f"the actor failed: {exc}")
            return
        try:
            headers = tuple(
                (k, v) for k, v in response.headers if k not in HOP_BY_HOP and k != ERROR_HEADER
            )
            head = wire.ToServerResponseStart(request_id, 0, response.status, headers)
            if (
                response.length is not None
                and response.length <= MAX_TUNNEL_CHUNK_BYTES
                and self._link.tunnel_version() >= wire.TUNNEL_WHOLE
            ):
                # A small body of a declared length: the whole response in one message.
                parts = [data async for data in response.chunks(MAX_TUNNEL_CHUNK_BYTES)]
                self._send(replace(head, data=b"".join(parts), end=True))
                return
            self._send(head)
            async for data in response.chunks(MAX_TUNNEL_CHUNK_BYTES):
                await self._room_for(forward, len(data))
                self._send(wire.ToServerResponseChunk(request_id, 0, data, False))
            self._send(wire.ToServerResponseEnd(request_id, 0))
        except ActorBroke as exc:
            # Before its start (a whole response): a 500 with this code; after: cut off.
            reason = f"the actor's response broke off: {exc}"
            self._send(wire.ToServerResponseAbort(request_id, 0, ACTOR_FAILED, reason))
        finally:
            await response.aclose()

    async def _websocket(self, forward: _Forward, port: int) -> None:
        """A WebSocket upgrade: open one to the actor, then pass messages both ways (one
        message a chunk, at most ``MAX_TUNNEL_CHUNK_BYTES``) until either side closes."""
        start = forward.start
        request_id = start.request_id
        protocols = [
            p.strip()
            for name, value in start.headers
            if name.lower() == "sec-websocket-protocol"
            for p in value.split(",")
        ]
        headers = [
            (k, v)
            for k, v in forwarded(start.headers)
            if not k.lower().startswith("sec-websocket-")
        ]
        try:
            actor = await websockets.connect(
                f"ws://127.0.0.1:{port}{start.path}",
                additional_headers=headers,
                subprotocols=[Subprotocol(p) for p in protocols] or None,
                max_size=self._ws_message_limit(),
                open_timeout=10,
            )
        except OSError:
            self._answer_error(request_id, 503, ACTOR_UNREACHABLE, "the actor's port refused")
            return
        except websockets.InvalidStatus as exc:
            status = exc.response.status_code
            self._answer_error(request_id, status, ACTOR_FAILED, f"the actor refused: {status}")
            return
        except (websockets.WebSocketException, TimeoutError) as exc:
            self._answer_error(request_id, 502, ACTOR_FAILED, f"the actor failed: {exc!r}")
            return
        accepted = (("sec-websocket-protocol", actor.subprotocol),) if actor.subprotocol else ()
        self._send(wire.ToServerResponseStart(request_id, 0, 101, accepted))
        self._link.tunnel_consumed(request_id, 0, 0, final=True)  # messages may come now
        inbound = asyncio.ensure_future(self._to_actor(forward, actor))
        try:
            async for message in actor:
                data = message.encode() if isinstance(message, str) else message
                text = isinstance(message, str)
                for at in range(0, max(len(data), 1), MAX_TUNNEL_CHUNK_BYTES):
                    part = data[at : at + MAX_TUNNEL_CHUNK_BYTES]
                    more = at + MAX_TUNNEL_CHUNK_BYTES < len(data)
                    await self._room_for(forward, len(part))
                    self._send(wire.ToServerResponseChunk(request_id, 0, part, text, more))
            self._send(wire.ToServerResponseEnd(request_id, 0))
        except websockets.ConnectionClosedError as exc:
            reason = f"the actor's WebSocket broke: {exc!r}"
            self._send(wire.ToServerResponseAbort(request_id, 0, ACTOR_FAILED, reason))
        finally:
            inbound.cancel()
            await actor.close()

    async def _to_actor(self, forward: _Forward, actor: ClientConnection) -> None:
        """The client's messages to the actor (joined from their chunks); the client
        closing closes it."""
        parts: list[bytes] = []
        while (chunk := await forward.body.get()) is not None:
            parts.append(chunk.data)
            self._link.tunnel_consumed(chunk.request_id, chunk.seq, len(chunk.data), final=False)
            if sum(map(len, parts)) > MAX_TUNNEL_WS_MESSAGE_BYTES:
                await actor.close(WS_CLOSE_TOO_BIG, "message over the tunnel's limit")
                return
            if chunk.more:
                continue
            data, parts = b"".join(parts), []
            await actor.send(data.decode() if chunk.text else data)
        await actor.close()

    def _ws_message_limit(self) -> int:
        """The largest WebSocket message the actor may send: one chunk unless the
        coordinator joins parts."""
        joins = self._link.tunnel_version() >= wire.TUNNEL_PARTS
        return MAX_TUNNEL_WS_MESSAGE_BYTES if joins else MAX_TUNNEL_CHUNK_BYTES

    async def _body(self, forward: _Forward) -> AsyncIterator[bytes]:
        # The actor's port answered: the gateway may send the body now (until then it may
        # still retry elsewhere without it).
        self._link.tunnel_consumed(forward.start.request_id, 0, 0, final=True)
        while (chunk := await forward.body.get()) is not None:
            yield chunk.data
            # Taken by the connection to the actor: the coordinator may send more.
            self._link.tunnel_consumed(chunk.request_id, chunk.seq, len(chunk.data), final=False)

    async def _room_for(self, forward: _Forward, nbytes: int) -> None:
        while self._link.tunnel_room(forward.start.request_id) < nbytes:
            forward.acked.clear()
            await forward.acked.wait()

    async def _until_acknowledged(self, forward: _Forward) -> None:
        """Keep the request until the coordinator has everything: a socket may break first,
        and then the link sends the rest again on the next one."""
        while self._link.tunnel_unacknowledged(forward.start.request_id):
            forward.acked.clear()
            await forward.acked.wait()

    def _answer_error(self, request_id: str, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        headers = (("content-type", "application/json"), (ERROR_HEADER, code))
        if self._link.tunnel_version() >= wire.TUNNEL_WHOLE:
            self._send(wire.ToServerResponseStart(request_id, 0, status, headers, body, True))
            return
        self._send(wire.ToServerResponseStart(request_id, 0, status, headers))
        self._send(wire.ToServerResponseChunk(request_id, 0, body, False))
        self._send(wire.ToServerResponseEnd(request_id, 0))

    def _send(self, message: TunnelReply) -> None:
        self._link.tunnel_send(message)
