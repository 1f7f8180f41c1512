"""Fan-out of the event log to the ``GET /events`` streams of this coordinator.

One pump per coordinator reads the log (numbering it first on PostgreSQL, in the same
transaction) after each store call it is woken for (``EVENTS``, notified by
``Coordinator._db``), or every ``poll_interval_s`` for what other processes wrote: one
read per round, however many subscribers. The store reads a round as one text per
distinct filter of the open streams, each made and joined inside the database
(``EventStore.read_round``: no row, no value, no GIL hand-off an event in Python), and the
pump's thread makes it a ``Batch`` (encoded, and compressed once if a stream deflates):
fifty dashboards with the same filter share one chunk of bytes, which the pump writes to
each stream itself (see ``Subscription``). A subscription keeps at most ``capacity``
events: one that falls further behind (its socket full) is dropped (its stream says so
and ends; the client resumes from its last id, read from the store), so a slow reader
never makes the coordinator buffer without bound.

Joining without a gap or a duplicate::

    subscribe()      live_from = the pump's cursor (all it offers later is newer)
    catch_up()       the store's events in (after, live_from], page by page
    attach()         the queue, then each round's events as the pump writes them,
                     > live_from; none at or before ``after``

The pump runs only while someone subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from functools import partial
from typing import Any, TypeVar

import anyio.to_thread

from corral.coordinator.deflate import DeflateStream, Piece, accepts_deflate, compress
from corral.coordinator.metrics import Metrics
from corral.coordinator.notifier import Notifier, wait_for
from corral.events import KEEPALIVE, Event, EventFilter, EventText
from corral.store.events import EventStore

EVENTS = "events"  # the notifier's topic: the store may have new events
PAGE = 500
# A round reads up to this many pages: with a round every 0.1 s (fifty streams) one page a
# round would cap the streams at 5,000 events a second, fewer than dispatch makes on SQLite
# (~1,800 runs/s, 3–4 events each), and they would fall ever further behind.
ROUND_PAGES = 8
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
# Writes bytes to one stream (an ASGI ``send`` of a body chunk): returns once they are in
# the socket's buffer, after waiting for room if the client reads slowly.
Writer = Callable[[bytes], Coroutine[Any, Any, None]]


class Batch:
    """A round's events that one filter wants, as the stream sends them (read so from the
    store: ``EventStore.read_round``), and their compression, made once for every
    subscription with that filter."""

    def __init__(self, text: EventText) -> None:
        self.size = text.size
        self.first = text.first
        self.last = text.last
        self.encoded = text.sse.encode()
        self._deflated: Piece | None = None

    def after(self, last: int) -> bytes:
        """The batch as sent by a stream whose last event was ``last``: the shared bytes
        unless the stream already sent some of it (its catch-up read overlapped): then the
        messages after it (each ends in a blank line, which no ``data:`` line holds)."""
        if self.whole_after(last):
            return self.encoded
        messages = self.encoded.split(b"\n\n")[:-1]
        return b"".join(m + b"\n\n" for m in messages if _message_id(m) > last)

    def whole_after(self, last: int) -> bool:
        return not self.size or self.first > last

    @property
    def deflated(self) -> Piece:
        """The batch compressed on its own, once for every deflate stream (see ``deflate``)."""
        if self._deflated is None:
            self._deflated = compress(self.encoded)
        return self._deflated


def _batches(texts: dict[EventFilter, EventText], deflate: bool) -> dict[EventFilter, Batch]:
    batches = {where: Batch(text) for where, text in texts.items()}
    if deflate:
        for batch in batches.values():
            batch.deflated  # noqa: B018  # made now, in the caller's thread
    return batches


def _message_id(message: bytes) -> int:
    return int(message.split(b"\n", 1)[0].removeprefix(b"id: "))


class Encoding:
    """How a stream's bytes go on the wire: as they are (``identity``)."""

    name: str | None = None  # its Content-Encoding

    def message(self, plain: bytes) -> bytes:
        """Bytes of this stream alone (its ``ready``, its catch-up, ``dropped``)."""
        return plain

    def keepalive(self) -> bytes:
        return KEEPALIVE

    def batch(self, batch: Batch, last: int) -> bytes:
        """A round's batch, as sent by a stream whose last event was ``last``."""
        return batch.after(last)

    def end(self) -> bytes:
        return b""


