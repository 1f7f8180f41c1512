"""Fan-out of the event log to the ``GET /events`` streams of this coordinator.

One pump per coordinator reads the log (numbering it first on PostgreSQL, in the same
transaction) after each store call it is woken for (``EVENTS``, notified by
``Coordinator._db``), or every ``poll_interval_s`` for what other processes wrote: one
read per round, however many subscribers. Each round is filtered once per distinct filter
and encoded once per filter (``Batch``): fifty dashboards with the same filter share one
list and one chunk of bytes. A subscription keeps at most ``capacity`` events: one that
falls further behind is dropped (its stream says so and ends; the client resumes from its
last id, read from the store), so a slow reader never makes the coordinator buffer
without bound.

Joining without a gap or a duplicate::

    subscribe()      live_from = the pump's cursor (all it offers later is newer)
    catch_up()       the store's events in (after, live_from], page by page
    then the queue   the pump's events, > live_from; none at or before ``after``

The pump runs only while someone subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TypeVar

import anyio.to_thread

from corral.coordinator.metrics import Metrics
from corral.coordinator.notifier import Notifier, wait_for
from corral.events import Event, EventFilter, sse
from corral.store.events import EventStore

EVENTS = "events"  # the notifier's topic: the store may have new events
PAGE = 500
# How often the pump reads under a stream of changes. Each round writes to every stream
# (one write each: ~50 µs of the coordinator's CPU with the server's machinery), so fifty
# streams fed every 10 ms would cost a quarter of a core whatever the rate of changes.
# Rounds come at most every ROUND_PER_STREAM_S a stream (ROUND_S at least, MAX_ROUND_S at
# most): the streams cost at most ~500 writes a second, a few hundredths of a core, and a
# change waits up to 0.1 s more with fifty streams under a stream of changes (a change
# after a quiet spell is read at once).
ROUND_S = 0.01
ROUND_PER_STREAM_S = 0.002
MAX_ROUND_S = 0.1
KEEPALIVE_S = 15.0  # a stream quiet this long sends a comment (every poll_interval_s or so)
log = logging.getLogger("corral.coordinator")
T = TypeVar("T")


class Batch:
    """A round's events that one filter wants, and their encoding, made once for every
    subscription with that filter."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    @classmethod
    def of(cls, events: list[Event], where: EventFilter) -> Batch:
        return cls([e for e in events if where.matches(e)])

    @functools.cached_property
    def encoded(self) -> bytes:
        return b"".join(sse(event) for event in self.events)

    def after(self, last: int) -> bytes:
        """The batch as sent by a stream whose last event was ``last``: the shared bytes
        unless the stream already sent some of it (its catch-up read overlapped)."""
        if not self.events or self.events[0].id > last:
            return self.encoded
        return b"".join(sse(event) for event in self.events if event.id > last)


class Subscription:
    def __init__(self, where: EventFilter, live_from: int, capacity: int) -> None:
        self.where = where
        self.live_from = live_from
        self.capacity = capacity
        self.queue: deque[Batch] = deque()
        self.queued = 0  # events in the queue
        self.ready = asyncio.Event()
        self.dropped = False
        self.keepalive = False  # a keepalive is due, if nothing else is sent (see nudge)
        self.ended = False  # the coordinator is stopping: the stream ends (see end_streams)

    def end(self) -> None:
        self.ended = True
        self.ready.set()

    def nudge(self) -> None:
        """Wake the stream for a keepalive (it sends one if it has nothing else)."""
        self.keepalive = True
        self.ready.set()

    def offer(self, batch: Batch) -> None:
        """Queue ``batch`` (already filtered by ``where``: see ``Batch.of``)."""
        if self.dropped or not batch.events:
            return
        self.queue.append(batch)
        self.queued += len(batch.events)
        if self.queued > self.capacity:
            self.dropped = True
            self.queue.clear()
            self.queued = 0
        self.ready.set()

    def take(self) -> list[Batch]:
        taken = list(self.queue)
        self.queue.clear()
        self.queued = 0
        self.ready.clear()
        return taken


