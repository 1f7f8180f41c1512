"""The runner's core: slots, attempts and draining; a transport brings the work in.

Runs come in through the transport (long-poll or WebSocket), each becomes an Attempt (a
TaskAttempt for a task run) in a free slot, and reports go out through the transport's
sink. ``drain()`` (SIGTERM) stops claiming, lets running work finish within the drain
grace, gives back what is left (another runner takes it) and says goodbye.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.agents.claude import AgentMcp, ClaudeExecutor
from corral.agents.registry import executor_for
from corral.assignment import Assignment
from corral.errors import CorralError
from corral.ids import RunId, RunnerId
from corral.runner.actors import ActorHost
from corral.runner.attempt import Attempt
from corral.runner.coordinators import Resolve, resolve_host
from corral.runner.environment import attempt_identity, run_environment
from corral.runner.keeper import kill_orphans
from corral.runner.link import HttpLink, LinkDown
from corral.runner.poll import PollTransport
from corral.runner.settings import RunnerSettings
from corral.runner.task_attempt import TaskAttempt
from corral.runner.transport import Transport
from corral.runner.websocket import WebSocketTransport
from corral.runners import Held
from corral.runs import RunType

log = logging.getLogger("corral.runner")
# How long a runner stopped while still registering may spend closing its link.
CLOSE_BEFORE_OPEN_S = 5.0


class RunnerCore:
    def __init__(
        self,
        settings: RunnerSettings,
        transport: Transport | None = None,
        *,
        host_env: Mapping[str, str] | None = None,
        resolve: Resolve = resolve_host,
        rng: random.Random | None = None,
    ) -> None:
        """``resolve`` and ``rng``: how the names of its coordinators resolve and where it
        starts among their addresses (``corral.runner.coordinators``): the system's resolver
        and a random start, unless a test gives its own."""
        self.settings = settings
        self._resolve, self._rng = resolve, rng
        self.transport: Transport = transport or _transport_for(self, settings, resolve, rng)
        self.attempts: dict[RunId, Attempt] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._draining = asyncio.Event()
        self._drain_deadline: float | None = None  # a forced drain's end (monotonic)
        # The runner's own environment: runs see only what ``run_environment`` lets through.
        self.host_env = dict(os.environ if host_env is None else host_env)
        # Each run's base environment by what its executor needs of the host's: the same few
        # a runner's life. Matched afresh for each run it was ~40 % of a no-op run's CPU here.
        self._base_envs: dict[tuple[str, ...], dict[str, str]] = {}
        self._minting: HttpLink | None = None  # asks for agents' tokens (agent_mcp)
        self.actors = ActorHost(
            settings.actor_kinds,
            self.transport.reports,
            getattr(self.transport, "kv", None),
            run_environment(self.host_env, settings.pass_env, ()),
        )

    @property
    def runner_id(self) -> RunnerId | None:
        runner_id: RunnerId | None = getattr(self.transport, "runner_id", None)
        return runner_id

    @property
    def free_slots(self) -> int:
        return self.settings.slots - len(self.attempts)

    def held(self) -> list[Held]:
        return [Held(run_id, a.attempt) for run_id, a in self.attempts.items()]

    async def slot_freed(self) -> None:
        self._slot_freed.clear()
        await self._slot_freed.wait()

    async def port_when_started(self, actor_id: str, generation: int) -> int | None:
        """The tunnel's lookup for a request to an actor: the request also counts as the
        actor's activity (its ``sleep_after`` idle timer starts over)."""
        port = await self.actors.port_when_started(actor_id, generation)
        if port is not None:
            self.actors.touch(actor_id)
        return port

    # ---- lifetime ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until ``drain()``; then let work finish (up to the grace) and leave."""
        kill_orphans()  # before any claim: a run given again must not start beside its last
        if not await self._open():
            return
        serving = asyncio.create_task(self.transport.serve(), name="transport")
        draining = asyncio.create_task(self._draining.wait())
        await asyncio.wait({serving, draining}, return_when=asyncio.FIRST_COMPLETED)
        self.transport.stop_claiming()
        await self._finish_work()
        serving.cancel()
        draining.cancel()
        await asyncio.gather(serving, draining, return_exceptions=True)
        await self.actors.close()
        await self.transport.close()
        if self._minting is not None:
            await self._minting.aclose()
        log.info("runner %s stopped", self.runner_id)

    async def _open(self) -> bool:
        """Register (long-poll) or connect (WebSocket), retried through outages; False
        when ``drain()`` (a signal) comes first: nothing is held yet, so leave at once.
        A refusal (4xx) is raised: it ends the runner."""
        opening = asyncio.create_task(self.transport.open(), name="open")
        draining = asyncio.create_task(self._draining.wait())
        await asyncio.wait({opening, draining}, return_when=asyncio.FIRST_COMPLETED)
        draining.cancel()
        if opening.done():
            opening.result()
            return True
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await opening
        # Bounded: an unreachable coordinator must not hold a stopping runner.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.transport.close(), CLOSE_BEFORE_OPEN_S)
        log.info(
            "runner stopped before it %s",
            "connected" if self.transport.kind == "websocket" else "registered",
        )
        return False

    def drain(self, grace_s: float | None = None) -> None:
        """Stop claiming; running work may finish within the drain grace period (or within
        ``grace_s``, when the coordinator forces a drain with a shorter one)."""
        grace_s = self.settings.drain_grace_s if grace_s is None else grace_s
        deadline = time.monotonic() + grace_s
        if self._drain_deadline is None or deadline < self._drain_deadline:
            self._drain_deadline = deadline
        if not self._draining.is_set():
            log.info("runner %s draining (%d running)", self.runner_id, len(self.attempts))
        self._draining.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.drain)

    async def _finish_work(self) -> None:
        # Its actors stop when the coordinator says so (GoingAway, once it knows we drain).
        pending = set(self._tasks) | self.actors.tasks
        if pending:
            grace_s = self.settings.drain_grace_s
            if self._drain_deadline is not None:
                grace_s = max(0.0, self._drain_deadline - time.monotonic())
            _, still = await asyncio.wait(pending, timeout=grace_s)
            if still:
                for attempt in self.attempts.values():
                    attempt.shutdown()  # gives the attempt back: another runner takes it
                self.actors.stop_all(now=False)
                # Their last reports may not get through (coordinator away): do not wait
                # forever; the coordinator takes back whatever it did not hear about.
                await asyncio.wait(still, timeout=self.settings.kill_grace_s + 10.0)

    # ---- orders from the transport -------------------------------------------------------

    def start(self, assignment: dict[str, Any]) -> None:
        run = Assignment.from_json(assignment)
        current = self.attempts.get(run.id)
        if current is not None:
            if current.attempt >= run.attempt:
                return  # already running it (a repeated assignment)
            # A newer attempt of a run we still hold (ours was given back, e.g. while our
            # last report waited for its ack): the old one stops, the new one runs.
            current.abandon("a newer attempt was assigned")
        try:
            executor = executor_for(
                run,
                claude_bin=self.settings.claude_bin,
                result_grace_s=self.settings.result_grace_s,
                mcp=agent_mcp(self.settings),
            )
        except CorralError as exc:
            executor = _Unrunnable(str(exc))
        kind = TaskAttempt if run.type is RunType.TASK else Attempt
        base_env = {**self._base_env(executor.host_env), **attempt_identity(run.id, run.attempt)}
        attempt = kind(run, executor, self.transport.reports, self.settings, base_env)
        self.attempts[run.id] = attempt
        task = asyncio.create_task(self._execute(attempt), name=f"run {run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _base_env(self, executor_needs: tuple[str, ...]) -> dict[str, str]:
        """What a run's process sees of the runner's environment (``run_environment``):
        never changed by its user, who spreads it into an environment of its own."""
        env = self._base_envs.get(executor_needs)
        if env is None:
            env = self._base_envs[executor_needs] = run_environment(
                self.host_env, self.settings.pass_env, executor_needs
            )
        return env

    async def _give_agent_its_token(self, attempt: Attempt) -> None:
        """An agent whose MCP server waits for a token minted for its run gets one; if the
        coordinator gives none, the agent runs without corral's MCP server."""
        executor = attempt.executor
        if not isinstance(executor, ClaudeExecutor) or self.runner_id is None:
            return
        mcp = executor.mcp
        if mcp is None or mcp.token is not None:
            return
        if self._minting is None:
            self._minting = HttpLink(
                self.settings.coordinator_url,
                token=self.settings.token,
                resolve=self._resolve,
                rng=self._rng,
            )
        try:
            token = await self._minting.agent_token(self.runner_id, attempt.run.id, attempt.attempt)
        except (CorralError, LinkDown) as exc:
            log.warning(
                "run %s: no agent token (%s): no corral MCP server for it", attempt.run.id, exc
            )
            return
        executor.mcp = dataclasses.replace(mcp, token=token)

    def cancel(self, run_id: RunId) -> None:
        if attempt := self.attempts.get(run_id):
            attempt.cancel()

    def abandon(self, run_id: RunId) -> None:
        if attempt := self.attempts.get(run_id):
            log.warning("run %s: no longer ours; stopping it", run_id)
            attempt.abandon()

    def stop_all_work(self) -> None:
        """The coordinator may be giving our runs (and actors) to others (we were away too
        long): what still runs is stopped and reports nothing more. An attempt whose work
        is done keeps its final report: the coordinator takes it only if the run is still
        ours (not given to another runner meanwhile), so done work is not done again."""
        for attempt in list(self.attempts.values()):
            if attempt.report is None:
                attempt.abandon("runner lost")
        self.actors.stop_all(now=True)

    async def _execute(self, attempt: Attempt) -> None:
        try:
            await self._give_agent_its_token(attempt)
            await attempt.execute()
        except Exception:
            log.exception("run %s: attempt crashed", attempt.run.id)
        finally:
            if self.attempts.get(attempt.run.id) is attempt:
                del self.attempts[attempt.run.id]
            self._slot_freed.set()


def _transport_for(
    runner: RunnerCore, settings: RunnerSettings, resolve: Resolve, rng: random.Random | None
) -> Transport:
    if settings.transport == "websocket":
        return WebSocketTransport(runner, settings, resolve=resolve, rng=rng)
    return PollTransport(runner, settings, resolve=resolve, rng=rng)


class _Unrunnable:
    """Stands in for an executor this runner lacks: the attempt fails with the reason."""

    host_env: tuple[str, ...] = ()
    missing_program_hint = ""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def prepare(self, run: Assignment, base_env: dict[str, str]) -> Any:
        raise ValueError(self.reason)

    def observer(self, run: Assignment) -> Any:
        return None


def agent_mcp(settings: RunnerSettings) -> AgentMcp | None:
    """corral's MCP server as this runner's agents start it: this runner's ``corral``,
    every coordinator URL the runner has (the agent's tools move on when one goes), the
    agent token (``agent_mcp``: one minted for each run, filled in as it starts; neither:
    no server)."""
    if settings.agent_token is None and not settings.agent_mcp:
        return None
    beside = Path(sys.executable).parent / "corral"  # the corral of this runner's install
    program = str(beside) if beside.exists() else "corral"
    return AgentMcp(
        command=(program, "mcp", "--url", ",".join(settings.coordinator_urls)),
        token=settings.agent_token,
    )