class Deflated(Encoding):
    """Deflate (``Content-Encoding: deflate``): a batch's bytes are compressed once for
    every stream that sends it whole; what is this stream's alone is compressed here."""

    name = "deflate"

    def __init__(self) -> None:
        self.stream = DeflateStream()

    def message(self, plain: bytes) -> bytes:
        return self.stream.send(compress(plain))

    def keepalive(self) -> bytes:
        return self.stream.send(_DEFLATED_KEEPALIVE)  # compressed once, for every stream

    def batch(self, batch: Batch, last: int) -> bytes:
        if batch.whole_after(last):
            return self.stream.send(batch.deflated)
        tail = batch.after(last)  # a catch-up read sent the rest already
        return self.message(tail) if tail else b""

    def end(self) -> bytes:
        return self.stream.end()


def encoding_for(accept_encoding: str | None) -> Encoding:
    """Deflate when the client accepts it (browsers and httpx do), else as they are."""
    return Deflated() if accepts_deflate(accept_encoding) else Encoding()


_DEFLATED_KEEPALIVE = compress(KEEPALIVE)


class Subscription:
    """One stream's place in the fan-out. Until ``attach`` (its catch-up is sent) what
    the pump offers waits in its queue; from then on the pump writes it to the stream
    itself, in its round, through the stream's ``Writer``: no task of the stream's wakes
    up for it (fifty such wake-ups each round, each resuming a generator under
    Starlette's streaming response, were most of what the streams cost the coordinator).
    A write that waits for a slow socket goes on in a task of its own while the next
    batches queue behind it: past ``capacity`` events the stream is dropped."""

    def __init__(self, where: EventFilter, live_from: int, capacity: int) -> None:
        self.where = where
        self.live_from = live_from
        self.capacity = capacity
        self.queue: deque[Batch] = deque()
        self.queued = 0  # events in the queue
        self.last = live_from  # the last event written (once attached)
        self.done = asyncio.Event()  # the stream ends: dropped, ended, or a write failed
        self.dropped = False
        self.ended = False  # the coordinator is stopping (see end_streams)
        self.broken = False  # a write failed: the stream writes nothing more
        self._write: Writer | None = None
        self.encoding = Encoding()
        self._sending: asyncio.Task[None] | None = None  # a write waiting for its socket

    def attach(self, write: Writer, last: int, encoding: Encoding) -> None:
        """The stream sent its catch-up up to ``last``: the pump writes the rest, in
        ``encoding`` (the stream's, which wrote what came before)."""
        self._write = write
        self.last = last
        self.encoding = encoding
        self._flush()

    def end(self) -> None:
        self.ended = True
        self.done.set()

    def nudge(self) -> None:
        """A keepalive, unless the stream has a write under way (a write is traffic)."""
        if self._write is not None and self._sending is None and not self.done.is_set():
            self._send(self.encoding.keepalive())

    def offer(self, batch: Batch) -> None:
        """Queue ``batch`` (already filtered by ``where``: ``EventStore.read_round``) and write
        what is queued if the stream is attached and no write of its is under way."""
        if self.dropped or not batch.size:
            return
        self.queue.append(batch)
        self.queued += batch.size
        if self.queued > self.capacity:
            self.dropped = True
            self.queue.clear()
            self.queued = 0
            self.done.set()
            return
        self._flush()

    def take(self) -> list[Batch]:
        taken = list(self.queue)
        self.queue.clear()
        self.queued = 0
        return taken

    async def settled(self) -> None:
        """The write under way, if any, is over (the stream may write after it)."""
        if self._sending is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(self._sending)

    def cancel(self) -> None:
        """The stream is gone: no write of it goes on."""
        self.done.set()
        if self._sending is not None:
            self._sending.cancel()

    def _flush(self) -> None:
        if self._write is None or self._sending is not None or self.done.is_set():
            return
        if not self.queue:
            return
        # What came since the last write goes out as one write; each batch's bytes were
        # made once for every stream with this filter. (One batch, the usual case, without
        # a list and a join: this runs for every stream each round.)
        if len(self.queue) == 1:
            batch = self.queue.popleft()
            self.queued = 0
            chunk = self.encoding.batch(batch, self.last)
        else:
            batches = self.take()
            chunk = b"".join([self.encoding.batch(batch, self.last) for batch in batches])
            batch = batches[-1]
        self.last = max(self.last, batch.last)
        if chunk:
            self._send(chunk)

    def _send(self, chunk: bytes) -> None:
        assert self._write is not None
        try:
            self._sending = start_eagerly(self._write(chunk))
        except Exception:
            log.debug("an event stream's write failed; it ends", exc_info=True)
            self.broken = True
            self.done.set()
            return
        if self._sending is not None:
            self._sending.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending = None
        if task.cancelled() or task.exception() is not None:
            self.broken = True
            self.done.set()
            return
        self._flush()


