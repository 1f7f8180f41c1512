"""Events without a database: the SSE encoding, filters, and a subscription's bound."""

from __future__ import annotations

import json

import pytest

from corral.coordinator.event_hub import Subscription
from corral.errors import InvalidRequest
from corral.events import Event, EventFilter, EventKind, sse, sse_message


def event(id: int, kind: EventKind = EventKind.LOG, **keys: str | None) -> Event:
    fields: dict[str, str | None] = {
        "run_id": "run_1",
        "session_id": None,
        "session_name": None,
        "plan_id": None,
        "runner_id": None,
    }
    fields.update(keys)
    return Event(id=id, kind=kind, at=1.5, data={"text": "a\nb\r\nc"}, **fields)  # type: ignore[arg-type]


def test_an_event_is_one_id_event_and_data_line_whatever_its_text() -> None:
    encoded = sse(event(7)).decode()
    assert encoded.endswith("\n\n")
    lines = encoded.rstrip("\n").split("\n")
    assert lines[:2] == ["id: 7", "event: log"]
    assert len(lines) == 3 and lines[2].startswith("data: ")
    assert json.loads(lines[2].removeprefix("data: "))["data"]["text"] == "a\nb\r\nc"
    assert sse_message("ready", {"last_event_id": 3}, event_id=3).startswith(
        b"id: 3\nevent: ready\n"
    )


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


def test_a_subscription_past_its_capacity_is_dropped_and_keeps_nothing() -> None:
    subscription = Subscription(EventFilter.parse(kind="log"), live_from=0, capacity=3)
    subscription.offer([event(1), event(2, EventKind.RUN), event(3)])
    assert [e.id for e in subscription.take()] == [1, 3]
    assert not subscription.ready.is_set()
    subscription.offer([event(i) for i in range(4, 8)])
    assert subscription.dropped and subscription.ready.is_set()
    assert subscription.take() == []
    subscription.offer([event(9)])  # dropped: nothing more is kept
    assert subscription.take() == []
