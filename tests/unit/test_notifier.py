"""The in-process wake-ups behind long-polls and log followers."""

from __future__ import annotations

import gc
import time

import anyio
import anyio.lowlevel
import pytest

from corral.coordinator.notifier import (
    RUNS_AVAILABLE,
    Event,
    Notifier,
    logs_topic,
    runner_topic,
    wait_any,
    wait_for,
)

pytestmark = pytest.mark.anyio


async def test_a_waiter_holding_the_event_is_woken_by_notify() -> None:
    notifier = Notifier()
    event = notifier.event(RUNS_AVAILABLE)
    woken: list[bool] = []
    waiting = anyio.Event()

    async def waiter() -> None:
        waiting.set()
        woken.append(await wait_for(event, 30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await waiting.wait()
        notifier.notify(RUNS_AVAILABLE)
    assert woken == [True]  # set by the notify, not the 30 s timeout


async def test_a_notify_between_look_and_wait_is_not_missed() -> None:
    notifier = Notifier()
    event = notifier.event("topic")  # taken before looking at the store
    notifier.notify("topic")  # the change lands while the waiter looks
    assert await wait_for(event, 30) is True
    assert await wait_for(event, 0) is True


async def test_every_waiter_on_a_topic_is_woken() -> None:
    notifier = Notifier()
    woken: list[int] = []
    taken = 0

    async def waiter(n: int) -> None:
        nonlocal taken
        event = notifier.event("t")
        taken += 1
        if await wait_for(event, 30):
            woken.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(waiter, n)
        while taken < 5:  # every waiter holds the event
            await anyio.lowlevel.checkpoint()
        notifier.notify("t")
    assert sorted(woken) == list(range(5))


def test_waiters_on_one_topic_share_an_event() -> None:
    notifier = Notifier()
    first = notifier.event("a")
    assert notifier.event("a") is first
    assert notifier.event("b") is not first


def test_notify_wakes_only_its_topics() -> None:
    notifier = Notifier()
    a, b, c = notifier.event("a"), notifier.event("b"), notifier.event("c")
    notifier.notify("a", "c")
    assert a.is_set() and c.is_set()
    assert not b.is_set()


def test_notify_with_no_waiter_is_harmless() -> None:
    notifier = Notifier()
    notifier.notify("nobody", RUNS_AVAILABLE)
    notifier.notify()
    assert not notifier.event("nobody").is_set()  # nothing was remembered for later


def test_after_a_notify_the_next_event_is_fresh() -> None:
    notifier = Notifier()
    old = notifier.event("t")
    notifier.notify("t")
    new = notifier.event("t")
    assert old.is_set()
    assert new is not old
    assert not new.is_set()


def test_events_disappear_when_nobody_holds_them() -> None:
    notifier = Notifier()
    event = notifier.event("t")
    kept = notifier.event("kept")
    assert "t" in notifier._events
    del event
    gc.collect()
    assert "t" not in notifier._events
    assert notifier._events.get("kept") is kept
    assert len(notifier._events) == 1


async def test_wait_for_times_out_false() -> None:
    notifier = Notifier()
    event = notifier.event("t")
    started = time.monotonic()
    assert await wait_for(event, 0.05) is False
    assert time.monotonic() - started >= 0.04
    assert await wait_for(event, 0) is False
    assert await wait_for(event, -1) is False


def test_topic_names() -> None:
    assert runner_topic("rnr_1") != logs_topic("rnr_1")
    assert runner_topic("rnr_1") == runner_topic("rnr_1")
    assert RUNS_AVAILABLE not in {runner_topic("runs"), logs_topic("runs")}


async def test_wait_any_returns_once_either_event_is_set_and_forgets_its_future() -> None:
    notifier = Notifier()
    for by_topic in (True, False):
        topic, own = notifier.event(runner_topic("r1")), Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_any, [topic, own], None)
            await anyio.lowlevel.checkpoint()  # it waits now
            assert topic._futures and own._futures
            if by_topic:
                notifier.notify(runner_topic("r1"))
            else:
                own.set()
        # Returned: neither event holds its future any more (the one set, nor the other).
        assert not topic._futures and not own._futures


async def test_wait_any_returns_at_once_if_an_event_is_set_and_after_its_timeout() -> None:
    ready, idle = Event(), Event()
    ready.set()
    await wait_any([idle, ready], None)
    started = time.monotonic()
    await wait_any([idle], 0.05)
    assert time.monotonic() - started >= 0.04 and not idle._futures


async def test_a_cancelled_wait_any_forgets_its_future() -> None:
    event = Event()
    with anyio.move_on_after(0.01):
        await wait_any([event], None)
    assert not event._futures
    event.set()  # nobody to wake: harmless