class EventHub:
    def __init__(
        self,
        events: EventStore,
        notifier: Notifier,
        metrics: Metrics,
        *,
        poll_interval_s: float = 1.0,
        capacity: int = 10_000,
    ) -> None:
        self.events = events
        self.notifier = notifier
        self.metrics = metrics
        self.poll_interval_s = poll_interval_s
        self.capacity = capacity
        self.subscriptions: set[Subscription] = set()
        self._cursor: int | None = None  # the last id offered; None while the pump is off
        self._pump: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        self._closing = False
        self._keepalive_at = 0.0  # the pump's clock: when the streams are nudged next

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        # Not through ``Coordinator._db``: that wakes the pump, which would wake itself.
        return await anyio.to_thread.run_sync(partial(fn, *args))

    async def subscribe(self, where: EventFilter) -> Subscription:
        async with self._starting:
            if self._cursor is None:
                if self.events.numbered_later:
                    await self.in_thread(self.events.number)
                self._cursor = await self.in_thread(self.events.latest)
            subscription = Subscription(where, self._cursor, self.capacity)
            if self._closing:
                subscription.end()
            self.subscriptions.add(subscription)
            self.metrics.event_subscribers.set(len(self.subscriptions))
            if self._pump is None or self._pump.done():
                self._pump = asyncio.create_task(self._run())
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self.subscriptions.discard(subscription)
        self.metrics.event_subscribers.set(len(self.subscriptions))

    async def catch_up(self, where: EventFilter, after: int, until: int) -> AsyncIterator[Event]:
        """The stored events in (``after``, ``until``] that ``where`` wants, in order."""
        while after < until:
            page = await self.in_thread(self.events.read, after, where, PAGE)
            for event in page:
                if event.id > until:
                    return
                yield event
            if len(page) < PAGE:
                return
            after = page[-1].id

    @property
    def round_s(self) -> float:
        """The least time between two rounds of the pump (see ROUND_S)."""
        return min(MAX_ROUND_S, max(ROUND_S, ROUND_PER_STREAM_S * len(self.subscriptions)))

    async def _run(self) -> None:
        last_round = 0.0
        while True:
            async with self._starting:  # against a subscribe() that would find it running
                if not self.subscriptions:
                    self._cursor = None  # when someone comes, start from the newest again
                    self._pump = None
                    return
            # Under a stream of changes, rounds come at most every ``round_s``: each round is
            # a read (and on PostgreSQL a numbering commit) that dispatch would wait behind,
            # and a write to every stream; a change after a quiet spell is read at once.
            since = asyncio.get_running_loop().time() - last_round
            if since < self.round_s:
                await asyncio.sleep(self.round_s - since)
            last_round = asyncio.get_running_loop().time()
            woken = self.notifier.event(EVENTS)
            try:
                batch = await self.in_thread(self.events.number_and_read, self._cursor or 0, PAGE)
            except Exception:  # a database hiccup: try again at the next wake-up
                log.exception("reading events failed; retrying")
                batch = []
            if batch:
                self._cursor = batch[-1].id
                self._fan_out(batch)
            self.nudge_when_due(last_round)
            if len(batch) < PAGE:
                await wait_for(woken, self.poll_interval_s)

    def nudge_when_due(self, now: float) -> None:
        """Every KEEPALIVE_S (by the pump's clock ``now``), wake each stream for a keepalive."""
        if now < self._keepalive_at:
            return
        if self._keepalive_at:
            for subscription in list(self.subscriptions):
                subscription.nudge()
        self._keepalive_at = now + KEEPALIVE_S

    def _fan_out(self, events: list[Event]) -> None:
        batches: dict[EventFilter, Batch] = {}
        for subscription in list(self.subscriptions):
            where = subscription.where
            if where not in batches:
                batches[where] = Batch.of(events, where)
            subscription.offer(batches[where])

    def end_streams(self) -> None:
        """The coordinator is stopping: every stream ends now, cleanly, after what it has
        sent (its client resumes after the last id it got, here once restarted or at
        another coordinator), instead of holding the server's shutdown for its grace and
        then being cut mid-stream."""
        self._closing = True
        for subscription in list(self.subscriptions):
            subscription.end()

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
