"""The gateway: HTTP requests to actors, woken if they sleep, through their runner's tunnel.

    /gateway/{actor_id}/{path}                      an actor by id
    /gateway/{name}/{path}?key=K[&create=1[&pool=P]] by name and key (created if asked)

Seed 002, as the gateway sees it:

    subscribe to the actor's changes, then read it     (a change in between still wakes us)
    not connectable ──▶ wake it; wait for a change (at most ``WAKE_TIMEOUT_S`` in all)
        stopped or asleep again ──▶ wake again (at most ``MAX_REWAKES`` times)
    connectable on (runner, generation), or starting there with its start command sent on
    the socket this coordinator holds (a runner at ``TUNNEL_STARTING`` holds the request
    until the actor accepts connections: the report that it runs is not waited for)
        ──▶ ToClientRequestStart through the runner's socket
        a 503 with x-corral-error: the runner does not have it ──▶ find it again, retry
        (the actor never saw the request; backoff, at most ``MAX_ATTEMPTS`` tries)
    the response streams back as it comes; the client going away aborts the request

A WebSocket upgrade on the same paths is tunnelled too: accepted once the actor accepted
it (its subprotocol passed on), then its messages both ways, each in chunks of at most 64
KiB joined again at the other end (``more``; a runner too old to join them takes messages
of one chunk only); a message over ``MAX_TUNNEL_WS_MESSAGE_BYTES`` closes it with 1009.
Either side closing closes the other (1013: the actor could not be reached).

A request for an actor whose runner is connected to another coordinator (several on one
PostgreSQL database) is forwarded to that one, streamed both ways (``peers.py``); if it
answers that the runner is not there (it moved), or refuses the connection (it died: the
runner is re-owned by the next coordinator it connects to), the gateway looks again for
up to the runner-lost threshold. A peer that fails once it may have taken the request is
``tunnel_lost``: the actor may have run it, and it is never sent twice. WebSocket
upgrades are forwarded the same way.

A request body is sent only once the runner has the actor's port (it acknowledged the
request start), so a retry never needs what the client has already sent. Errors have
stable codes: ``actor_not_found`` and ``actor_destroyed`` (404), ``actor_not_ready`` (503:
not connectable in time), ``tunnel_lost`` (503: its runner was gone longer than its lost
threshold before answering, came back from another coordinator without it (``tunnel.py``),
or the peer it was forwarded to failed with it), ``runner_failed`` (500: the runner could
not forward it); a response that breaks off once started is cut (the client sees an
incomplete response, never a complete wrong one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Annotated, Any, Protocol
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Request, WebSocket
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from corral.actors.lifecycle import ActorState
from corral.actors.model import DEFAULT_POOL, Actor, NewActor, Placement
from corral.coordinator import auth
from corral.coordinator.auth import Access, Principal, require
from corral.coordinator.peers import FORWARDED_HEADER, RUNNER_NOT_HERE, Peers
from corral.coordinator.tunnel import Reply, TunnelHub, TunnelRequest
from corral.errors import CorralError, InvalidRequest, NotFound, Unavailable
from corral.protocol import messages as wire
from corral.protocol.limits import MAX_TUNNEL_CHUNK_BYTES, MAX_TUNNEL_WS_MESSAGE_BYTES
from corral.runner.tunnel import ERROR_HEADER, HOP_BY_HOP, NEVER_SEEN
from corral.wire import check_parameters

log = logging.getLogger("corral.coordinator")

WAKE_TIMEOUT_S = 10.0  # from the first look until the actor must be connectable
MAX_REWAKES = 3  # wakes again after it stopped while we waited
MAX_ATTEMPTS = 4  # tries through a runner (503 + x-corral-error: it did not have the actor)
RETRY_BASE_S = 0.05
PEER_RETRY_S = 0.25  # the runner's coordinator did not have it, or could not be reached
# Never forwarded to an actor: the caller's corral token is not the actor's business.
# (Transfer-Encoding goes to the runner, which drops it: it says a body follows.)
_NOT_FORWARDED = (HOP_BY_HOP - {"transfer-encoding"}) | {"authorization"}
# Never passed back: the coordinator's server writes its own.
_NOT_RETURNED = HOP_BY_HOP | {"date", "server"}
_FORWARDED = FORWARDED_HEADER.encode("latin-1")
_GATEWAY_PARAMS = ("key", "create", "pool")
_BODY_QUEUE_CHUNKS = 4  # client body read ahead of the tunnel (then the client waits)
WS_CLOSE_NORMAL = 1000
WS_CLOSE_TOO_BIG = 1009
WS_CLOSE_INTERNAL_ERROR = 1011
WS_CLOSE_TRY_AGAIN = 1013  # not connected to the actor (unknown, not ready, refused)


class ActorDirectory(Protocol):
    """What the gateway needs of the coordinator's actors (``coordinator/actors.py``)."""

    def changed(self, actor_id: str) -> asyncio.Event: ...

    async def get(self, actor_id: str) -> Actor: ...

    async def wake(self, actor_id: str) -> Actor: ...

    async def known(self, name: str, pool: str) -> bool: ...

    async def create(self, spec: NewActor) -> tuple[Actor, bool]: ...

    async def list(self, **filters: Any) -> list[Actor]: ...


