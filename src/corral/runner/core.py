"""The runner's core: register, claim into free slots, watch orders, heartbeat, drain.

    poller     long-polls for runs while a slot is free, starts an Attempt per run
    control    long-polls for cancellations of the runs it holds
    heartbeat  tells the coordinator it is alive and which runs it holds; the answer says
               which to cancel and which it no longer holds (those are stopped at once)

Every call to the coordinator survives its absence: retried forever with capped,
jittered backoff. After a network cut or a coordinator restart the runner registers
again under the same id and reports what it still runs, so nothing is started twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from corral import __version__
from corral.agents.registry import executor_for
from corral.backoff import backoff_delay
from corral.errors import CorralError, LeaseLost, NotFound
from corral.ids import RunId, RunnerId
from corral.runner.attempt import Attempt
from corral.runner.link import HttpLink, LinkDown
from corral.runner.outbox import Outbox
from corral.runner.settings import RunnerSettings
from corral.runner.task_attempt import TaskAttempt
from corral.runs import AgentSpec, Run, RunStatus, RunType
from corral.store import Held

log = logging.getLogger("corral.runner")
T = TypeVar("T")


class Runner:
    def __init__(self, settings: RunnerSettings, link: HttpLink | None = None) -> None:
        self.settings = settings
        self.link = link or HttpLink(settings.coordinator_url)
        self.runner_id: RunnerId | None = None
        self.attempts: dict[RunId, Attempt] = {}
        self.heartbeat_interval_s = 60.0
        self.poll_timeout_s = 30.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._draining = asyncio.Event()
        self._registered = asyncio.Event()
        self._register_lock = asyncio.Lock()
        self.base_env = dict(os.environ)
        self.outbox = Outbox(self.link, lambda: self.rid, max_backoff_s=settings.max_backoff_s)

    @property
    def free_slots(self) -> int:
        return self.settings.slots - len(self.attempts)

    @property
    def rid(self) -> RunnerId:
        assert self.runner_id is not None, "registered first"
        return self.runner_id

    def held(self) -> list[Held]:
        return [Held(run_id, a.attempt) for run_id, a in self.attempts.items()]

    # ---- lifetime ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until ``drain()``; then let work finish (up to the grace) and leave."""
        await self._register()
        loops = [
            asyncio.create_task(self._poll_loop(), name="poller"),
            asyncio.create_task(self._control_loop(), name="control"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self.outbox.run(), name="outbox"),
        ]
        await self._draining.wait()
        loops[0].cancel()
        await self._finish_work()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        with contextlib.suppress(LinkDown, CorralError):
            assert self.runner_id is not None
            await self.link.deregister(self.runner_id)
        await self.link.aclose()
        log.info("runner %s stopped", self.runner_id)

    def drain(self) -> None:
        """Stop claiming; running work may finish within the drain grace period."""
        if not self._draining.is_set():
            log.info("runner %s draining (%d running)", self.runner_id, len(self.attempts))
        self._draining.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.drain)

    async def _finish_work(self) -> None:
        pending = {a_task for a_task in self._tasks}
        if pending:
            _, still = await asyncio.wait(pending, timeout=self.settings.drain_grace_s)
            if still:
                for attempt in self.attempts.values():
                    attempt.shutdown()  # gives the attempt back: another runner takes it
                # Their last reports may not get through (coordinator away): do not wait
                # forever; the coordinator takes back whatever it did not hear about.
                await asyncio.wait(still, timeout=self.settings.kill_grace_s + 10.0)

    # ---- registration --------------------------------------------------------------------

    async def _register(self) -> None:
        async with self._register_lock:
            registration = await self._retry(
                "register",
                lambda: self.link.register(
                    name=self.settings.name,
                    hostname=socket.gethostname(),
                    labels=list(self.settings.labels),
                    slots=self.settings.slots,
                    version=__version__,
                    runner_id=self.runner_id,
                    held=self.held(),
                ),
            )
            if self.runner_id and registration.runner_id != self.runner_id:
                log.warning(
                    "coordinator forgot runner %s; now %s", self.runner_id, registration.runner_id
                )
            self.runner_id = registration.runner_id
            self.heartbeat_interval_s = registration.heartbeat_interval_s
            self.poll_timeout_s = registration.poll_timeout_s
            self._apply(registration.cancel, registration.abandon)
            self._registered.set()
            log.info(
                "runner %s registered (%s, %d slots)",
                self.runner_id,
                self.settings.name,
                self.settings.slots,
            )

    async def _reregister(self) -> None:
        self._registered.clear()
        await self._register()

    def _apply(self, cancel: list[RunId], abandon: list[RunId]) -> None:
        for run_id in abandon:
            if attempt := self.attempts.get(run_id):
                log.warning("run %s: no longer ours; stopping it", run_id)
                attempt.abandon()
        for run_id in cancel:
            if attempt := self.attempts.get(run_id):
                attempt.cancel()

    async def _retry(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        failures = 0
        while True:
            try:
                return await call()
            except LinkDown as exc:
                delay = backoff_delay(failures, cap=self.settings.max_backoff_s)
                log.warning("%s: coordinator unreachable (%s); retry in %.1fs", what, exc, delay)
                failures += 1
                await asyncio.sleep(delay)

    # ---- loops ---------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            while self.free_slots <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            try:
                runs = await self._retry(
                    "poll", lambda: self.link.poll(self.rid, self.free_slots, self.poll_timeout_s)
                )
            except (NotFound, LeaseLost):
                await self._reregister()
                continue
            for data in runs:
                self._start(_run_from_assignment(data))

    async def _control_loop(self) -> None:
        while True:
            await self._registered.wait()
            cancels = await self._retry(
                "control", lambda: self.link.control(self.rid, self.poll_timeout_s)
            )
            self._apply(cancels, [])

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                cancel, abandon = await self._retry(
                    "heartbeat", lambda: self.link.heartbeat(self.rid, self.held())
                )
            except (NotFound, LeaseLost):
                await self._reregister()  # declared lost while we were away
                continue
            self._apply(cancel, abandon)

    # ---- attempts ------------------------------------------------------------------------

    def _start(self, run: Run) -> None:
        assert self.runner_id is not None
        try:
            executor = executor_for(
                run,
                claude_bin=self.settings.claude_bin,
                result_grace_s=self.settings.result_grace_s,
            )
        except CorralError as exc:
            executor = _Unrunnable(str(exc))
        kind = TaskAttempt if run.type is RunType.TASK else Attempt
        attempt = kind(run, executor, self.outbox, self.settings, self.base_env)
        self.attempts[run.id] = attempt
        task = asyncio.create_task(self._execute(attempt), name=f"run {run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, attempt: Attempt) -> None:
        try:
            await attempt.execute()
        except Exception:
            log.exception("run %s: attempt crashed", attempt.run.id)
        finally:
            self.attempts.pop(attempt.run.id, None)
            self._slot_freed.set()


class _Unrunnable:
    """Stands in for an executor this runner lacks: the attempt fails with the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def prepare(self, run: Run, base_env: dict[str, str]) -> Any:
        raise ValueError(self.reason)

    def observer(self, run: Run) -> Any:
        return None


def _run_from_assignment(data: dict[str, Any]) -> Run:
    """Rebuild the run a coordinator assigned, from its JSON."""
    return Run(
        id=RunId(data["run_id"]),
        type=RunType(data["type"]),
        status=RunStatus(data["status"]),
        prompt=data["prompt"],
        command=tuple(data["command"]),
        session_name=data["session_name"],
        session_id=data["session_id"],
        agent=AgentSpec.from_dict(data["agent"]) if data.get("agent") else None,
        project_dir=data["project_dir"],
        labels=tuple(data["labels"]),
        timeout_s=data["timeout_s"],
        idle_timeout_s=data["idle_timeout_s"],
        max_attempts=data["max_attempts"],
        attempts=data["attempts"],
        priority=data["priority"],
        required_runner=data.get("required_runner"),
        runner_id=data["runner_id"],
        task_id=data.get("task_id"),
        task=data.get("task"),
        env=dict(data.get("env") or {}),
        exit_code=None,
        error=None,
        result=None,
        cost_usd=None,
        usage=None,
        num_turns=None,
        cancel_requested=False,
        rate_limited=data.get("rate_limited", 0),
        available_at=0.0,
        created_at=0.0,
        claimed_at=None,
        started_at=None,
        finished_at=None,
    )
