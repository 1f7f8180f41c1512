"""Events without a database: the SSE encoding, filters, a subscription's bound, and
the pump's writes to attached streams."""

from __future__ import annotations

import asyncio
import json
import zlib

import pytest

from corral.coordinator.event_hub import (
    KEEPALIVE_S,
    MAX_ROUND_S,
    PAGE,
    ROUND_PAGES,
    ROUND_S,
    Batch,
    Deflated,
    Encoding,
    EventHub,
    Subscription,
    start_eagerly,
)
from corral.errors import InvalidRequest
from corral.events import (
    KEEPALIVE,
    Event,
    EventFilter,
    EventKind,
    EventText,
    encoded,
    sse_message,
)


def event(id: int, kind: EventKind = EventKind.LOG, **keys: str | None) -> Event:
    """An event as the store reads it (its text as the database makes it: see
    tests/integration/test_event_log.py)."""
    fields: dict[str, str | None] = dict.fromkeys(Event._fields[2:-1])
    fields.update(run_id="run_1", **keys)
    body = {"id": id, "kind": kind.value, "at": 1.5, **fields, "data": {"text": "a\nb"}}
    text = f"id: {id}\nevent: {kind.value}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"
    return Event(id, kind.value, *fields.values(), text)  # type: ignore[arg-type]


def sse(*events: Event) -> bytes:
    return encoded(events)


def test_a_streams_own_message_is_one_id_event_and_data_line() -> None:
    assert sse_message("ready", {"last_event_id": 3}, event_id=3) == (
        b'id: 3\nevent: ready\ndata: {"last_event_id":3}\n\n'
    )
    assert event(4).data == {"text": "a\nb"} and event(4).at == 1.5


def test_filters_parse_and_match() -> None:
    assert EventFilter.parse() == EventFilter()
    wanted = EventFilter.parse(kind=" run , log ,", session="alpha")
    assert wanted.kinds == {EventKind.RUN, EventKind.LOG}
    assert wanted.matches(event(1, session_name="alpha"))
    assert wanted.matches(event(1, session_id="alpha"))
    assert not wanted.matches(event(1, session_name="beta"))
    assert not wanted.matches(event(1, EventKind.RUNNER, session_name="alpha"))
    with pytest.raises(InvalidRequest, match="'runs' is not an event kind"):
        EventFilter.parse(kind="runs")


def text_of(events: list[Event], where: EventFilter) -> EventText:
    """The text of the ``events`` that ``where`` wants, as the store reads a round's."""
    wanted = [e for e in events if where.matches(e)]
    first, last = (wanted[0].id, wanted[-1].id) if wanted else (0, 0)
    return EventText(len(wanted), first, last, "".join(e.sse for e in wanted))


def offered(subscription: Subscription, events: list[Event]) -> None:
    subscription.offer(Batch(text_of(events, subscription.where)))


def taken(subscription: Subscription) -> list[int]:
    return [_id for batch in subscription.take() for _id in ids(batch.encoded)]


def ids(text: bytes) -> list[int]:
    return [int(m.split(b"\n")[0].removeprefix(b"id: ")) for m in text.split(b"\n\n")[:-1]]


def fan_out(hub: EventHub, events: list[Event]) -> None:
    """A pump's round of ``events``, read as the store reads it: a text a filter."""
    hub._fan_out({s.where: Batch(text_of(events, s.where)) for s in hub.subscriptions})


def test_a_subscription_past_its_capacity_is_dropped_and_keeps_nothing() -> None:
    subscription = Subscription(EventFilter.parse(kind="log"), live_from=0, capacity=3)
    offered(subscription, [event(1), event(2, EventKind.RUN), event(3)])
    assert taken(subscription) == [1, 3]
    assert not subscription.done.is_set()
    offered(subscription, [event(i) for i in range(4, 8)])
    assert subscription.dropped and subscription.done.is_set()
    assert subscription.take() == []
    offered(subscription, [event(9)])  # dropped: nothing more is kept
    assert subscription.take() == []


