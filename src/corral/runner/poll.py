"""The seed's HTTP long-poll transport.

    poller     long-polls for runs while a slot is free
    control    long-polls for the runner's numbered commands (cancel_run), from after the
               last one it handled, which that acknowledges
    heartbeat  tells the coordinator it is alive and which runs it holds; the answer says
               which it no longer holds (those are stopped at once)
    lease      stops all work when no heartbeat (nor claim) was answered for the lease
               (``lease.py``): by then the coordinator may be giving the runs to others
    outbox     reports, batched into POST /runner/events

Every call survives the coordinator's absence: retried forever with capped, jittered
backoff — or, when a coordinator answers that it is stopping (``coordinator_leaving``: a
deploy), at once on the next coordinator, then often, its runs kept. After a network
cut or a coordinator restart the runner registers again under the same id and reports
what it still runs, so nothing is started twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from corral import __version__
from corral.backoff import backoff_delay
from corral.errors import CorralError, LeaseLost, NotFound
from corral.ids import RunId, RunnerId
from corral.protocol.messages import Indexed
from corral.protocol.runner import HOLD_ON_RETRY_S as HOLD_ON_S
from corral.protocol.runner import RETRY_ELSEWHERE_S
from corral.runner.coordinators import Resolve, resolve_host
from corral.runner.lease import Lease
from corral.runner.link import HttpLink, Leaving, LinkDown
from corral.runner.outbox import Outbox
from corral.runner.settings import RunnerSettings
from corral.runner.transport import Host

log = logging.getLogger("corral.runner")
T = TypeVar("T")
MAX_CANCELLED_EARLY = 1000
LEASE_LOOK_S = 1.0  # the lease loop looks at least this often


class PollTransport:
    kind = "poll"

    def __init__(
        self,
        host: Host,
        settings: RunnerSettings,
        link: HttpLink | None = None,
        *,
        resolve: Resolve = resolve_host,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.settings = settings
        self.link = link or HttpLink(
            settings.coordinator_url, token=settings.token, resolve=resolve, rng=rng
        )
        self.runner_id: RunnerId | None = None
        self.heartbeat_interval_s = 60.0
        self.poll_timeout_s = 30.0
        self._registered = asyncio.Event()
        self._register_lock = asyncio.Lock()
        self._poller: asyncio.Task[None] | None = None
        # Our processes must be gone (SIGTERM, grace, SIGKILL) before the lease ends.
        self.lease = Lease(stop_margin_s=settings.kill_grace_s + 1.0)
        self.reports = Outbox(
            self.link,
            lambda: self.rid,
            max_backoff_s=settings.max_backoff_s,
            answer_wait_s=self.lease.answer_wait_s,
        )
        self._commands_done = 0  # its commands handled up to here (the control cursor)
        # Runs cancelled before their claim's answer came (the two come by two requests):
        # each is cancelled as it starts. Bounded: a claim whose answer was lost never comes.
        self._cancelled_early: dict[RunId, None] = {}
        # A coordinator said it stops: calls go to the next at once, then every HOLD_ON_S
        # until one answers (or the lease runs out), not on a growing backoff.
        self.holding_on = False
        # Registered again (the coordinator had forgotten or lost us): the reports queued
        # before go before the next claim (``_claim``).
        self._reports_first = False

    @property
    def rid(self) -> RunnerId:
        assert self.runner_id is not None, "registered first"
        return self.runner_id

    async def open(self) -> None:
        await self._register()

    async def serve(self) -> None:
        self._poller = asyncio.create_task(self._unending("poller", self._poll_loop))
        loops = [
            self._poller,
            asyncio.create_task(self._unending("control", self._control_loop)),
            asyncio.create_task(self._unending("heartbeat", self._heartbeat_loop)),
            asyncio.create_task(self._unending("lease", self._lease_loop)),
            asyncio.create_task(self._unending("outbox", self.reports.run)),
        ]
        try:
            # Not gather: the poller is cancelled on purpose when the runner drains, and
            # the others (the outbox above all) must go on delivering the last reports.
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and (error := task.exception()) is not None:
                    raise error
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _unending(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run ``loop`` until cancelled: whatever it raises is logged, and it starts again
        after a backoff. A runner whose outbox, heartbeat or poller died would hold its
        runs without reporting them."""
        failures = 0
        while True:
            try:
                await loop()
                return
            except Exception:
                delay = backoff_delay(failures, cap=self.settings.max_backoff_s)
                log.exception("%s failed; starting it again in %.1fs", name, delay)
                failures += 1
                await asyncio.sleep(delay)

    def stop_claiming(self) -> None:
        if self._poller is not None:
            self._poller.cancel()

    async def close(self) -> None:
        if self.runner_id is not None:
            with contextlib.suppress(LinkDown, CorralError):
                await self.link.deregister(self.runner_id)
        await self.link.aclose()

    # ---- registration --------------------------------------------------------------------

    async def _register(self) -> None:
        async with self._register_lock:
            registration = await self._retry(
                "register",
                lambda: self._answered(
                    self.link.register(
                        name=self.settings.name,
                        hostname=socket.gethostname(),
                        labels=list(self.settings.labels),
                        slots=self.settings.slots,
                        version=__version__,
                        runner_id=self.runner_id,
                        held=self.host.held(),
                    )
                ),
                refusal_is_final=True,
            )
            self.lease.threshold_s = registration.lost_after_s
            if self.runner_id and registration.runner_id != self.runner_id:
                log.warning(
                    "coordinator forgot runner %s; now %s", self.runner_id, registration.runner_id
                )
            if registration.runner_id != self.runner_id:
                self._commands_done = 0  # a new identity's commands are numbered from 1
            self._reports_first = self.runner_id is not None
            self.runner_id = registration.runner_id
            self.heartbeat_interval_s = registration.heartbeat_interval_s
            self.poll_timeout_s = registration.poll_timeout_s
            self._abandon(registration.abandon)
            self._registered.set()
            log.info(
                "runner %s registered (%s, %d slots, long-poll)",
                self.runner_id,
                self.settings.name,
                self.settings.slots,
            )

    async def _reregister(self) -> None:
        self._registered.clear()
        await self._register()

    def _abandon(self, abandon: list[RunId]) -> None:
        for run_id in abandon:
            self.host.abandon(run_id)

    def _command(self, command: Indexed) -> None:
        kind = command.body.get("type")
        if kind == "cancel_run":
            run_id = RunId(str(command.body["run_id"]))
            if any(h.run_id == run_id for h in self.host.held()):
                self.host.cancel(run_id)
            else:
                self._cancelled_early[run_id] = None
                while len(self._cancelled_early) > MAX_CANCELLED_EARLY:
                    del self._cancelled_early[next(iter(self._cancelled_early))]
        elif kind == "abandon_run":
            self.host.abandon(RunId(str(command.body["run_id"])))
        else:
            log.warning("command %r ignored: a long-poll runner does not take it", kind)
        self._commands_done = max(self._commands_done, command.idx)

    def _start(self, assignment: dict[str, Any]) -> None:
        self.host.start(assignment)
        run_id = RunId(str(assignment["run_id"]))
        if run_id in self._cancelled_early:
            del self._cancelled_early[run_id]
            self.host.cancel(run_id)

    async def _answered(self, call: Awaitable[T]) -> T:
        """A call by which the coordinator hears we are alive (a registration, a
        heartbeat): once answered, the lease runs from when it was sent."""
        sent_at = time.monotonic()
        answer = await call
        self.lease.heard(sent_at)
        return answer

    async def _retry(
        self, what: str, call: Callable[[], Awaitable[T]], *, refusal_is_final: bool = False
    ) -> T:
        """Call until it answers. ``NotFound``/``LeaseLost`` (register again) are raised;
        any other refusal is logged and retried like an outage, never dropped silently —
        but with ``refusal_is_final`` (a registration: trying again cannot change the
        answer) it is raised too, and ends the runner."""
        failures = 0
        elsewhere = 0  # the other coordinators tried at once since the last backoff
        told = False  # this call was answered coordinator_leaving
        while True:
            try:
                answer = await call()
            except (NotFound, LeaseLost):
                raise
            except Leaving as exc:
                # Not a failure: a deploy. The link moved to the next coordinator: try it
                # at once; with no other (or it stops too), try again often, not backing off.
                if not self.holding_on:
                    log.info("%s: moving on, runs kept", exc)
                delay = 0.0 if self.link.coordinators > 1 and not told else HOLD_ON_S
                told = self.holding_on = True
                await asyncio.sleep(delay)
                continue
            except (LinkDown, CorralError) as exc:
                if refusal_is_final and isinstance(exc, CorralError):
                    raise
                if isinstance(exc, LinkDown) and elsewhere < self.link.coordinators - 1:
                    # The link moved to the next coordinator: try it at once, as the
                    # WebSocket does; the backoff is for a round where every one failed.
                    elsewhere += 1
                    log.warning("%s: coordinator unreachable (%s); trying the next", what, exc)
                    await asyncio.sleep(RETRY_ELSEWHERE_S)
                    continue
                elsewhere = 0
                backoff_s = backoff_delay(failures, cap=self.settings.max_backoff_s)
                delay = self.lease.retry_in(time.monotonic(), backoff_s)
                if self.holding_on:  # a coordinator said it stops: be there when it is back
                    delay = min(delay, HOLD_ON_S)
                why = "coordinator unreachable" if isinstance(exc, LinkDown) else "refused"
                log.warning("%s: %s (%s); retry in %.1fs", what, why, exc, delay)
                # The quick tries that fit inside the lease are not rounds of the backoff:
                # once the lease is gone it goes on from where it was, not from its cap.
                failures += delay == backoff_s
                await asyncio.sleep(delay)
                continue
            self.holding_on = False
            return answer

    # ---- loops ---------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            while self.host.free_slots <= 0:
                await self.host.slot_freed()
            try:
                runs = await self._retry("poll", self._claim)
            except (NotFound, LeaseLost):
                await self._reregister()
                continue
            for data in runs:
                self._start(data)

    async def _claim(self) -> list[dict[str, Any]]:
        """One long poll. Runs in its answer were claimed, and a claim writes our heartbeat
        (``store/claims.py``): the lease runs from when the poll was sent.

        After registering again, the reports queued before go first: a final report of work
        done while we were away may end a run that this runner would otherwise claim back
        and run again (a late report, ``RunStore.finish``)."""
        if self._reports_first:
            await self.reports.delivered()
            self._reports_first = False
        sent_at = time.monotonic()
        runs = await self.link.poll(self.rid, self.host.free_slots, self.poll_timeout_s)
        if runs:
            self.lease.heard(sent_at)
        return runs

    async def _control_loop(self) -> None:
        while True:
            await self._registered.wait()
            commands = await self._retry(
                "control",
                lambda: self.link.control(self.rid, self._commands_done, self.poll_timeout_s),
            )
            for command in commands:
                self._command(command)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                abandon = await self._retry(
                    "heartbeat",
                    lambda: self._answered(
                        self.link.heartbeat(
                            self.rid, self.host.held(), timeout_s=self.lease.answer_wait_s()
                        )
                    ),
                )
            except (NotFound, LeaseLost):
                await self._reregister()  # declared lost while we were away
                continue
            self._abandon(abandon)

    async def _lease_loop(self) -> None:
        while True:
            ends_at = self.lease.ends_at()
            now = time.monotonic()
            if ends_at is None or now < ends_at:
                # Woken early at worst (an answer moved the end on): look again.
                wait = LEASE_LOOK_S if ends_at is None else min(LEASE_LOOK_S, ends_at - now)
                await asyncio.sleep(wait)
                continue
            if not self.lease.lapse(now):
                continue
            # Seen late, the runner itself was not running (suspended, starved): its work
            # went on all the while, and whether it is still its own is the coordinator's
            # to say — one heartbeat asks. Seen on time, the link is down: stop now.
            if now - ends_at > LEASE_LOOK_S and await self._heartbeat_once():
                continue
            self.holding_on = False  # no lease to keep: back to the backoff
            if self.host.held():
                log.warning("no heartbeat answered for the lease: stopping all work")
                self.host.stop_all_work()

    async def _heartbeat_once(self) -> bool:
        """One heartbeat, not retried: True if answered (the lease runs again, and the
        runs that are no longer ours are stopped)."""
        try:
            abandon = await self._answered(
                self.link.heartbeat(self.rid, self.host.held(), self.lease.answer_wait_s())
            )
        except (LinkDown, CorralError):
            return False
        self._abandon(abandon)
        return True
