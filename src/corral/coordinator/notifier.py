"""In-process wake-ups: a long-poll or a log follower waits on a topic, a change notifies it.

Waiters take the topic's event *before* they look at the store, so a change that lands
between their look and their wait still wakes them. Events live only while someone waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

RUNS_AVAILABLE = "runs"
# A run ended that may make a sub-agent callback due: the coordinator's deliverer looks.
CALLBACKS_DUE = "callbacks"


def runner_topic(runner_id: str) -> str:
    return f"runner:{runner_id}"


def actor_topic(actor_id: str) -> str:
    return f"actor:{actor_id}"


LOGS = "logs:"  # a run's log lines: ``logs_topic``


def logs_topic(run_id: str) -> str:
    return f"{LOGS}{run_id}"


class Event(asyncio.Event):
    """An ``asyncio.Event`` that ``wait_any`` can wait on together with others through one
    future: its ``set`` also wakes the futures waiting on it that way. Waiting on each
    event with a task of its own, under ``asyncio.wait``, cost a runner socket's push loop
    ~35 µs a wait, one future ~5 (once for every eight runs or so)."""

    def __init__(self) -> None:
        super().__init__()
        self._futures: list[asyncio.Future[None]] = []

    def set(self) -> None:
        super().set()
        futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)

    def wakes(self, future: asyncio.Future[None]) -> None:
        """``set`` will also set ``future`` (unless ``forget`` comes first)."""
        self._futures.append(future)

    def forget(self, future: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):  # set meanwhile: already forgotten
            self._futures.remove(future)


class Notifier:
    def __init__(self) -> None:
        self._events: weakref.WeakValueDictionary[str, Event] = weakref.WeakValueDictionary()

    def event(self, topic: str) -> Event:
        """The event the next ``notify(topic)`` sets; hold it while you look, then wait."""
        event = self._events.get(topic)
        if event is None:
            event = Event()
            self._events[topic] = event
        return event

    def notify(self, *topics: str) -> None:
        for topic in topics:
            event = self._events.pop(topic, None)
            if event is not None:
                event.set()

    def notify_all(self) -> None:
        """Wake every waiter: each looks at the store again. What a notification lost on
        the way would have said is found by that look (``corral.coordinator.listener``)."""
        self.notify(*list(self._events))

    def waited(self) -> list[str]:
        """The topics someone waits on now."""
        return list(self._events)


async def wait_for(
    event: asyncio.Event, timeout: float, hangup: asyncio.Future[None] | None = None
) -> bool:
    """True if the event was set within ``timeout`` seconds; False on timeout, or as soon
    as ``hangup`` is done (the waiting client went away)."""
    if timeout <= 0:
        return event.is_set()
    waiter = asyncio.ensure_future(event.wait())
    watched: set[asyncio.Future[Any]] = {waiter} if hangup is None else {waiter, hangup}
    done, _ = await asyncio.wait(watched, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    return waiter in done


async def wait_any(events: Sequence[Event], timeout: float | None) -> None:
    """Until one of ``events`` is set, or ``timeout`` seconds (None: no limit): one future
    that any of them sets, no task for each."""
    if any(event.is_set() for event in events):
        return
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    for event in events:
        event.wakes(woken)
    timer = None if timeout is None else loop.call_later(timeout, _wake, woken)
    try:
        await woken
    finally:
        if timer is not None:
            timer.cancel()
        for event in events:
            event.forget(woken)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
