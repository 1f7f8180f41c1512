"""Reports to the coordinator: sent in order, batched, and retried until answered.

Every attempt drops its reports (started, session, logs, finished) here. One sender
takes whatever has piled up into one ``POST /runner/events`` (within the batch limits of
``corral.protocol.limits``), so a busy runner makes one request for many runs; while the
coordinator is away, reports wait and keep their order. Each report gets a future: the
coordinator's refusal (a lost lease, an invalid report) lands there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from corral.backoff import backoff_delay
from corral.errors import CorralError, InvalidRequest
from corral.ids import RunnerId
from corral.protocol.limits import MAX_BATCH_BYTES, MAX_BATCH_EVENTS, json_size
from corral.protocol.runner import HOLD_ON_RETRY_S, RETRY_ELSEWHERE_S
from corral.runner.link import HttpLink, Leaving, LinkDown

log = logging.getLogger("corral.runner")


class _Report(NamedTuple):
    event: dict[str, Any]
    size: int  # encoded
    future: asyncio.Future[None]


class Outbox:
    def __init__(
        self,
        link: HttpLink,
        runner_id: Callable[[], RunnerId],
        *,
        max_backoff_s: float = 30.0,
        answer_wait_s: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._link = link
        self._runner_id = runner_id
        self._max_backoff_s = max_backoff_s
        # How long to wait for a batch's answer (``Lease.answer_wait_s``): one sent on a
        # connection its coordinator dropped without a word (a half-open socket) goes to the
        # next coordinator within half the lease, not after the client's 30 s.
        self._answer_wait_s = answer_wait_s
        self._queue: deque[_Report] = deque()
        self._wake = asyncio.Event()
        self._retry_now = asyncio.Event()  # ends a backoff's wait early (``delivered``)

    def send(self, event: dict[str, Any]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Report(event, json_size(event), future))
        self._wake.set()
        return future

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def delivered(self) -> None:
        """Wait until every report queued so far is answered (or dropped); those waiting
        out a backoff are sent again at once."""
        futures = [report.future for report in self._queue]
        if futures:
            self._retry_now.set()
            await asyncio.wait(futures)

    async def run(self) -> None:
        """Send until cancelled. A batch the coordinator refuses as invalid is sent again
        in halves, down to the one report it refuses: that one is dropped — logged, and its
        future fails — and the others go on. Nothing else ends this loop: any other failure
        is logged and retried with backoff."""
        failures = 0
        elsewhere = 0  # the other coordinators tried at once since the last backoff
        most = MAX_BATCH_EVENTS
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._batch(most)
                try:
                    results = await self._link.events(
                        self._runner_id(), [r.event for r in batch], self._answer_wait_s()
                    )
                    if len(results) != len(batch):
                        raise ValueError(f"{len(results)} answers to {len(batch)} reports")
                except InvalidRequest as exc:
                    if len(batch) > 1:
                        most = len(batch) // 2
                        log.warning("reports: a batch of %d refused (%s); halving", len(batch), exc)
                    else:
                        self._drop(exc)
                    continue
                except Leaving:
                    # The link moved to the next coordinator: send there (soon, not at once:
                    # with one coordinator, it is the same one, still stopping).
                    await asyncio.sleep(HOLD_ON_RETRY_S)
                    continue
                except LinkDown as exc:
                    if elsewhere < self._link.coordinators - 1:
                        # The link moved to the next coordinator: send there at once.
                        elsewhere += 1
                        log.warning("reports: coordinator unreachable (%s); trying the next", exc)
                        await asyncio.sleep(RETRY_ELSEWHERE_S)
                        continue
                    elsewhere = 0
                    await self._back_off(failures, exc)
                    failures += 1
                    continue
                except Exception as exc:
                    await self._back_off(failures, exc)
                    failures += 1
                    continue
                failures = elsewhere = 0
                most = MAX_BATCH_EVENTS
                for _ in batch:
                    self._queue.popleft()
                for report, error in zip(batch, results, strict=True):
                    _settle(report.future, error)

    async def _back_off(self, failures: int, exc: Exception) -> None:
        delay = backoff_delay(failures, cap=self._max_backoff_s)
        why = "unreachable" if isinstance(exc, LinkDown) else "failed"
        log.warning("reports: coordinator %s (%s); retry in %.1fs", why, exc, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._retry_now.wait(), delay)
        self._retry_now.clear()

    def _batch(self, most: int) -> list[_Report]:
        """The oldest reports, at most ``most`` of them and ``MAX_BATCH_BYTES`` (one at
        least, whatever its size)."""
        batch: list[_Report] = []
        size = 0
        for report in self._queue:
            if batch and (len(batch) >= most or size + report.size > MAX_BATCH_BYTES):
                break
            batch.append(report)
            size += report.size
        return batch

    def _drop(self, error: CorralError) -> None:
        report = self._queue.popleft()
        event = report.event
        log.error(
            "reports: the coordinator refused a %r report of run %s (%d bytes); dropped: %s",
            event.get("type"),
            event.get("run_id"),
            report.size,
            error,
        )
        _settle(report.future, error)


def _settle(future: asyncio.Future[None], error: CorralError | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def settle(future: asyncio.Future[None], on_refused: Callable[[CorralError], None]) -> None:
    """Call ``on_refused`` if the coordinator refuses this report because the run is not
    the runner's any more (and mark it handled). A report refused as invalid was logged
    and dropped (``Outbox``): the run is still ours, so it goes on."""

    def done(f: asyncio.Future[None]) -> None:
        if f.cancelled():
            return
        error = f.exception()
        if isinstance(error, CorralError) and not isinstance(error, InvalidRequest):
            on_refused(error)

    future.add_done_callback(done)
