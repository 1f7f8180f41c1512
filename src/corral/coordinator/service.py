"""The coordinator's behaviour: store calls off the event loop, and who to wake after them.

Every state lives in the store; this object only holds the wake-up events of waiters
that are connected right now, so a restarted coordinator loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import TypeVar

import anyio.to_thread

from corral.backoff import backoff_delay
from corral.clock import Clock
from corral.coordinator import scope
from corral.coordinator.actors import Actors
from corral.coordinator.auth import Authenticator, Principal
from corral.coordinator.autoscaler import Autoscaler
from corral.coordinator.claims import READ_LIMIT, ClaimBoard
from corral.coordinator.connections import Connections
from corral.coordinator.deadlines import SocketDeadlines
from corral.coordinator.event_hub import EVENTS, EventHub
from corral.coordinator.link_core import Outcome, apply_reports, may_owe_callback, wakeups
from corral.coordinator.metrics import Metrics
from corral.coordinator.notifier import (
    CALLBACKS_DUE,
    LOGS,
    RUNS_AVAILABLE,
    Notifier,
    logs_topic,
    runner_topic,
    wait_for,
)
from corral.coordinator.peers import Peers
from corral.coordinator.requests import build_new_run
from corral.coordinator.schemas import (
    CreateRun,
    RegisterRunner,
    RunnerEvent,
)
from corral.coordinator.settings import CoordinatorSettings
from corral.coordinator.tunnel import TunnelHub
from corral.coordinator.waiters import SocketWaiters
from corral.coordinator.writer import StoreWriter, answer
from corral.errors import Conflict, CorralError, Forbidden, LeaseLost
from corral.ids import RunId, RunnerId
from corral.protocol.messages import CLOSE_POLICY_VIOLATION
from corral.runners import Held, Runner, RunnerState, RunnerSync
from corral.runs import AgentSpec, Ended, Run, RunStatus
from corral.store import LogEntry, Reconciled, Store, coordinators, leases
from corral.store.claims import Claimable
from corral.store.commands import Command
from corral.store.events import EventStore
from corral.store.leases import RECONCILER
from corral.store.retention import Collected
from corral.store.run_requests import RunRequest
from corral.subagents import Limits

log = logging.getLogger("corral.coordinator")
CLOCK_SKEW_S = 5.0
# The reconciler's lease: renewed each pass, taken over this long after its holder died.
LEASE_S = 5.0
# A delivery that raced another coordinator's is rolled back, and looked at again this often.
_DELIVERY_TRIES = 3
T = TypeVar("T")


class Coordinator:
    def __init__(
        self,
        store: Store,
        settings: CoordinatorSettings,
        clock: Clock,
        profiles: dict[str, AgentSpec],
    ) -> None:
        self.store = store
        self.settings = settings
        store.runs.subagent_limits = Limits(
            max_depth=settings.max_subagent_depth, max_children=settings.max_subagent_children
        )
        self.clock = clock
        self.profiles = profiles
        self.notifier = Notifier()
        self.metrics = Metrics()
        self.events = EventHub(
            EventStore(store.db),
            self.notifier,
            self.metrics,
            poll_interval_s=settings.events_poll_interval_s,
            capacity=settings.event_queue_size,
        )
        self.claims = ClaimBoard(
            lambda limit: self.in_thread(store.runs.claimable, clock.now(), limit)
        )
        self.waiters = SocketWaiters()  # runner sockets with a free slot (``dispatch_forever``)
        self.connections = Connections()
        self.deadlines = SocketDeadlines(clock)  # the runner sockets' one timer
        self.actors = Actors(store, self.notifier, clock)
        self.tunnels = TunnelHub(self.connections)  # the gateway's requests to runners
        # The gateway forwards requests for runners connected to another coordinator.
        self.peers = Peers(
            settings.endpoint_url,
            lambda runner_id: self.in_thread(store.runners.coordinator_url, runner_id),
        )
        self.autoscaler = Autoscaler(self)  # serverless pools' runners
        self.auth = Authenticator(
            store.tokens, settings.token, cache_s=settings.token_cache_s, now=clock.now
        )
        self._runner_tokens: dict[str, str] = {}  # runner id → its token id (never changes)
        self.started_at = clock.now()  # up since (store/coordinators.py)
        self._claimable_seen_at = 0.0  # the reconciler's last look for claimable runs
        self.node = secrets.token_hex(8)  # its name as a lease holder (store/leases.py)
        self._delivering = asyncio.Lock()  # one callback delivery at a time in this process
        # It stops: it takes no lease again, and answers runners' calls (long-polls waiting
        # included) with ``coordinator_leaving`` (``leave``).
        self.left = asyncio.Event()
        self.streams_ended = False  # it stops: followed logs end (``end_streams``)
        self.reconciling = False  # it held the reconciler's lease at its last pass
        self.first_pass = asyncio.Event()  # set once a pass has looked at the lease
        # The runner sockets' writes, committed in groups (``in_writer``).
        self.writer = StoreWriter(store.db, lambda: self.notifier.notify(EVENTS))

    async def in_thread(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``fn(*args, **kwargs)`` (a blocking store call) on a worker thread, off the loop,
        timed for the metrics."""
        try:
            return await anyio.to_thread.run_sync(partial(self._timed, fn, *args, **kwargs))
        finally:
            self.notifier.notify(EVENTS)  # it may have written events: streams look

    async def in_writer(
        self, runner_id: str, fn: Callable[..., T], *args: object, **kwargs: object
    ) -> T:
        """``fn(*args, **kwargs)``, a store call that writes for the runner ``runner_id``, as
        ``in_thread`` runs it — with the others queued meanwhile, one commit for them all
        (``writer.py``)."""
        return await answer(self.submit_write(runner_id, fn, *args, **kwargs))

    def submit_write(
        self, runner_id: str, fn: Callable[..., T], *args: object, **kwargs: object
    ) -> asyncio.Future[T]:
        """``in_writer``'s call, queued at once (``StoreWriter.submit``): it shares a commit
        with the others queued in this turn of the event loop."""
        return self.writer.submit(partial(self._timed, fn, *args, **kwargs), runner_id)

    def _timed(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.metrics.store_call(_operation(fn), time.perf_counter() - started)

    # ---- clients -------------------------------------------------------------------------

    async def create_runs(
        self,
        bodies: Sequence[CreateRun],
        principal: Principal | None = None,
        idempotency_key: str | None = None,
    ) -> list[Run]:
        """``principal``: the caller; an agent's runs are its own session's children.
        ``idempotency_key``: the request's; sent again by the same caller, the runs it
        created then (``store.run_requests``).

        While runner sockets wait for runs these fit, those sockets claim in the same
        commit as the create: the create goes to the store writer, and the sockets are woken
        in the same turn of the event loop, so their claims join its group (``_offer``).
        The new runs are then on their way to a runner when the caller hears of them, with
        no round of the socket waiters (a read) and no commit of its own for the claim."""
        # Taken before the claims' time: a run is claimable from its creation on.
        now = self.clock.now()

        def validate_and_create() -> list[Run]:
            asked = bodies
            if principal is not None and principal.run_id is not None:
                asked = scope.confine(self.store, principal.run_id, bodies)
            specs = [
                build_new_run(b, self.store, self.profiles, self.settings.max_prompt_bytes)
                for b in asked
            ]
            return self.store.runs.create_many(specs, now, request)

        request = None
        if idempotency_key is not None:
            caller = "" if principal is None else principal.token_id
            asked = [b.model_dump(mode="json") for b in bodies]
            request = RunRequest.of(caller, idempotency_key, asked)

        if self.waiters and self.writer.open and _offerable(bodies, principal):
            created = self.submit_write("", validate_and_create)
            # By their labels: the runs have no id yet, so nothing is reserved.
            self._offer(
                [
                    Claimable(RunId(f"new-{i}"), None, frozenset(b.labels))
                    for i, b in enumerate(bodies)
                ],
                reserve=False,
            )
            runs = await answer(created)
        else:
            runs = await self.in_thread(validate_and_create)
            # Sockets that began to wait meanwhile (or that none of the runs fit, or that a
            # resume requires) are woken as a round would, without the round's read.
            new = [
                Claimable(r.id, r.required_runner, frozenset(r.labels))
                for r in runs
                if r.status is RunStatus.PENDING
            ]
            if self.waiters and self._offer(new, reserve=True):
                return runs  # a socket that does not claim what it was given starts a round
        # Whatever the sockets woken did not take (an older run came first), a round hands
        # out; and the long-polls look.
        self.notifier.notify(RUNS_AVAILABLE)
        return runs

    def _offer(self, new: list[Claimable], *, reserve: bool) -> bool:
        """Wake the waiting sockets that the ``new`` runs fit, as a round of the socket
        waiters does, their claims queued at once; each with the runs reserved for it if
        ``reserve``. Whether every run went to one."""
        reserved: set[RunId] = set()
        for waiter, runs in self.waiters.assign(new, reserved, complete=True):
            waiter.wake(runs if reserve else None)
        return bool(new) and len(reserved) == len(new)

    async def cancel(self, run_id: str, principal: Principal | None = None) -> Run:
        if principal is not None and principal.run_id is not None:
            await self.in_thread(scope.check_cancel, self.store, principal.run_id, run_id)
        run = await self.in_thread(self.store.runs.request_cancel, run_id, self.clock.now())
        if run.runner_id:
            self.notifier.notify(runner_topic(run.runner_id))
        self.notifier.notify(logs_topic(run.id))
        if may_owe_callback(run):  # a pending child cancelled: it ended at once
            self.notifier.notify(CALLBACKS_DUE)
        return run

    async def follow_logs(self, run_id: str, after_id: int) -> AsyncIterator[LogEntry | Run]:
        """Yield log lines as they arrive, then the finished run."""

        def look(after_id: int) -> tuple[Run, list[LogEntry]]:
            # The run first: a run's lines are all stored before it ends, so if it had ended,
            # the read of its lines after it finds the last of them. One trip to a worker
            # thread a look (they were two, and three at the end): a client follows its run
            # while the runner starts its process, on the same cores.
            run = self.store.runs.get(run_id)
            return run, self.store.logs.read(run_id, after_id)

        while True:
            event = self.notifier.event(logs_topic(run_id))
            run, entries = await self.in_thread(look, after_id)
            for entry in entries:
                yield entry
                after_id = entry.id
            if entries:
                continue
            if run.status.is_terminal:
                yield run
                return
            if self.streams_ended:
                return  # without the run: its client goes on elsewhere, after its last line
            await wait_for(event, self.settings.poll_timeout_s)

    # ---- runners -------------------------------------------------------------------------

    async def check_runner(self, principal: Principal, runner_id: str) -> None:
        """Refuse a call naming a runner that registered with another token (its id is
        public: ``GET /runs`` shows it) — nobody else may report for it."""
        owner = self._runner_tokens.get(runner_id)
        if owner is None:
            owner = await self.in_thread(self.store.runners.token_id, runner_id)
            if owner is None:
                return  # registered before tokens: the next register binds it
            self._runner_tokens[runner_id] = owner
        if owner != principal.token_id:
            raise Forbidden(
                "that runner id was registered with another token", code="runner_not_yours"
            )

    async def register(
        self, body: RegisterRunner, principal: Principal, transport: str | None = None
    ) -> tuple[Runner, RunnerSync]:
        """``principal``: the caller (the runner id is bound to its token); ``transport``: the
        wire the runner speaks, when not corral's own (``compat_ao``)."""
        principal.check_labels(body.labels)
        held = None if body.held is None else [Held(RunId(h.run_id), h.attempt) for h in body.held]
        runner, sync = await self.in_thread(
            self.store.runners.register,
            name=body.name,
            hostname=body.hostname,
            labels=body.labels,
            slots=body.slots,
            version=body.version,
            transport=transport or body.transport,
            now=self.clock.now(),
            runner_id=body.runner_id,
            held=held,
            token_id=principal.token_id,
        )
        self.notifier.notify(RUNS_AVAILABLE)  # resumes bound to this runner's name may run now
        return runner, sync

    async def poll(
        self,
        runner_id: RunnerId,
        max_runs: int,
        timeout_s: float,
        gone: asyncio.Future[None] | None = None,
    ) -> list[Run]:
        """Claim up to ``max_runs``; if none is there, wait until one is created or timeout.

        Waiting writes nothing: a claim is tried only for runs the claim board reserved
        for this runner (``ClaimBoard``). ``gone`` says whether the runner hung up (it
        drains, or gave up waiting): its runs would be claimed for nobody, so the wait
        ends without claiming.
        """
        runner = await self._runner_to_claim(runner_id)
        with self.metrics.polls_waiting.track_inprogress():
            return await self._poll(runner, max_runs, timeout_s, gone)

    async def _poll(
        self, runner: Runner, max_runs: int, timeout_s: float, gone: asyncio.Future[None] | None
    ) -> list[Run]:
        runner_id = runner.id
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            event = self.notifier.event(RUNS_AVAILABLE)
            if gone is not None and gone.done():
                return []
            # A draining runner claims nothing: it waits, as it always did.
            active = runner.state is RunnerState.ACTIVE
            wanted = await self.claims.reserve(runner, max_runs, event) if active else []
            if wanted is None or wanted:
                try:
                    runs = await self.in_thread(
                        self.store.runs.claim, runner_id, max_runs, self.clock.now()
                    )
                except BaseException:
                    self.notifier.notify(RUNS_AVAILABLE)  # what we reserved, others may take
                    raise
                if wanted is not None and {r.id for r in runs} != set(wanted):
                    # Not what was reserved: what the claim left, others may take — let every
                    # poll look again. Nothing at all: our runner may have changed (labels, a
                    # drain, lost): read it again.
                    if not runs:
                        runner = await self._runner_to_claim(runner_id)
                    if runner.state is RunnerState.ACTIVE:
                        self.notifier.notify(RUNS_AVAILABLE)
                for run in runs:
                    claimed_at = run.claimed_at or run.created_at
                    self.metrics.claimed("poll", run.created_at, claimed_at, run.attempts)
                if runs:
                    return runs
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or not await wait_for(event, remaining, gone):
                return []

    async def dispatch_forever(self) -> None:
        """Rounds of the socket waiters (``coordinator.waiters``): each time runs become
        available, one read of the claimable runs (the claim board's round, shared with the
        long-polls) and the waiting sockets they fit are woken, each with its runs. Every
        ``poll_timeout_s`` without a wake-up, a round is made anyway (a bounded re-scan:
        one read): what a wake-up lost on the way would have left pending is found."""
        failures = 0
        event = self.notifier.event(RUNS_AVAILABLE)
        while True:
            if not await wait_for(event, self.settings.poll_timeout_s) and self.waiters:
                self.notifier.notify(RUNS_AVAILABLE)  # a fresh read, for the polls too
            # Taken before the read: runs created from now on start another round.
            event = self.notifier.event(RUNS_AVAILABLE)
            if not self.waiters:
                continue
            try:
                claimable, reserved = await self.claims.look(event)
            except Exception:  # the database is away: look again soon
                log.exception("looking for runs for waiting sockets failed")
                failures += 1
                await asyncio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
                self.notifier.notify(RUNS_AVAILABLE)
                continue
            failures = 0
            complete = len(claimable) < READ_LIMIT
            for waiter, runs in self.waiters.assign(claimable, reserved, complete):
                waiter.wake(runs)

    async def _runner_to_claim(self, runner_id: RunnerId) -> Runner:
        """The runner of a poll; NotFound if unknown, ``runner_lost`` (as a claim says it)
        if it was declared lost or stopped: it must register again."""
        runner = await self.in_thread(self.store.runners.get, runner_id)
        if runner.state in (RunnerState.LOST, RunnerState.STOPPED):
            raise LeaseLost(
                f"runner {runner_id} is {runner.state}; register again", code="runner_lost"
            )
        return runner

    async def control(
        self,
        runner_id: RunnerId,
        after: int,
        timeout_s: float,
        gone: asyncio.Future[None] | None = None,
    ) -> list[Command]:
        """A long-poll runner's commands (cancel_run …): it has handled those up to
        ``after``, which are acknowledged; wait until there are more, and return them."""
        await self.in_thread(self.store.runners.get, runner_id)  # an unknown runner: 404 at once
        if after > 0:
            await self.in_thread(self.store.commands.acknowledge, runner_id, after)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            event = self.notifier.event(runner_topic(runner_id))
            commands = await self.in_thread(self.store.commands.unacknowledged, runner_id, after)
            if commands:
                return commands
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or not await wait_for(event, remaining, gone):
                return []

    async def heartbeat(self, runner_id: str, held: Sequence[Held] | None) -> RunnerSync:
        return await self.in_thread(self.store.runners.heartbeat, runner_id, held, self.clock.now())

    async def deregister(self, runner_id: str) -> Runner:
        runner = await self.in_thread(
            self.store.runners.set_state, runner_id, RunnerState.STOPPED, self.clock.now()
        )
        self.notifier.notify(RUNS_AVAILABLE)
        return runner

    async def drain_runner(self, runner_id: str, grace_s: float) -> None:
        """Forced drain: no new work; the runner finishes (up to ``grace_s``) and leaves."""
        # Stored with its grace: if the runner's socket is on another coordinator, that one
        # hears of it (NOTIFY) and passes it on (``SocketPump``).
        await self.in_thread(
            self.store.runners.set_state,
            runner_id,
            RunnerState.DRAINING,
            self.clock.now(),
            grace_s=grace_s,
        )
        if (link := self.connections.by_runner.get(runner_id)) is not None:
            await link.drain(grace_s)

    async def stop_runner(self, runner_id: str) -> None:
        """Stop a runner now: what it holds goes back to pending; its socket is closed (by
        the coordinator holding it, told by its stored state)."""
        await self.deregister(runner_id)
        if (link := self.connections.by_runner.get(runner_id)) is not None:
            await link.stop()

    def end_streams(self) -> None:
        """The coordinator is stopping: event streams and followed logs end now, cleanly,
        after what they have sent (their clients go on after their last id, at another
        coordinator or here once restarted), instead of holding the server's shutdown for
        its whole grace and then being cut."""
        self.events.end_streams()
        self.streams_ended = True
        self.notifier.notify(*(t for t in self.notifier.waited() if t.startswith(LOGS)))

    async def leave(self) -> None:
        """A planned stop (SIGTERM), before the sockets are cut: the heartbeats of runners
        that pinged since the last pass are written, the reconciler's lease is given up
        (another coordinator takes it at its next pass, not 5 s later), and every runner
        connected here is told to move to another coordinator at once, keeping its runs,
        or to hold on until this one is back (``ServerSession.leave``); long-poll runners
        are told so by the answer to their calls (``api_runners``)."""
        self.left.set()
        now = self.clock.now()
        try:
            await self._write_heartbeats(now)
            await self.in_thread(coordinators.beat, self.store.db, self.node, self.started_at, now)
            await self.in_thread(leases.release, self.store.db, RECONCILER, self.node)
        except Exception:  # the database is away: the runners must still be told
            log.exception("stopping: could not write heartbeats or give up the lease")
        links = list(self.connections.by_runner.values())
        await asyncio.gather(*(link.leave() for link in links), return_exceptions=True)
        if links:
            log.info("stopping: told %d runners to move to another coordinator", len(links))

    @property
    def leaving(self) -> bool:
        return self.left.is_set()

    async def close_token(self, token_id: str) -> None:
        """A token was revoked: the sockets opened with it are closed (they cannot reconnect)."""
        for link in list(self.connections.by_runner.values()):
            if link.token_id == token_id:
                await link.close(CLOSE_POLICY_VIOLATION, "corral.token_revoked")

    async def apply_events(
        self, runner_id: str, events: Sequence[RunnerEvent]
    ) -> list[CorralError | None]:
        """Apply a runner's batched reports in order, in one transaction off the event loop;
        each gets its own answer (a refusal, or None)."""
        return [error for error, _ in await self._apply(runner_id, events)]

    async def apply_event(self, runner_id: str, event: RunnerEvent) -> Run | None:
        """One report made over a per-run endpoint (the seed's HTTP runner API): the same
        event the socket applies, by the same dispatcher, with the same wake-ups. Its
        refusal is raised; a final report returns the run it finished."""
        ((error, run),) = await self._apply(runner_id, [event])
        if error is not None:
            raise error
        # A lone final report is applied by ``RunStore.finish``: the whole run, never an
        # ``Ended`` (that is ``finish_together``'s, for two or more).
        assert not isinstance(run, Ended)
        return run

    async def _apply(self, runner_id: str, events: Sequence[RunnerEvent]) -> list[Outcome]:
        applied = await self.in_thread(
            apply_reports, self.store, runner_id, events, self.clock.now(), lambda *_: None
        )
        self.notifier.notify(*wakeups(events, applied.outcomes, applied.changed))
        return applied.outcomes

    async def rescan(self) -> None:
        """Notifications may have been lost (the listener was away: ``listener.py``). Every
        waiter looks at the store again — but the runner sockets held here only where one
        read of their runners' rows shows something they have not passed on (commands past
        what they sent, a drain, a stop): woken all at once, each socket read its runner's
        row and claimed, and 10,000 of them at once starved everything else."""
        links = dict(self.connections.by_runner)
        held = {runner_topic(runner_id) for runner_id in links}
        self.notifier.notify(*(t for t in self.notifier.waited() if t not in held))
        try:
            heads = await self.in_thread(self.store.runners.heads, list(links))
        except Exception:  # the database is away again: each socket looks for itself
            log.exception("re-scan: reading the runners' rows failed")
            self.notifier.notify(*held)
            return
        behind = [
            runner_topic(runner_id)
            for runner_id, link in links.items()
            if runner_id not in heads or link.behind(heads[runner_id])
        ]
        self.notifier.notify(*behind)
        if behind:
            log.info("re-scan: %d of %d runner sockets look again", len(behind), len(links))

    # ---- reconciliation ------------------------------------------------------------------

    async def reconcile_once(self) -> Reconciled:
        now = self.clock.now()
        await self._write_heartbeats(now)
        # Every coordinator says it is up (a runner is lost only when one was up to hear it).
        await self.in_thread(coordinators.beat, self.store.db, self.node, self.started_at, now)
        done = Reconciled()
        # What must happen once (declaring runners lost, ending overdue runs, retries,
        # actors' ticks, retention) is done by the coordinator holding the reconciler's lease.
        self.reconciling = not self.leaving and await self.in_thread(
            leases.hold, self.store.db, RECONCILER, self.node, now, LEASE_S
        )
        self.first_pass.set()
        if self.reconciling:
            done = await self._reconcile_held(now)
        # Also wakes pollers for runs whose rate-limit backoff ended, and for runs that
        # another process (a second coordinator, a CLI) wrote to the same database — only
        # when such runs came since the last look: waking 2,000 waiting polls or 1,000 idle
        # sockets each second for a run none of them can take is not free. (Clocks of
        # other processes may lag: the look reaches back a little further.)
        since = self._claimable_seen_at - CLOCK_SKEW_S
        self._claimable_seen_at = now
        if await self.in_thread(self.store.runs.has_claimable, now, since=since):
            self.notifier.notify(RUNS_AVAILABLE)
        return done

    async def _write_heartbeats(self, now: float) -> None:
        """WebSocket runners ping every few seconds: their heartbeats are written together.
        A write that fails (the database is away) is tried again with the next: each ping
        was answered, so its runner holds its runs on, and must not be found silent and
        declared lost once the database is back — its runs would then start elsewhere
        while it still runs them."""
        if pinged := self.connections.take_pinged():
            try:
                await self.in_thread(self.store.runners.touch, pinged, now)
            except BaseException:
                self.connections.not_written(pinged)
                raise

    async def _reconcile_held(self, now: float) -> Reconciled:
        # No runner could heartbeat while no coordinator was up: after a restart, each gets
        # its whole threshold to check in before it is declared lost — unless another
        # coordinator was up to hear it all along (``store/coordinators.py``).
        done = await self.in_thread(
            self.store.reconcile,
            now,
            lost_after_s=self.settings.lost_after_s,
            timeout_grace_s=self.settings.timeout_grace_s,
            up_since=self.started_at,
        )
        if done.changed:
            log.warning(
                "reconciled: lost runners %s, requeued %s, waiting lost %s, failed %s, "
                "timed out %s",
                done.lost_runners,
                done.requeued,
                done.waiting,
                done.failed,
                done.timed_out,
            )
            self.notifier.notify(*(logs_topic(r) for r in done.failed + done.timed_out))
            # A lost runner's socket may still be open here, waiting (no free slot): its
            # next claim tells it to connect again.
            self.notifier.notify(*(runner_topic(r) for r in done.lost_runners))
        await self.actors.tick()
        await self.deliver_callbacks(now)
        # Tasks whose retry backoff has ended are claimed into runs.
        await self.in_thread(self.store.tasks.schedule_all, now)
        return done

    async def deliver_callbacks(self, now: float) -> None:
        """Resume the idle parents of async_callback children that ended (once each:
        ``store/callbacks.py``); drop the callbacks of parents gone or failed."""
        async with self._delivering:  # the deliverer and the reconciler take turns
            for _ in range(_DELIVERY_TRIES):
                try:
                    done = await self.in_thread(self.store.callbacks.deliver, now)
                except Conflict as exc:
                    # Another coordinator settled some of them first and this whole delivery
                    # rolled back: look again, at what it left.
                    log.info("callbacks: %s", exc)
                    continue
                if done.resumes:
                    log.info("resumed parents %s", [r.session_id for r in done.resumes])
                    self.notifier.notify(RUNS_AVAILABLE)
                if done.dropped:
                    log.warning("dropped callbacks of %s: parent gone or failed", done.dropped)
                return

    async def deliver_callbacks_forever(self) -> None:
        """Deliver callbacks as soon as a run's end may have made one due: the report that
        ended it wakes ``CALLBACKS_DUE`` (``link_core.wakeups``) after its transaction,
        which recorded the callback, committed. The reconciler's pass delivers them too:
        what a coordinator killed before it delivered left pending is found there."""
        while True:
            due = self.notifier.event(CALLBACKS_DUE)  # held across the look: no end is missed
            try:
                await self.deliver_callbacks(self.clock.now())
            except Exception:  # a database hiccup: the reconciler's pass delivers them
                log.exception("delivering callbacks failed")
            await due.wait()

    async def collect_once(self) -> Collected | None:
        """Retention, by the coordinator holding the reconciler's lease (one does it for
        all that share a database); None when another holds it."""
        if not self.reconciling:
            return None
        collected = await self.in_thread(
            self.store.collect_garbage, self.settings.retention, self.clock.now()
        )
        if collected != Collected():
            log.info("retention deleted %s", collected)
        return collected

    async def collect_forever(self) -> None:
        """Retention: at start (once the reconciler has looked at its lease), then every
        ``gc_interval_s``."""
        interval = self.settings.gc_interval_s
        if not interval:
            return
        await self.first_pass.wait()
        while True:
            try:
                await self.collect_once()
            except Exception:  # like reconciliation: a database hiccup must not end it
                log.exception("garbage collection failed; retrying")
            await asyncio.sleep(interval)

    async def analyze_forever(self) -> None:
        """PostgreSQL's plans kept fit for its tables' sizes (``store/plans.py``), by the
        coordinator holding the reconciler's lease, once a reconciler's interval. A loop of
        its own: analyzing a large table may take seconds, and the reconciler's pass (lost
        runners, overdue runs) waits for none of them."""
        if self.store.db.dialect != "postgres":
            return
        await self.first_pass.wait()
        while True:
            if self.reconciling:
                try:
                    if analyzed := await self.in_thread(self.store.analyze_grown):
                        log.info("analyzed tables grown since their plans were made: %s", analyzed)
                except Exception:  # the database is away: the next look tries again
                    log.exception("analyzing grown tables failed")
            await asyncio.sleep(self.settings.reconcile_interval_s)

    async def reconcile_forever(self) -> None:
        try:
            while True:
                try:
                    await self.reconcile_once()
                except Exception:  # a database hiccup must not stop reconciliation for good
                    log.exception("reconciliation failed; retrying")
                await asyncio.sleep(self.settings.reconcile_interval_s)
        finally:  # stopping: another coordinator takes the work over at its next pass
            with contextlib.suppress(Exception):
                await self.in_thread(leases.release, self.store.db, RECONCILER, self.node)


def _offerable(bodies: Sequence[CreateRun], principal: Principal | None) -> bool:
    """May these runs be offered to waiting sockets by their labels alone? Not an agent's
    sub-runs, nor resumes or sub-agent sessions: what they require (the session's runner)
    or lock (the parent's rows) is known only once they are built."""
    if principal is not None and principal.run_id is not None:
        return False
    return all(b.type != "resume_session" and b.parent_session is None for b in bodies)


def _operation(fn: Callable[..., object]) -> str:
    """A store call's name in the metrics: ``runs.claim`` for ``store.runs.claim``."""
    name: str = getattr(fn, "__name__", "other")
    module: str = getattr(fn, "__module__", None) or ""
    if module.startswith("corral.store."):
        return f"{module.removeprefix('corral.store.')}.{name}"
    return name
