"""Fan-out of the event log to the ``GET /events`` streams of this coordinator.

One pump per coordinator reads the log (numbering it first on PostgreSQL) after each store
call it is woken for (``EVENTS``, notified by ``Coordinator._db``), or every
``poll_interval_s`` for what other processes wrote, and offers each batch to every
subscription. A subscription keeps at most ``capacity`` events: one that falls further
behind is dropped (its stream says so and ends; the client resumes from its last id,
read from the store), so a slow reader never makes the coordinator buffer without bound.

Joining without a gap or a duplicate::

    subscribe()      live_from = the pump's cursor (all it offers later is newer)
    catch_up()       the store's events in (after, live_from], page by page
    then the queue   the pump's events, > live_from; none at or before ``after``

The pump runs only while someone subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TypeVar

import anyio.to_thread

from corral.coordinator.metrics import Metrics
from corral.coordinator.notifier import Notifier, wait_for
from corral.events import Event, EventFilter
from corral.store.events import EventStore

EVENTS = "events"  # the notifier's topic: the store may have new events
PAGE = 500
ROUND_S = 0.01  # the pump reads at most this often (see _run)
log = logging.getLogger("corral.coordinator")
T = TypeVar("T")


class Subscription:
    def __init__(self, where: EventFilter, live_from: int, capacity: int) -> None:
        self.where = where
        self.live_from = live_from
        self.capacity = capacity
        self.queue: deque[Event] = deque()
        self.ready = asyncio.Event()
        self.dropped = False

    def offer(self, events: list[Event]) -> None:
        if self.dropped:
            return
        self.queue.extend(e for e in events if self.where.matches(e))
        if len(self.queue) > self.capacity:
            self.dropped = True
            self.queue.clear()
        if self.queue or self.dropped:
            self.ready.set()

    def take(self) -> list[Event]:
        taken = list(self.queue)
        self.queue.clear()
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

    async def _run(self) -> None:
        last_round = 0.0
        while True:
            async with self._starting:  # against a subscribe() that would find it running
                if not self.subscriptions:
                    self._cursor = None  # when someone comes, start from the newest again
                    self._pump = None
                    return
            # Under a stream of changes, rounds come at most every ROUND_S: each round is a
            # read (and on PostgreSQL a numbering commit) that dispatch would wait behind;
            # a change after a quiet spell is read at once.
            since = asyncio.get_running_loop().time() - last_round
            if since < ROUND_S:
                await asyncio.sleep(ROUND_S - since)
            last_round = asyncio.get_running_loop().time()
            woken = self.notifier.event(EVENTS)
            try:
                if self.events.numbered_later:
                    await self.in_thread(self.events.number)
                batch = await self.in_thread(
                    self.events.read, self._cursor or 0, EventFilter(), PAGE
                )
            except Exception:  # a database hiccup: try again at the next wake-up
                log.exception("reading events failed; retrying")
                batch = []
            if batch:
                self._cursor = batch[-1].id
                for subscription in list(self.subscriptions):
                    subscription.offer(batch)
            if len(batch) < PAGE:
                await wait_for(woken, self.poll_interval_s)

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
