"""The runner sockets' deadlines on one timer: ``SocketDeadlines``.

A socket's session has one deadline at a time (``ServerSession.next_deadline``): its Init's
while it waits for one, then its runner's lost threshold counted from the last frame read.
Each socket used to wait for its own in a loop of its own, woken at least once a second: at
10,000 idle sockets, 10,000 timers and tasks made and dropped every second. Now one loop
holds a heap of (deadline, socket) and wakes when the earliest is due, or a second later at
most (so a deadline counted on a fake clock in tests passes within a second).

A frame read moves its socket's deadline later and touches nothing here: the heap holds
the deadline as it was when the socket was last looked at, never later than its real one.
When that comes, the socket is ticked (``Timed.tick``): if its time is really up it closes,
otherwise it is put back at the deadline it has now — one heap operation per socket per
lost threshold, however often its runner pings. A deadline never moves earlier (frames and
registering only push it on), which is what makes the lazy entry safe.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from typing import Protocol

from corral.clock import Clock
from corral.coordinator.notifier import wait_for

log = logging.getLogger("corral.coordinator")
# The longest the loop sleeps: a socket waiting on the store to register has no deadline,
# and is looked at again this often; a fake clock's deadlines pass within this long.
RECHECK_S = 1.0


class Timed(Protocol):
    @property
    def closed(self) -> asyncio.Event:
        """Set once the socket is closed: it leaves the heap."""
        ...

    def tick(self, now: float) -> float | None:
        """Its deadline may have passed: act on it; return when to look again (None: never,
        it is closing)."""


class SocketDeadlines:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Timed]] = []
        self._order = itertools.count()  # ties in time: first added, first looked at
        self._sooner = asyncio.Event()  # a socket was added ahead of the earliest

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, timed: Timed, deadline: float | None) -> None:
        """Look at ``timed`` at ``deadline`` (None: within ``RECHECK_S``)."""
        at = self.clock.now() + RECHECK_S if deadline is None else deadline
        if not self._heap or at < self._heap[0][0]:
            self._sooner.set()
        heapq.heappush(self._heap, (at, next(self._order), timed))

    def tick(self, now: float) -> int:
        """Tick every socket whose deadline in the heap has come; the number ticked."""
        heap, ticked = self._heap, 0
        while heap and heap[0][0] <= now:
            _, _, timed = heapq.heappop(heap)
            if timed.closed.is_set():
                continue
            ticked += 1
            try:
                again = timed.tick(now)
            except Exception:  # one socket's failure must not stop the others' timer
                log.exception("a runner socket's tick failed")
                again = now
            if again is not None:
                at = again if again > now else now + RECHECK_S
                heapq.heappush(heap, (at, next(self._order), timed))
        return ticked

    def next_wait(self, now: float) -> float:
        """How long the loop may sleep."""
        if not self._heap:
            return RECHECK_S
        return min(RECHECK_S, max(0.0, self._heap[0][0] - now))

    async def run_forever(self) -> None:
        while True:
            self._sooner.clear()
            self.tick(self.clock.now())
            wait = self.next_wait(self.clock.now())
            if wait > 0:
                await wait_for(self._sooner, wait)
            else:  # due already (the clock moved on while it ticked): let the loop run first
                await asyncio.sleep(0)