def start_eagerly(coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coroutine`` here and now until it first waits: ``None`` if it finished
    without waiting (a write to a socket with room: the usual case), else a task that
    runs the rest. (What Python 3.12's eager tasks do; a task for every write would
    cost as much as the wake-up it replaces.)"""
    try:
        waiting = coroutine.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_Resumed(coroutine, waiting).run())


class _Resumed:
    """The rest of a coroutine that already ran until it yielded ``waiting`` (the future
    it waits for, as a task would have seen it), awaited as if it had not started."""

    def __init__(self, coroutine: Coroutine[Any, Any, None], waiting: object) -> None:
        self.coroutine = coroutine
        self.waiting = waiting

    async def run(self) -> None:
        await self

    def __await__(self) -> Generator[Any, Any, None]:
        waiting = self.waiting
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # cancelled (or thrown in): the coroutine's to take
                try:
                    waiting = self.coroutine.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = self.coroutine.send(sent)
                except StopIteration:
                    return


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

    async def catch_up(
        self, where: EventFilter, after: int, until: int
    ) -> AsyncIterator[list[Event]]:
        """The stored events in (``after``, ``until``] that ``where`` wants, in order, a
        page at a time."""
        while after < until:
            page = await self.in_thread(self.events.read, after, where, PAGE)
            wanted = [event for event in page if event.id <= until]
            if wanted:
                yield wanted
            if len(page) < PAGE or len(wanted) < len(page):
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
                read = await self._read_round(self._cursor or 0)
            except Exception:  # a database hiccup: try again at the next wake-up
                log.exception("reading events failed; retrying")
                read = 0
            self.nudge_when_due(last_round)
            if read < PAGE * ROUND_PAGES:
                await wait_for(woken, self.poll_interval_s)

    async def _read_round(self, after: int) -> int:
        """Read what came since ``after`` (up to ROUND_PAGES pages: one round, one write a
        stream for all of it) as each open filter's batch, and offer it: how many events."""
        deflate = any(isinstance(s.encoding, Deflated) for s in self.subscriptions)
        wanted = {s.where for s in self.subscriptions}
        until, count, batches = await self.in_thread(self._read, after, wanted, deflate)
        # Whoever subscribed meanwhile with a filter of its own has this round too.
        while missing := {s.where for s in self.subscriptions} - batches.keys():
            texts = await self.in_thread(self.events.read_texts, after, until, missing)
            batches |= _batches(texts, deflate)
        self._cursor = until
        self._fan_out(batches)
        return count

    def _read(
        self, after: int, wanted: set[EventFilter], deflate: bool
    ) -> tuple[int, int, dict[EventFilter, Batch]]:
        """The store's round, made batches (encoded, and compressed if a stream deflates)
        here in the pump's thread, not in the event loop's."""
        until, count, texts = self.events.read_round(after, wanted, PAGE * ROUND_PAGES)
        return until, count, _batches(texts, deflate)

    def nudge_when_due(self, now: float) -> None:
        """Every KEEPALIVE_S (by the pump's clock ``now``), a keepalive to each stream."""
        if now < self._keepalive_at:
            return
        if self._keepalive_at:
            for subscription in list(self.subscriptions):
                subscription.nudge()
        self._keepalive_at = now + KEEPALIVE_S

    def _fan_out(self, batches: dict[EventFilter, Batch]) -> None:
        for subscription in list(self.subscriptions):
            batch = batches.get(subscription.where)
            if batch is not None:
                subscription.offer(batch)

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