def test_a_round_is_filtered_and_encoded_once_per_filter_not_per_subscriber() -> None:
    hub = EventHub(None, None, None)  # type: ignore[arg-type]  # only the fan-out is used
    logs = [Subscription(EventFilter.parse(kind="log"), 0, 100) for _ in range(3)]
    runs = Subscription(EventFilter.parse(kind="run"), 0, 100)
    hub.subscriptions.update([*logs, runs])
    fan_out(hub, [event(1), event(2, EventKind.RUN), event(3)])
    batches = [s.take() for s in logs]
    assert all(len(b) == 1 and b[0] is batches[0][0] for b in batches)  # one shared batch
    assert ids(batches[0][0].encoded) == [1, 3]
    assert batches[0][0].encoded == sse(event(1), event(3))
    assert taken(runs) == [2]
    # A stream that already sent event 1 (its catch-up read overlapped) sends the rest.
    assert batches[0][0].after(1) == sse(event(3))
    assert batches[0][0].after(0) is batches[0][0].encoded


class Socket:
    """A stream's writer: records what it is given; while ``full``, a write waits."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.full: asyncio.Future[None] | None = None

    async def write(self, chunk: bytes) -> None:
        if self.full is not None:
            await self.full
        self.written.append(chunk)


def test_the_pump_writes_a_keepalive_to_every_stream_each_keepalive_period() -> None:
    hub = EventHub(None, None, None)  # type: ignore[arg-type]  # only the nudges are used
    streams = [Subscription(EventFilter(), 0, 100) for _ in range(2)]
    sockets = [Socket() for _ in streams]
    for stream, socket in zip(streams, sockets, strict=True):
        stream.attach(socket.write, 0, Encoding())
    hub.subscriptions.update(streams)
    hub.nudge_when_due(100.0)  # the pump's first round: the period starts
    hub.nudge_when_due(100.0 + KEEPALIVE_S - 0.1)
    assert all(s.written == [] for s in sockets)
    hub.nudge_when_due(100.0 + KEEPALIVE_S)
    assert all(s.written == [KEEPALIVE] for s in sockets)


def test_an_attached_stream_is_written_by_the_pump_in_order_and_queued_behind_a_full_socket() -> (
    None
):
    async def scenario() -> None:
        stream = Subscription(EventFilter.parse(kind="log"), live_from=2, capacity=4)
        socket = Socket()
        offered(stream, [event(2), event(3)])  # before attach: kept for it
        stream.attach(
            socket.write, last=2, encoding=Encoding()
        )  # its catch-up sent event 2 already
        assert socket.written == [sse(event(3))] and stream.last == 3
        offered(stream, [event(4)])  # written at once, in the pump's round: no task
        assert socket.written[-1] == sse(event(4))
        socket.full = asyncio.get_running_loop().create_future()
        offered(stream, [event(5)])  # this write waits for room
        offered(stream, [event(6)])
        offered(stream, [event(7), event(8)])  # queued behind it
        assert len(socket.written) == 2 and stream.queued == 3
        socket.full.set_result(None)
        socket.full = None
        await stream.settled()
        await asyncio.sleep(0)  # the write's end writes what queued, as one write
        assert socket.written[2:] == [sse(event(5)), sse(*(event(i) for i in (6, 7, 8)))]
        assert stream.last == 8 and not stream.done.is_set()
        socket.full = asyncio.get_running_loop().create_future()
        offered(stream, [event(i) for i in range(9, 14)])  # waits; then 5 behind: dropped
        offered(stream, [event(i) for i in range(14, 19)])
        assert stream.dropped and stream.done.is_set()
        stream.cancel()  # the stream is gone
        await stream.settled()
        assert len(socket.written) == 4

    asyncio.run(scenario())


def test_deflated_streams_share_each_batchs_compression_and_each_decodes_whole() -> None:
    """Two deflate streams of one filter, attached at different points (one caught up
    past the first event of a batch): the batch is compressed once for the stream that
    sends it whole, each stream's bytes decode (trailer checked) to exactly its events."""
    hub = EventHub(None, None, None)  # type: ignore[arg-type]  # no store: fan-out only
    streams = [Subscription(EventFilter.parse(kind="log"), 2, 100) for _ in range(2)]
    sockets = [Socket() for _ in streams]
    encodings = [Deflated(), Deflated()]
    heads = [encoding.message(b"id: 2\nevent: caught_up\n\n") for encoding in encodings]
    streams[0].attach(sockets[0].write, 2, encodings[0])
    streams[1].attach(sockets[1].write, 3, encodings[1])  # its catch-up sent event 3
    hub.subscriptions.update(streams)
    fan_out(hub, [event(3), event(4), event(5, EventKind.RUN)])
    hub.nudge_when_due(1.0)
    hub.nudge_when_due(1.0 + KEEPALIVE_S)  # a keepalive each
    fan_out(hub, [event(6), event(7)])
    whole = [head + b"".join(socket.written) for head, socket in zip(heads, sockets, strict=True)]
    assert sockets[0].written[-1] == sockets[1].written[-1]  # one shared piece, same bytes
    decoded = [zlib.decompress(w + e.end()) for w, e in zip(whole, encodings, strict=True)]
    caught_up = b"id: 2\nevent: caught_up\n\n"
    assert decoded[0] == caught_up + sse(event(3), event(4)) + KEEPALIVE + (sse(event(6), event(7)))
    assert decoded[1] == caught_up + sse(event(4)) + KEEPALIVE + (sse(event(6), event(7)))


