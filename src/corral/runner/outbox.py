"""Reports to the coordinator: sent in order, batched, and retried until answered.

Every attempt drops its reports (started, session, logs, finished) here. One sender
takes whatever has piled up into a single ``POST /runner/events``, so a busy runner makes
one request for many runs; while the coordinator is away, reports wait and keep their
order. Each report gets a future: the coordinator's refusal (a lost lease) lands there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from corral.backoff import backoff_delay
from corral.errors import CorralError
from corral.ids import RunnerId
from corral.runner.link import HttpLink, LinkDown

log = logging.getLogger("corral.runner")
MAX_BATCH = 500


class Outbox:
    def __init__(
        self, link: HttpLink, runner_id: Callable[[], RunnerId], *, max_backoff_s: float = 30.0
    ) -> None:
        self._link = link
        self._runner_id = runner_id
        self._max_backoff_s = max_backoff_s
        self._queue: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()

    def send(self, event: dict[str, Any]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((event, future))
        self._wake.set()
        return future

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def run(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._queue[:MAX_BATCH]
                try:
                    results = await self._link.events(self._runner_id(), [e for e, _ in batch])
                except LinkDown as exc:
                    delay = backoff_delay(failures, cap=self._max_backoff_s)
                    log.warning("reports: coordinator unreachable (%s); retry in %.1fs", exc, delay)
                    failures += 1
                    await asyncio.sleep(delay)
                    continue
                failures = 0
                del self._queue[: len(batch)]
                for (_, future), error in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)


def settle(future: asyncio.Future[None], on_refused: Callable[[CorralError], None]) -> None:
    """Call ``on_refused`` if the coordinator refuses this report (and mark it handled)."""

    def done(f: asyncio.Future[None]) -> None:
        if f.cancelled():
            return
        error = f.exception()
        if isinstance(error, CorralError):
            on_refused(error)

    future.add_done_callback(done)
