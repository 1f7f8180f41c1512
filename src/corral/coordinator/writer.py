"""Group commit: the runner sockets' store writes, taken together by writer threads.

Each runner socket applies its runner's reports and claims runs for it several hundred
times a second on a busy coordinator, each a store call of its own. On SQLite they all
queue on the database's one write lock, and each pays for its commit and for the lock
passing from thread to thread; on PostgreSQL each commit costs its server a WAL flush.
``StoreWriter`` runs them on writer threads instead (one on SQLite, ``THREADS``): a free
one takes every call queued meanwhile (a group) and runs them in order in one transaction,
with one commit for them all. A caller is answered once the group has committed: a runner's reports
are acknowledged only when they are stored.

Nearly every group is taken whole: it is tried flat first (the calls' transactions join the
group's, no savepoint each: on PostgreSQL each costs two round trips). If a call is refused
(a ``CorralError``), that try is undone and the group runs again with each call as it would
run alone: its transactions are savepoints of the group's, and one that fails undoes only
its own writes.

A call that fails the way the database does (``Unavailable``), or with an error the store
does not know (a bug), may have left the transaction unusable: the group is rolled back
(or found already ended), and its calls are run again one by one, each in its own
transaction, as without a group.

On PostgreSQL a group's one transaction holds the row locks of several runners at once.
So that it never waits for a lock in an order another transaction takes them the other way
round, a group runs its calls in the order of the runners they act for (each runner's own
in the order they came): a call locks its runner's row first, then that runner's runs, and
the reconciler locks the runners it takes back in the same order (``store/reconcile.py``).
A cycle this order does not rule out (an actor's command stored for another runner, an
overdue run the reconciler locks) ends as PostgreSQL's deadlock victim: that group, like
any that fails, runs again call by call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio.to_thread

from corral.errors import CorralError, Unavailable
from corral.store.db import Database, SpoiltTransaction

log = logging.getLogger("corral.coordinator")
T = TypeVar("T")
MAX_GROUP = 64  # calls taken into one transaction, about: what one failure makes run again
# Threads taking groups. On SQLite one: its one write lock would queue the others, and their
# groups be smaller. On PostgreSQL two, so that while one waits for a group's round trips
# (slow on a loaded machine) the next group is under way: groups side by side lock runners
# in the same order, as a group's calls do.
THREADS = {"sqlite": 1, "postgres": 2}


@dataclass
class _Call:
    run: Callable[[], Any]
    future: asyncio.Future[Any]
    runner: str  # whose rows it locks: a group runs its calls in runners' order


Answer = tuple[Exception | None, Any]  # what a call raised, or else what it returned


class StoreWriter:
    """Threads that run queued store calls in groups, one commit a group."""

    def __init__(self, db: Database, answered: Callable[[], None]) -> None:
        self._db = db
        self._answered = answered  # after each group's answers: the calls wrote events
        self._queue: queue.SimpleQueue[list[_Call] | None] = queue.SimpleQueue()
        self._asked: list[_Call] = []  # calls made in this turn of the event loop
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def open(self) -> bool:
        return not self._closed

    async def call(self, run: Callable[[], T], runner: str = "") -> T:
        """``run()`` (a blocking store call) in the next group; its result once committed.
        ``runner``: the runner whose rows it locks (module docstring)."""
        return await answer(self.submit(run, runner))

    def submit(self, run: Callable[[], T], runner: str = "") -> asyncio.Future[T]:
        """``call``, queued at once: the calls submitted in one turn of the event loop go
        to the same group, in one transaction (each sees what those before it wrote).
        Await its future with ``answer``."""
        if self._closed:
            raise Unavailable("the coordinator is stopping")
        if not self._threads:
            self._loop = asyncio.get_running_loop()
            self._threads = [
                threading.Thread(target=self._serve, name=f"corral-writer-{n}", daemon=True)
                for n in range(THREADS[self._db.dialect])
            ]
            for thread in self._threads:
                thread.start()
        assert self._loop is not None
        future: asyncio.Future[T] = self._loop.create_future()
        # Handed over once the loop's turn is done, with the others made in it: one wake-up
        # of the writer's thread for them, not one each.
        if not self._asked:
            self._loop.call_soon(self._hand_over)
        self._asked.append(_Call(run, future, runner))
        return future

    def _hand_over(self) -> None:
        calls, self._asked = self._asked, []
        if calls:
            self._queue.put(calls)

    async def close(self) -> None:
        """The threads end once the calls made before have run."""
        self._closed = True
        self._hand_over()
        threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)  # one for each: a thread ends at the first it takes
        for thread in threads:
            await anyio.to_thread.run_sync(thread.join)

    # ---- on the writer's thread -----------------------------------------------------------

    def _serve(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            group = first
            while len(group) < MAX_GROUP:
                try:
                    calls = self._queue.get_nowait()
                except queue.Empty:
                    break
                if calls is None:
                    stop = True
                    break
                group += calls
            group.sort(key=lambda call: call.runner)  # stable: a runner's calls keep their order
            try:
                answers = run_group(self._db, [c.run for c in group])
            except Exception as exc:  # never: a dead thread would leave every socket waiting
                log.exception("store writer: a group failed")
                answers = [(exc, None)] * len(group)
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                self._loop.call_soon_threadsafe(self._answer, group, answers)

    # ---- on the event loop ----------------------------------------------------------------

    def _answer(self, group: list[_Call], answers: list[Answer]) -> None:
        # The runners' calls first: what their sockets send next (a run's start) goes out
        # before what the others' callers do (a client's create answers its HTTP request).
        answered = sorted(zip(group, answers, strict=True), key=lambda done: not done[0].runner)
        for call, (error, result) in answered:
            if call.future.done():
                continue
            if error is not None:
                call.future.set_exception(error)
            else:
                call.future.set_result(result)
        self._answered()


async def answer(submitted: asyncio.Future[T]) -> T:
    """What a call ``StoreWriter.submit`` queued returned, once committed. As a call on a
    worker thread, a cancelled caller still waits until its call has run, so that what it
    does next (a socket's goodbye) comes after it."""
    try:
        return await asyncio.shield(submitted)
    except asyncio.CancelledError:
        await asyncio.wait([submitted])
        if not submitted.cancelled():
            submitted.exception()  # seen: it is the caller's to ignore now
        raise


def run_group(db: Database, calls: Sequence[Callable[[], Any]]) -> list[Answer]:
    """Each of ``calls`` in order, all in one transaction (one alone in its own): what each
    raised or returned. Refused (``CorralError``), a call undoes only its own writes; if one
    fails otherwise, they all run again one by one."""
    if len(calls) > 1:
        answers = _group(db, calls)
        if not isinstance(answers, Exception):
            return answers
        log.warning("a group of %d store calls failed (%r): each runs alone", len(calls), answers)
    return [_alone(call) for call in calls]


def _group(db: Database, calls: Sequence[Callable[[], Any]]) -> list[Answer] | Exception:
    """The calls in one transaction: flat, or with a savepoint each if one was refused; or
    why that failed (then they must run one by one)."""
    try:
        with db.transaction(flat=True):
            return [(None, call()) for call in calls]
    except Unavailable as exc:
        return exc
    except (CorralError, SpoiltTransaction):
        pass  # refused: the others are fine, but its writes are undone only with theirs
    except Exception as exc:
        return exc
    try:
        with db.transaction():
            return [_in_group(call) for call in calls]
    except Exception as exc:  # _GroupFailed, Unavailable, or its rollback failed too
        return exc


class _GroupFailed(Exception):
    """A call of the group failed in a way that may have spoilt its transaction."""


def _in_group(call: Callable[[], Any]) -> Answer:
    try:
        return None, call()
    except Unavailable as exc:
        raise _GroupFailed from exc
    except CorralError as exc:  # refused: its own writes were undone with it
        return exc, None
    except Exception as exc:
        raise _GroupFailed from exc


def _alone(call: Callable[[], Any]) -> Answer:
    try:
        return None, call()
    except Exception as exc:
        return exc, None