class ClientGone(Exception):
    """The client disconnected: nothing more is sent to it."""


router = APIRouter(tags=["gateway"])
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_PREFIX = "/gateway/"


def route(scope: Scope) -> tuple[str, str] | None:
    """(target, path) of an HTTP request the gateway serves, as its routes below match it;
    None for anything else."""
    at = scope.get("root_path", "")
    path: str = scope["path"]
    if at and path.startswith(at):
        path = path[len(at) :]
    if scope["type"] != "http" or not path.startswith(_PREFIX) or scope["method"] not in _METHODS:
        return None
    target, _, rest = path[len(_PREFIX) :].partition("/")
    return (target, rest) if target else None


async def serve(scope: Scope, receive: Receive, send: Send) -> None:
    """An HTTP request for an actor, as plain ASGI: the coordinator's app hands these over
    before FastAPI's routing (``app.CoordinatorApp``), behind the same ``Guard`` and body
    limit, so a warm request costs no dependency solving. It checks what the routes below
    declare (their access, storable parameters): they stay for the apps without that
    shortcut, and for the tests that walk every route."""
    found = route(scope)
    assert found is not None
    target, path = found
    try:
        auth.check(scope["state"]["principal"], Access.WRITE)
        query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
        check_parameters((("target", target), ("path", path), *query))
    except CorralError as exc:
        await JSONResponse(exc.to_dict(), exc.http_status)(scope, receive, send)
        return
    await _forward(scope["app"].state.coordinator, target, path)(scope, receive, send)


@router.api_route("/gateway/{target}", methods=_METHODS, include_in_schema=False)
@router.api_route("/gateway/{target}/{path:path}", methods=_METHODS, include_in_schema=False)
async def gateway(
    request: Request,
    target: str,
    _: Annotated[Principal, require(Access.WRITE)],
    path: str = "",
) -> Response:
    """Forward the request to the actor (woken if need be); its response streams back."""
    return _Forwarded(_forward(request.app.state.coordinator, target, path))


def _forward(coordinator: Any, target: str, path: str) -> Forward:
    """The forwarding of one request to ``target``'s actor, by ``coordinator``."""
    return Forward(
        coordinator.actors,
        coordinator.tunnels,
        target,
        path,
        coordinator.settings,
        peers=coordinator.peers,
    )


class _Forwarded(Response):
    """A ``Forward`` as a route's response."""

    def __init__(self, forward: Forward) -> None:
        super().__init__()
        self.forward = forward

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.forward(scope, receive, send)


@router.websocket("/gateway/{target}/{path:path}")
async def gateway_websocket(
    websocket: WebSocket,
    target: str,
    path: str,
    _: Annotated[Principal, require(Access.WRITE)],
) -> None:
    """A WebSocket to the actor (woken if need be), tunnelled message by message."""
    coordinator = websocket.app.state.coordinator
    forward = Forward(
        coordinator.actors,
        coordinator.tunnels,
        target,
        path,
        coordinator.settings,
        peers=coordinator.peers,
    )
    await forward.websocket(websocket)


