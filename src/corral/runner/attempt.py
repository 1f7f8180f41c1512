"""One attempt of a run on this runner: spawn, watch, report through the outbox.

The supervisor stops the process (SIGTERM, then SIGKILL to its group) when the first of
these comes: the run's timeout, the idle timeout (no output), a cancel, the runner
shutting down, or a lingering agent that printed its result but does not exit.

The process starts as soon as the run is claimed; "started" is the first report in the
outbox, so it reaches the coordinator before anything else about the run. If the
coordinator refuses any report (the lease was lost: the run went to another runner),
the process is stopped and nothing more is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from corral.agents.base import Executor, OutputObserver, ResultSeen, SessionSeen, StopReason
from corral.assignment import Assignment
from corral.errors import CorralError
from corral.runner.outbox import settle
from corral.runner.output import Line, LineSplitter, LogLines, stored_text
from corral.runner.process import Child
from corral.runner.settings import RunnerSettings
from corral.runner.transport import ReportSink
from corral.runs import RunReport, RunStatus

log = logging.getLogger("corral.runner")
READ_CHUNK_BYTES = 256 * 1024
# Logs reports of one attempt sent and not yet acknowledged before its pipes are read on
# (each at most MAX_LOG_LINES lines / MAX_EVENT_BYTES): memory stays bounded however
# fast a process prints.
MAX_LOGS_IN_FLIGHT = 8


class Attempt:
    def __init__(
        self,
        run: Assignment,
        executor: Executor,
        outbox: ReportSink,
        settings: RunnerSettings,
        base_env: dict[str, str],
    ) -> None:
        self.run = run
        self.attempt = run.attempt
        self.executor = executor
        self.outbox = outbox
        self.settings = settings
        self.base_env = base_env
        self.child: Child | None = None
        self.report: RunReport | None = None
        self._stop: StopReason | None = None
        self._stop_requested = asyncio.Event()
        self._abandoned = False
        self._logs = LogLines()
        self._logs_in_flight: deque[asyncio.Future[None]] = deque()
        self._line_no = 0
        self._last_output = time.monotonic()
        self._result_at: float | None = None
        self._result_seen = asyncio.Event()  # wakes the watcher: a new deadline applies

    # ---- orders from outside -------------------------------------------------------------

    def cancel(self) -> None:
        self._request_stop(StopReason.CANCELLED)

    def shutdown(self) -> None:
        self._request_stop(StopReason.RUNNER_SHUTDOWN)

    def abandon(self, why: object = None) -> None:
        """The run is no longer ours (the coordinator gave it to another runner): stop it
        and report nothing more."""
        if not self._abandoned:
            log.warning("run %s: lease lost (%s); stopping it", self.run.id, why)
        self._abandoned = True
        self._request_stop(StopReason.CANCELLED)

    def _request_stop(self, reason: StopReason) -> None:
        if self._stop is None:
            self._stop = reason
        self._stop_requested.set()

    # ---- the attempt ---------------------------------------------------------------------

    async def execute(self) -> None:
        self._post({"type": "started"})
        report = await self._work()
        self.report = report
        if self._abandoned:
            return
        self._flush_logs()
        finished = self._post({"type": "finished", **_report_fields(report)}, settle_it=False)
        try:
            await finished
        except CorralError as exc:
            log.warning("run %s: final report refused: %s", self.run.id, exc)
            return
        log.info("run %s: %s", self.run.id, report.status)
        self.after_report()

    def on_result(self, observer: OutputObserver) -> None:
        """The agent printed its final result (it may still be running)."""

    def after_report(self) -> None:
        """Work that may go on after the slot is free again (nothing for a plain run)."""

    def _post(self, event: dict[str, Any], *, settle_it: bool = True) -> asyncio.Future[None]:
        future = self.outbox.send({**event, "run_id": self.run.id, "attempt": self.attempt})
        if settle_it:
            settle(future, self.abandon)
        return future

    async def _work(self) -> RunReport:
        """Do the run; a task run does more than one process (see TaskAttempt)."""
        return await self._supervise(self.run)

    async def _supervise(self, run: Assignment) -> RunReport:
        """Run one process for ``run`` under the watchdog; how it ended."""
        try:
            spec = self.executor.prepare(run, self.base_env)
            observer = self.executor.observer(run)
            self.child = child = await Child.spawn(spec)
        except FileNotFoundError as exc:
            if exc.filename not in (None, spec.argv[0]):  # a missing cwd, say
                return RunReport(RunStatus.FAILED, error=f"could not start: {exc}")
            # Not worth retrying: the program will be just as missing next time.
            hint = self.executor.missing_program_hint
            return RunReport(
                RunStatus.FAILED,
                error=f"could not start: no such program: {spec.argv[0]!r}"
                + (f"; {hint}" if hint else ""),
                task={"outcome": "missing_program"},
            )
        except (OSError, CorralError, ValueError) as exc:
            return RunReport(RunStatus.FAILED, error=f"could not start: {exc}")
        pumps = asyncio.gather(
            self._pump(child.proc.stdout, "stdout", observer),
            self._pump(child.proc.stderr, "stderr", None),
        )
        flusher = asyncio.create_task(self._flush_forever())
        try:
            stopped = await self._watch(child)
            exit_code = await child.proc.wait()
            await pumps  # the pipes close once the whole group is gone
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        return observer.outcome(exit_code, stopped)

    async def _watch(self, child: Child) -> StopReason | None:
        """Wait for the process to exit or for a reason to stop it; stop it if so."""
        started = time.monotonic()
        idle_s = self.run.idle_timeout_s or (
            self.settings.agent_idle_timeout_s if self.run.agent else None
        )
        exited = asyncio.ensure_future(child.proc.wait())
        stop_wait = asyncio.ensure_future(self._stop_requested.wait())
        result_wait = asyncio.ensure_future(self._result_seen.wait())
        try:
            while not exited.done():
                now = time.monotonic()
                deadlines: list[tuple[float, StopReason]] = []
                if self.run.timeout_s:
                    deadlines.append((started + self.run.timeout_s, StopReason.TIMEOUT))
                if idle_s:
                    deadlines.append((self._last_output + idle_s, StopReason.IDLE_TIMEOUT))
                if self._result_at is not None:
                    deadlines.append(
                        (
                            self._result_at + self.settings.result_grace_s,
                            StopReason.LINGERED_AFTER_RESULT,
                        )
                    )
                due = min(deadlines, default=None)
                if due is not None and due[0] <= now:
                    self._request_stop(due[1])
                if self._stop is not None:
                    await child.stop(self.settings.kill_grace_s)
                    return self._stop
                waiters = {exited, stop_wait}
                if not result_wait.done():
                    waiters.add(result_wait)  # the result line sets a new deadline
                await asyncio.wait(
                    waiters,
                    timeout=None if due is None else due[0] - now,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            return None
        finally:
            stop_wait.cancel()
            result_wait.cancel()

    async def _pump(
        self, stream: asyncio.StreamReader | None, name: str, observer: OutputObserver | None
    ) -> None:
        assert stream is not None
        lines = LineSplitter(self.settings.max_line_bytes)
        while data := await stream.read(READ_CHUNK_BYTES):
            for line in lines.feed(data):
                self._line(line, name, observer)
            await self._keep_up()
        for line in lines.end():
            self._line(line, name, observer)

    def _line(self, line: Line, stream: str, observer: OutputObserver | None) -> None:
        self._last_output = time.monotonic()
        text = line.data.decode(errors="replace")
        self._logs.add(self._line_no, stream, stored_text(text, line.cut), time.time())
        self._line_no += 1
        if self._logs.full:
            self._flush_logs()
        if observer is None:
            return
        for seen in observer.feed(text):
            if isinstance(seen, SessionSeen):
                self._post({"type": "session", "session_id": seen.session_id})
            elif isinstance(seen, ResultSeen) and self._result_at is None:
                self._result_at = time.monotonic()
                self._result_seen.set()
                self.on_result(observer)

    async def _keep_up(self) -> None:
        """Read no faster than the coordinator stores: while too many of this attempt's
        ``logs`` reports are unacknowledged, wait (the process blocks on its full pipe),
        unless the attempt is being stopped."""
        in_flight = self._logs_in_flight
        while in_flight:
            if in_flight[0].done():
                in_flight.popleft()
            elif len(in_flight) < MAX_LOGS_IN_FLIGHT or self._stop is not None:
                return
            else:
                stopping = asyncio.ensure_future(self._stop_requested.wait())
                oldest: asyncio.Future[Any] = in_flight[0]
                try:
                    await asyncio.wait({oldest, stopping}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopping.cancel()

    # ---- logs ----------------------------------------------------------------------------

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.log_flush_s)
            self._flush_logs()

    def _flush_logs(self) -> None:
        chunks = self._logs.take()
        if self._abandoned:
            return
        for lines in chunks:
            self._logs_in_flight.append(self._post({"type": "logs", "lines": lines}))


def _report_fields(report: RunReport) -> dict[str, Any]:
    return {
        "status": str(report.status),
        "exit_code": report.exit_code,
        "error": report.error,
        "result": report.result,
        "session_id": report.session_id,
        "cost_usd": report.cost_usd,
        "usage": report.usage,
        "num_turns": report.num_turns,
        "retry_after_s": report.retry_after_s,
        "task": report.task,
    }