def test_a_coroutine_started_eagerly_runs_at_once_or_finishes_in_a_task() -> None:
    async def at_once() -> None:
        return None

    async def scenario() -> None:
        assert start_eagerly(at_once()) is None
        room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done: list[int] = []

        async def waits() -> None:
            done.append(1)
            await room
            done.append(2)

        task = start_eagerly(waits())
        assert task is not None and done == [1]  # ran up to its wait here and now
        room.set_result(None)
        await task
        assert done == [1, 2]
        room = asyncio.get_running_loop().create_future()
        stuck = start_eagerly(waits())
        assert stuck is not None
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        assert stuck.cancelled()

    asyncio.run(scenario())


def test_the_pump_pauses_longer_between_rounds_with_more_streams() -> None:
    hub = EventHub(None, None, None)  # type: ignore[arg-type]  # only the pause is used
    hub.subscriptions.add(Subscription(EventFilter(), 0, 100))
    assert hub.round_s == ROUND_S  # one stream (logs -f): a change is soon seen
    hub.subscriptions.update(Subscription(EventFilter(), 0, 100) for _ in range(49))
    assert hub.round_s == MAX_ROUND_S  # fifty: each round writes fifty times


def test_equal_filters_hash_alike() -> None:
    parsed = EventFilter.parse(kind="run,log", session="s")
    built = EventFilter(frozenset({EventKind.LOG, EventKind.RUN}), session="s")
    assert parsed == built and hash(parsed) == hash(built) == hash(built)
    assert len({parsed, built, EventFilter.parse(kind="run")}) == 2


class Log:
    """An event log of ``count`` run events, read as the store reads a round: in the
    middle of the read (``joining``) another stream subscribes."""

    def __init__(self, count: int, hub: EventHub, joining: Subscription) -> None:
        self.count, self.hub, self.joining = count, hub, joining
        self.reads: list[tuple[int, int, set[EventFilter]]] = []

    def read_round(
        self, after: int, filters: set[EventFilter], limit: int
    ) -> tuple[int, int, dict[EventFilter, EventText]]:
        self.hub.subscriptions.add(self.joining)
        until = min(after + limit, self.count)
        return until, until - after, self.read_texts(after, until, filters)

    def read_texts(
        self, after: int, until: int, filters: set[EventFilter]
    ) -> dict[EventFilter, EventText]:
        self.reads.append((after, until, set(filters)))
        events = [event(i, EventKind.RUN) for i in range(after + 1, until + 1)]
        return {where: text_of(events, where) for where in filters}


def test_a_round_reads_up_to_its_bound_for_every_filter_even_one_that_came_meanwhile() -> None:
    hub = EventHub(None, None, None)  # type: ignore[arg-type]  # only the reads are used
    everything = Subscription(EventFilter(), 5, 100_000)
    joining = Subscription(EventFilter.parse(kind="run"), 5, 100_000)
    hub.events = log = Log(PAGE * (ROUND_PAGES + 3), hub, joining)  # type: ignore[assignment]
    hub.subscriptions.add(everything)
    read = asyncio.run(hub._read_round(5))  # bounded: the next round reads on, without a pause
    assert read == PAGE * ROUND_PAGES and hub._cursor == 5 + PAGE * ROUND_PAGES
    wanted = list(range(6, 6 + PAGE * ROUND_PAGES))
    assert taken(everything) == wanted and taken(joining) == wanted
    assert log.reads == [
        (5, hub._cursor, {EventFilter()}),
        (5, hub._cursor, {EventFilter.parse(kind="run")}),  # the newcomer's, same range
    ]