class Forward:
    """The whole exchange, as an ASGI app: it reads the request body and writes the
    response itself, both streamed."""

    def __init__(
        self,
        actors: ActorDirectory,
        tunnels: TunnelHub,
        target: str,
        path: str,
        settings: Any,
        peers: Peers | None = None,
    ) -> None:
        self.actors = actors
        self.tunnels = tunnels
        self.peers = peers  # None: requests are never forwarded to another coordinator
        self.elsewhere_until: float | None = None  # looking for the runner's coordinator
        self.target = target
        self.path = path
        self.lost_after_s = float(settings.ws_lost_after_s)
        self.upload: asyncio.Queue[bytes | None] = asyncio.Queue(_BODY_QUEUE_CHUNKS)
        self.gone = asyncio.Event()  # the client went away (``_left``)
        self.waiting: TunnelRequest | None = None  # a reply of it, in ``_next``
        self.responded = False
        self.pumping: asyncio.Future[None] | None = None  # the body, to the runner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reader = asyncio.create_task(self._read_client(receive))
        try:
            await self._serve(scope, send)
        except ClientGone:
            pass
        except CorralError as exc:
            if not self.responded:
                headers = {ERROR_HEADER: exc.code} if exc.code == RUNNER_NOT_HERE else None
                response = JSONResponse(exc.to_dict(), exc.http_status, headers=headers)
                await response(scope, receive, send)
        finally:
            reader.cancel()

    # ---- the client ------------------------------------------------------------------------

    async def _read_client(self, receive: Receive) -> None:
        """The request body into ``self.upload`` (None at its end), then wait for the client
        to go away."""
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
                data = message.get("body", b"")
                for at in range(0, len(data), MAX_TUNNEL_CHUNK_BYTES):
                    await self.upload.put(data[at : at + MAX_TUNNEL_CHUNK_BYTES])
                if not message.get("more_body", False):
                    await self.upload.put(None)
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    break
        finally:
            self._left()

    def _left(self) -> None:
        """The client went away: wake what waits on the runner for it."""
        self.gone.set()
        if self.waiting is not None:
            self.waiting.wake()

    # ---- the exchange ----------------------------------------------------------------------

    async def _serve(self, scope: Scope, send: Send) -> None:
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        actor_id, query = await self._actor_id(query)
        path = "/" + self.path + (f"?{urlencode(query)}" if query else "")
        headers = tuple(
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name.decode("latin-1").lower() not in _NOT_FORWARDED
        )
        has_body = any(
            name in (b"content-length", b"transfer-encoding") for name, _ in scope["headers"]
        )
        attempt = 0
        while True:
            placement = await self._connectable(actor_id)
            runner_id = placement.runner_id
            if (peer := await self._peer(runner_id, scope)) is not None:
                assert self.peers is not None
                upload = self.upload if has_body else None
                forwarded = f"{peer}/gateway/{actor_id}{path}"
                if await self.peers.forward(forwarded, scope, send, upload, self.gone):
                    return
                await self._look_again(actor_id, runner_id)
                continue
            request = self.tunnels.open(runner_id)
            try:
                start = wire.ToClientRequestStart(
                    request.request_id, 0, actor_id, placement.generation,
                    scope["method"], path, headers, False,
                )  # fmt: skip
                first = await self._start(request, start, has_body)
                if _retryable(first):
                    self.tunnels.placements.forget(actor_id)  # look again next time
                if _retryable(first) and not request.started() and attempt + 1 < MAX_ATTEMPTS:
                    log.info("actor %s not on runner %s: again", actor_id, placement.runner_id)
                    await asyncio.sleep(RETRY_BASE_S * 2**attempt)
                    attempt += 1
                    continue
                if has_body and self.pumping is None:  # it answers while it reads the body
                    self.pumping = asyncio.ensure_future(self._pump_body(request))
                await self._respond(request, first, send)
                return
            except (ClientGone, asyncio.CancelledError):
                await self._abort(request)
                raise
            finally:
                if self.pumping is not None:
                    self.pumping.cancel()
                    self.pumping = None
                request.close()

    async def _peer(self, runner_id: str, scope: Scope) -> str | None:
        """The other coordinator to forward to: None if the runner's socket is here (or
        the store knows of none: it may come here). A request a peer forwarded is never
        forwarded again (``runner_not_here``: that peer looks again)."""
        if self.peers is None or self.tunnels.reachable(runner_id):
            return None
        if any(name == _FORWARDED for name, _ in scope["headers"]):
            raise Unavailable(f"runner {runner_id} is not connected here", code=RUNNER_NOT_HERE)
        return await self.peers.holding(runner_id)

    async def _look_again(self, actor_id: str, runner_id: str) -> None:
        """The runner's coordinator did not have it (it moved) or refused the connection
        (it died: the runner is re-owned when it reconnects): look again shortly, for at
        most the runner-lost threshold."""
        self.tunnels.placements.forget(actor_id)
        now = time.monotonic()
        if self.elsewhere_until is None:
            self.elsewhere_until = now + self.lost_after_s
        if now > self.elsewhere_until:
            raise Unavailable(
                f"runner {runner_id}'s coordinator did not answer", code="tunnel_lost"
            )
        await asyncio.sleep(PEER_RETRY_S)

    async def _start(
        self, request: TunnelRequest, start: wire.ToClientRequestStart, has_body: bool
    ) -> Reply:
        """Send the request, its body once the runner has the actor (``_pump_body``); the
        first reply."""
        if not has_body:
            if request.joins_parts:  # it takes a request that ends with its start
                await request.send(replace(start, end=True))
            else:
                await request.send(start, wire.ToClientRequestEnd(request.request_id, 0))
            return await self._next(request)
        await request.send(start)
        replies = asyncio.ensure_future(self._next(request))
        try:
            while not request.started():
                acked = asyncio.ensure_future(request.acked.wait())
                await asyncio.wait({replies, acked}, return_when=asyncio.FIRST_COMPLETED)
                acked.cancel()
                if replies.done():
                    return replies.result()  # before it took the body: a retry needs none
                request.acked.clear()
            self.pumping = asyncio.ensure_future(self._pump_body(request))
            return await replies
        finally:
            replies.cancel()

    async def _pump_body(self, request: TunnelRequest) -> None:
        while (data := await self.upload.get()) is not None:
            await request.send(wire.ToClientRequestChunk(request.request_id, 0, data, False))
        await request.send(wire.ToClientRequestEnd(request.request_id, 0))

    async def _respond(self, request: TunnelRequest, reply: Reply, send: Send) -> None:
        if isinstance(reply, wire.ToServerResponseAbort):
            await request.consumed(reply, 0)  # the runner keeps it until then
            raise CorralError(reply.reason, code=reply.code)  # 500: the actor failed
        if not isinstance(reply, wire.ToServerResponseStart):
            raise CorralError(f"the runner answered {type(reply).__name__} first")
        self.responded = True
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [
                    (k.encode("latin-1"), v.encode("latin-1"))
                    for k, v in reply.headers
                    if k.lower() not in _NOT_RETURNED
                ],
            }
        )
        if reply.data or reply.end:  # the body's first part, or all of it (TUNNEL_WHOLE)
            more = not reply.end
            await send({"type": "http.response.body", "body": reply.data, "more_body": more})
        await request.consumed(reply, len(reply.data))
        if reply.end:
            return
        while True:
            reply = await self._next(request)
            if isinstance(reply, wire.ToServerResponseChunk):
                await send({"type": "http.response.body", "body": reply.data, "more_body": True})
                await request.consumed(reply, len(reply.data))
            elif isinstance(reply, wire.ToServerResponseEnd):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                await request.consumed(reply, 0)
                return
            else:
                # Broken off after it started: cut the response (never complete a wrong one).
                await request.consumed(reply, 0)
                raise ConnectionAbortedError(f"actor response broke off: {reply}")

    async def _next(self, request: TunnelRequest) -> Reply:
        """The next reply; ``tunnel_lost`` if the runner has had no socket for longer than
        its lost threshold, or came back from another coordinator (``TunnelRequest.lost``);
        ``ClientGone`` when the client leaves first."""
        absent_since: float | None = None
        while True:
            if (reply := request.take()) is not None:
                return reply
            request.check()
            if self.gone.is_set():
                raise ClientGone
            self.waiting = request  # ``_left`` wakes it
            try:
                await request.wait(1.0)
            finally:
                self.waiting = None
            if request.has_reply or request.lost or self.gone.is_set():
                continue
            if self.tunnels.reachable(request.runner_id):
                absent_since = None
            elif absent_since is None:
                absent_since = time.monotonic()
            elif time.monotonic() - absent_since > self.lost_after_s:
                raise Unavailable(
                    f"runner {request.runner_id} went away before answering", code="tunnel_lost"
                )

    async def _abort(self, request: TunnelRequest) -> None:
        try:
            await request.send(wire.ToClientRequestAbort(request.request_id, 0))
        except Exception:  # best effort: the runner may be gone too
            log.debug("abort of %s not sent", request.request_id, exc_info=True)

    # ---- WebSockets ------------------------------------------------------------------------

    async def websocket(self, ws: WebSocket) -> None:
        """Open the actor's WebSocket through the tunnel, then pass messages both ways."""
        scope = ws.scope
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        try:
            actor_id, query = await self._actor_id(query)
            path = "/" + self.path + (f"?{urlencode(query)}" if query else "")
            headers = tuple(
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in scope["headers"]
                if name.decode("latin-1").lower() not in _NOT_FORWARDED
            )
            attempt = 0
            while True:
                placement = await self._connectable(actor_id)
                if (peer := await self._peer(placement.runner_id, scope)) is not None:
                    assert self.peers is not None
                    if await self.peers.websocket(ws, peer, actor_id, path):
                        return
                    await self._look_again(actor_id, placement.runner_id)
                    continue
                request = self.tunnels.open(placement.runner_id)
                try:
                    start = wire.ToClientRequestStart(
                        request.request_id, 0, actor_id, placement.generation,
                        "GET", path, headers, True,
                    )  # fmt: skip
                    await request.send(start)
                    first = await self._next(request)
                    if _retryable(first):
                        self.tunnels.placements.forget(actor_id)
                    if _retryable(first) and attempt + 1 < MAX_ATTEMPTS:
                        await asyncio.sleep(RETRY_BASE_S * 2**attempt)
                        attempt += 1
                        continue
                    if not isinstance(first, wire.ToServerResponseStart) or first.status != 101:
                        await self._abort(request)  # the runner holds the rest until then
                        await ws.close(WS_CLOSE_TRY_AGAIN, "the actor refused the WebSocket")
                        return
                    protocol = next(
                        (v for k, v in first.headers if k.lower() == "sec-websocket-protocol"),
                        None,
                    )
                    await ws.accept(subprotocol=protocol)
                    await request.consumed(first, 0)
                    await self._relay(request, ws)
                    return
                finally:
                    request.close()
        except CorralError as exc:
            if exc.code == RUNNER_NOT_HERE and "websocket.http.response" in scope.get(
                "extensions", {}
            ):  # as an HTTP answer: the peer that forwarded it tells it from a refusal
                denial = JSONResponse(exc.to_dict(), 503, headers={ERROR_HEADER: exc.code})
                await ws.send_denial_response(denial)
                return
            await ws.close(WS_CLOSE_TRY_AGAIN, exc.code)
        except ClientGone:
            pass

    async def _relay(self, request: TunnelRequest, ws: WebSocket) -> None:
        client = asyncio.ensure_future(self._from_client(request, ws))
        parts: list[bytes] = []  # of a message that came in several chunks
        try:
            while True:
                reply = await self._next(request)
                if isinstance(reply, wire.ToServerResponseChunk):
                    parts.append(reply.data)
                    await request.consumed(reply, len(reply.data))
                    if sum(map(len, parts)) > MAX_TUNNEL_WS_MESSAGE_BYTES:
                        await ws.close(WS_CLOSE_TOO_BIG, "message over the tunnel's limit")
                        await self._abort(request)
                        return
                    if reply.more:
                        continue
                    data, parts = b"".join(parts), []
                    if reply.text:
                        await ws.send_text(data.decode())
                    else:
                        await ws.send_bytes(data)
                    continue
                await request.consumed(reply, 0)
                failed = isinstance(reply, wire.ToServerResponseAbort)
                await ws.close(WS_CLOSE_INTERNAL_ERROR if failed else WS_CLOSE_NORMAL)
                return
        except ClientGone:
            await self._abort(request)
        finally:
            client.cancel()

    async def _from_client(self, request: TunnelRequest, ws: WebSocket) -> None:
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    await request.send(wire.ToClientRequestEnd(request.request_id, 0))
                    return
                text, data = message.get("text"), message.get("bytes") or b""
                payload = text.encode() if text is not None else data
                limit = (
                    MAX_TUNNEL_WS_MESSAGE_BYTES if request.joins_parts else MAX_TUNNEL_CHUNK_BYTES
                )
                if len(payload) > limit:
                    await ws.close(WS_CLOSE_TOO_BIG, f"message over {limit // 1024} KiB")
                    await request.send(wire.ToClientRequestEnd(request.request_id, 0))
                    return
                for at in range(0, max(len(payload), 1), MAX_TUNNEL_CHUNK_BYTES):
                    more = at + MAX_TUNNEL_CHUNK_BYTES < len(payload)
                    part = payload[at : at + MAX_TUNNEL_CHUNK_BYTES]
                    chunk = wire.ToClientRequestChunk(
                        request.request_id, 0, part, text is not None, more
                    )
                    await request.send(chunk)
        finally:
            self._left()

    # ---- finding and waking the actor ------------------------------------------------------

    async def _actor_id(self, query: list[tuple[str, str]]) -> tuple[str, list[tuple[str, str]]]:
        """The actor the path names, and the query string to forward to it."""
        params = dict(query)
        if "key" not in params:
            return self.target, query
        forwarded = [(k, v) for k, v in query if k not in _GATEWAY_PARAMS]
        key = params["key"]
        if params.get("create") in ("1", "true"):
            pool = params.get("pool", DEFAULT_POOL)
            if not await self.actors.known(self.target, pool):
                raise InvalidRequest(
                    f"no runner of pool {pool!r} hosts actors named {self.target!r}",
                    code="unknown_actor_name",
                )
            actor, _ = await self.actors.create(NewActor(name=self.target, key=key, pool=pool))
            return actor.id, forwarded
        found = await self.actors.list(name=self.target, key=key, limit=1)
        if not found:
            raise NotFound(f"no actor {self.target!r} with key {key!r}", code="actor_not_found")
        return found[0].id, forwarded

    async def _connectable(self, actor_id: str) -> Placement:
        if (cached := self.tunnels.placements.get(actor_id)) is not None:
            return cached
        deadline = time.monotonic() + WAKE_TIMEOUT_S
        wakes = 0
        moved = True  # it changed since our last wake (or we have not woken it yet)
        while True:
            changed = self.actors.changed(actor_id)  # before the look: see notifier.py
            actor = await self.actors.get(actor_id)
            if actor.state is ActorState.DESTROYED:
                raise NotFound(f"actor {actor_id} was destroyed", code="actor_destroyed")
            if (placement := actor.placement) is not None:
                self.tunnels.placements.put(actor_id, changed, placement)
                return placement
            if (starting := _starting(actor)) is not None and self.tunnels.starting(starting):
                return starting  # its runner holds the request until it accepts connections
            if _asleep(actor.state) and moved:
                # Asleep, or stopped again since we woke it (seed 002: "Receive Stopped msg,
                # retry wake"; a wake it no longer needs is ignored by its lifecycle).
                if wakes > MAX_REWAKES:
                    raise Unavailable(
                        f"actor {actor_id} stopped {wakes} times while waking",
                        code="actor_not_ready",
                    )
                await self.actors.wake(actor_id)
                wakes += 1
                moved = False
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await _changed_within(changed, remaining, self.gone):
                if self.gone.is_set():
                    raise ClientGone
                raise Unavailable(
                    f"actor {actor_id} was not ready within {WAKE_TIMEOUT_S:g} s",
                    code="actor_not_ready",
                )
            moved = True


def _retryable(reply: Reply) -> bool:
    """The runner did not have the actor (it never saw the request): try again. Only the
    runner's own codes say so (a runner keeps the header back from an actor's response)."""
    return (
        isinstance(reply, wire.ToServerResponseStart)
        and reply.status == 503
        and any(k.lower() == ERROR_HEADER and v in NEVER_SEEN for k, v in reply.headers)
    )


def _starting(actor: Actor) -> Placement | None:
    """Where the actor is starting, if it is: not connectable yet, and not cached."""
    if actor.state is not ActorState.STARTING or actor.life.runner_id is None:
        return None
    return Placement(actor.id, actor.life.runner_id, actor.life.generation)


def _asleep(state: ActorState) -> bool:
    """States a wake moves on (a wake while stopping is deferred: will_wake)."""
    return state in (ActorState.SLEEPING, ActorState.STOPPED, ActorState.STOPPING)


async def _changed_within(event: asyncio.Event, timeout: float, gone: asyncio.Event) -> bool:
    waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(gone.wait())]
    done, _ = await asyncio.wait(waiters, timeout=timeout, return_when="FIRST_COMPLETED")
    for waiter in waiters:
        waiter.cancel()
    return waiters[0] in done
