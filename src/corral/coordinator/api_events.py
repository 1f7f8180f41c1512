"""``GET /events``: the event log as server-sent events (see ``corral.events`` for what an
event holds, ``event_hub`` for how streams are fed).

The stream opens with ``ready`` (``id:`` the position it starts after), sends the stored
events after it, then ``caught_up`` (``id:`` the newest event when the stream opened: what
came before is all sent), then each event as it commits; every event as
``id:``/``event:``/``data:``, and a ``: keepalive`` comment when quiet. ``ready``,
``caught_up`` and ``dropped`` carry ``{"last_event_id": …}``, their ``id:``. A client
resumes after the last id it saw with ``Last-Event-ID`` (what a browser's EventSource
sends by itself) or ``?after=``: it gets every event after it, once, even across a
restart of the coordinator. Without either, the stream starts at the newest event.

Refused before streaming: an unknown kind (422 ``invalid_request``), a ``run_id``,
``session``, ``plan``, ``runner`` or ``actor`` that does not exist (404; a ``pool`` is
any name: pools exist by being named), a resume id no event had
(422 ``unknown_event_id``) or one whose successors retention deleted (410
``events_expired``). A stream that falls more than ``event_queue_size`` events behind
gets ``dropped`` (``{"reason": "slow_consumer", "last_event_id": …}``) and ends. A
coordinator stopping ends its streams at once, cleanly: their clients resume elsewhere or
once it is back, and its shutdown does not wait for them.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from corral.coordinator.auth import Access, require
from corral.coordinator.event_hub import Encoding, EventHub, Subscription, encoding_for
from corral.coordinator.schemas import error_responses
from corral.coordinator.service import Coordinator
from corral.errors import InvalidRequest, NotFound
from corral.events import EventFilter, encoded, sse_message
from corral.wire import Int64

router = APIRouter()
MEDIA_TYPE = "text/event-stream"


@router.get(
    "/events",
    tags=["events"],
    dependencies=[require(Access.READ)],
    response_class=StreamingResponse,
    responses={
        200: {"description": "server-sent events", "content": {MEDIA_TYPE: {}}},
        **error_responses(410),
    },
)
async def events(
    request: Request,
    kind: Annotated[str | None, Query(description="comma-separated kinds")] = None,
    run_id: str | None = None,
    session: Annotated[str | None, Query(description="a session's id or name")] = None,
    plan: Annotated[str | None, Query(description="a task plan's project id")] = None,
    runner: Annotated[str | None, Query(description="a runner id")] = None,
    actor: Annotated[str | None, Query(description="an actor id")] = None,
    pool: Annotated[str | None, Query(description="a pool's name")] = None,
    after: Annotated[Int64 | None, Query(ge=0, description="resume after this id")] = None,
    last_event_id: Annotated[str | None, Header(description="resume after this id")] = None,
) -> Response:
    """The store's changes and log lines as they commit (server-sent events)."""
    coordinator: Coordinator = request.app.state.coordinator
    where = EventFilter.parse(kind, run_id, session, plan, runner, actor, pool)
    await _check_named(coordinator, where)
    resume = _resume_id(last_event_id, after)
    hub = coordinator.events
    if resume is not None:
        await hub.in_thread(hub.events.check_resume, resume)
    subscription = await hub.subscribe(where)
    start = subscription.live_from if resume is None else resume
    encoding = encoding_for(request.headers.get("accept-encoding"))
    return EventStream(hub, subscription, start, encoding)


class EventStream(Response):
    """The stream as an ASGI response of its own. Its task sends ``ready`` and the
    catch-up, attaches the subscription (from then on the pump writes the events: see
    ``Subscription``), then only waits for the stream's end or its client's going. Its
    bytes are deflated when the client accepts it (see ``event_hub.Deflated``)."""

    media_type = MEDIA_TYPE

    def __init__(
        self, hub: EventHub, subscription: Subscription, after: int, encoding: Encoding
    ) -> None:
        # As StreamingResponse: no body, so no content-length (the body is chunked).
        self.status_code = 200
        self.background = None
        headers = {
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            "Vary": "Accept-Encoding",
        }
        if encoding.name is not None:
            headers["Content-Encoding"] = encoding.name
        self.init_headers(headers)
        self.hub = hub
        self.subscription = subscription
        self.after = after
        self.encoding = encoding

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        subscription = self.subscription
        encoding = self.encoding

        async def write(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        async def write_own(plain: bytes) -> None:  # this stream's alone: encoded here
            await write(encoding.message(plain))

        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            last = self.after
            await write_own(sse_message("ready", {"last_event_id": last}, event_id=last))
            pages = self.hub.catch_up(subscription.where, last, subscription.live_from)
            async for page in pages:
                await write_own(encoded(page))
                last = page[-1].id
            # Every stored event the filter wants is sent: the position is the pump's.
            last = max(last, subscription.live_from)
            await write_own(sse_message("caught_up", {"last_event_id": last}, event_id=last))
            subscription.attach(write, last, encoding)
            ended = asyncio.ensure_future(subscription.done.wait())
            await asyncio.wait((gone, ended), return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            if gone.done() or subscription.broken:
                return
            await subscription.settled()  # the pump's last write, if under way
            if subscription.dropped:
                await write_own(_dropped(subscription))
            # Ended: dropped, or the coordinator is stopping (EventHub.end_streams).
            await send({"type": "http.response.body", "body": encoding.end(), "more_body": False})
        finally:
            gone.cancel()
            subscription.cancel()
            self.hub.unsubscribe(subscription)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _dropped(subscription: Subscription) -> bytes:
    return sse_message(
        "dropped",
        {
            "reason": "slow_consumer",
            "last_event_id": subscription.last,
            "message": f"this stream fell more than {subscription.capacity} events "
            "behind; resume after last_event_id",
        },
        event_id=subscription.last,
    )


def _resume_id(header: str | None, after: int | None) -> int | None:
    if header is None or not header.strip():
        return after
    if not header.strip().isdigit():
        raise InvalidRequest(f"Last-Event-ID {header[:40]!r} is not an event id")
    return int(header.strip())


async def _check_named(coordinator: Coordinator, where: EventFilter) -> None:
    """A filter naming what does not exist would match nothing, forever: refuse it (404)."""
    store = coordinator.store
    if where.run_id is not None:
        await coordinator.in_thread(store.runs.get, where.run_id)
    if where.runner is not None:
        await coordinator.in_thread(store.runners.get, where.runner)
    if where.actor is not None:
        await coordinator.in_thread(store.actors.get, where.actor)
    if where.plan is not None:
        await coordinator.in_thread(store.projects.get, where.plan)
    if where.session is not None and not await coordinator.in_thread(
        coordinator.events.events.session_known, where.session
    ):
        raise NotFound.of("session", where.session)
