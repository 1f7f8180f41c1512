"""In-process wake-ups: a long-poll or a log follower waits on a topic, a change notifies it.

Waiters take the topic's event *before* they look at the store, so a change that lands
between their look and their wait still wakes them. Events live only while someone waits.
"""

from __future__ import annotations

import asyncio
import weakref
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


class Notifier:
    def __init__(self) -> None:
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )

    def event(self, topic: str) -> asyncio.Event:
        """The event the next ``notify(topic)`` sets; hold it while you look, then wait."""
        event = self._events.get(topic)
        if event is None:
            event = asyncio.Event()
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


async def wait_any(events: list[asyncio.Event], timeout: float | None) -> None:
    """Until one of ``events`` is set, or ``timeout`` seconds (None: no limit)."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
