"""One attempt of a run on this runner: report started, spawn, watch, report the end.

The supervisor stops the process (SIGTERM, then SIGKILL to its group) when the first of
these comes: the run's timeout, the idle timeout (no output), a cancel, the runner
shutting down, or a lingering agent that printed its result but does not exit. Reports
to the coordinator are retried until they get through: the run stays held meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from corral.agents.base import Executor, ResultSeen, SessionSeen, StopReason
from corral.backoff import backoff_delay
from corral.errors import CorralError, LeaseLost
from corral.ids import RunnerId
from corral.runner.link import HttpLink, LinkDown
from corral.runner.process import Child
from corral.runner.settings import RunnerSettings
from corral.runs import Run, RunReport, RunStatus
from corral.store import LogLine

log = logging.getLogger("corral.runner")
T = TypeVar("T")


class Attempt:
    def __init__(
        self,
        run: Run,
        runner_id: RunnerId,
        executor: Executor,
        link: HttpLink,
        settings: RunnerSettings,
        base_env: dict[str, str],
    ) -> None:
        self.run = run
        self.runner_id = runner_id
        self.attempt = run.attempts
        self.executor = executor
        self.link = link
        self.settings = settings
        self.base_env = base_env
        self.child: Child | None = None
        self.report: RunReport | None = None
        self._stop: StopReason | None = None
        self._stop_requested = asyncio.Event()
        self._abandoned = False
        self._pending_lines: list[LogLine] = []
        self._line_no = 0
        self._side_tasks: list[asyncio.Task[None]] = []

    # ---- orders from outside -------------------------------------------------------------

    def cancel(self) -> None:
        self._request_stop(StopReason.CANCELLED)

    def shutdown(self) -> None:
        self._request_stop(StopReason.RUNNER_SHUTDOWN)

    def abandon(self) -> None:
        """The coordinator gave this run to someone else: stop it and report nothing."""
        self._abandoned = True
        self._request_stop(StopReason.CANCELLED)

    def _request_stop(self, reason: StopReason) -> None:
        if self._stop is None:
            self._stop = reason
        self._stop_requested.set()

    # ---- the attempt ---------------------------------------------------------------------

    async def execute(self) -> None:
        try:
            await self._deliver(
                lambda: self.link.started(self.run.id, self.runner_id, self.attempt)
            )
        except LeaseLost:
            log.warning("run %s: lease lost before start; not running it", self.run.id)
            return
        report = await self._supervise()
        self.report = report
        if self._abandoned:
            return
        with contextlib.suppress(LeaseLost):
            await asyncio.gather(*self._side_tasks)
            await self._flush_logs()
            await self._deliver(
                lambda: self.link.report(self.run.id, self.runner_id, self.attempt, report)
            )
            log.info("run %s: %s", self.run.id, report.status)

    async def _supervise(self) -> RunReport:
        try:
            spec = self.executor.prepare(self.run, self.base_env)
            observer = self.executor.observer(self.run)
            self.child = await Child.spawn(spec)
        except (OSError, CorralError, ValueError) as exc:
            return RunReport(RunStatus.FAILED, error=f"could not start: {exc}")
        if self._stop is not None:  # cancelled while starting
            await self.child.stop(self.settings.kill_grace_s)
            return observer.outcome(self.child.proc.returncode, self._stop)

        last_output = time.monotonic()
        result_at: float | None = None

        async def pump(stream: asyncio.StreamReader | None, name: str) -> None:
            nonlocal last_output, result_at
            assert stream is not None
            while line_bytes := await stream.readline():
                last_output = time.monotonic()
                text = line_bytes.decode(errors="replace").rstrip("\n")
                self._add_line(name, text)
                if name != "stdout":
                    continue
                for seen in observer.feed(text):
                    if isinstance(seen, SessionSeen):
                        # Told in the background: reading output must not wait on the network.
                        self._side_tasks.append(
                            asyncio.create_task(self._session_seen(seen.session_id))
                        )
                    elif isinstance(seen, ResultSeen) and result_at is None:
                        result_at = time.monotonic()

        child = self.child
        pumps = asyncio.gather(pump(child.proc.stdout, "stdout"), pump(child.proc.stderr, "stderr"))
        flusher = asyncio.create_task(self._flush_forever())
        started = time.monotonic()
        timeout_s = self.run.timeout_s
        idle_s = self.run.idle_timeout_s or (
            self.settings.agent_idle_timeout_s if self.run.agent else None
        )
        exited = asyncio.ensure_future(child.proc.wait())
        stop_wait = asyncio.ensure_future(self._stop_requested.wait())
        try:
            while not exited.done():
                now = time.monotonic()
                deadlines: list[tuple[float, StopReason]] = []
                if timeout_s:
                    deadlines.append((started + timeout_s, StopReason.TIMEOUT))
                if idle_s:
                    deadlines.append((last_output + idle_s, StopReason.IDLE_TIMEOUT))
                if result_at is not None:
                    deadlines.append(
                        (result_at + self.settings.result_grace_s, StopReason.LINGERED_AFTER_RESULT)
                    )
                due = min(deadlines, default=None)
                if due is not None and due[0] <= now:
                    self._request_stop(due[1])
                if self._stop is not None:
                    break
                wait_s = None if due is None else max(due[0] - now, 0.0)
                await asyncio.wait(
                    {exited, stop_wait}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
            stopped = None
            if not exited.done():
                stopped = self._stop
                await child.stop(self.settings.kill_grace_s)
            exit_code = await exited
            # The pipes close when every process holding them is gone; the group kill
            # above makes sure of it, so the pumps end.
            await pumps
        finally:
            stop_wait.cancel()
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        return observer.outcome(exit_code, stopped)

    # ---- reporting -----------------------------------------------------------------------

    def _add_line(self, stream: str, text: str) -> None:
        self._pending_lines.append(LogLine(self._line_no, stream, text, time.time()))
        self._line_no += 1

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.log_flush_s)
            try:
                await self._flush_logs()
            except LeaseLost:
                self.abandon()  # the run was given to another runner: stop our copy
                return

    async def _flush_logs(self) -> None:
        while self._pending_lines:
            batch = self._pending_lines[:1000]
            await self._deliver(
                partial(self.link.logs, self.run.id, self.runner_id, self.attempt, batch)
            )
            del self._pending_lines[: len(batch)]

    async def _session_seen(self, session_id: str) -> None:
        try:
            await self._deliver(
                lambda: self.link.session(self.run.id, self.runner_id, self.attempt, session_id)
            )
        except LeaseLost:
            self.abandon()

    async def _deliver(self, send: Callable[[], Awaitable[T]]) -> T:
        """Send until the coordinator answers; its refusals (4xx) are raised, not retried."""
        failures = 0
        while True:
            try:
                return await send()
            except LinkDown as exc:
                delay = backoff_delay(failures, cap=self.settings.max_backoff_s)
                log.warning(
                    "run %s: coordinator unreachable (%s); retry in %.1fs", self.run.id, exc, delay
                )
                failures += 1
                await asyncio.sleep(delay)
