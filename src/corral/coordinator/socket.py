"""The WebSocket runner link on the coordinator: a thin pump around ``ServerSession``.

One ``SocketLink`` per connected runner socket. It feeds frames and the time to the pure
session and carries out what the session asks: register the runner, apply its events
(and only then acknowledge them), persist command acknowledgements, note pings. While
the runner is active it pushes work: pending runs are claimed into the runner's free
slots together with their numbered start commands (one transaction), cancellations
become numbered cancel commands — all stored before they are sent, so a restarted
coordinator resends whatever the runner had not acknowledged. What touches the store is
``LinkCore`` (synchronous, run here in a thread); this module only moves frames and waits.

The read loop never waits on the store after registration: applying events, persisting
command acks, marking a runner draining and actors' KV requests go, in order, to one
worker task (so a KV read sees every write the runner asked for before it). A ping read
late is a heartbeat written late, and a slow database then makes a working runner look
lost, its runs given to others while it still runs them (found by ``tests/sim``).

After registration only the push loop sends commands, and it sends the store's queue
from a cursor (``_sent_idx``) rather than what it just added: a command stored by the
read loop (``abandon_run``) or by an older socket of the same runner (still open because
the coordinator has not yet noticed it broke) is never lost or sent after a higher index,
which the runner would drop as a duplicate (found by ``tests/sim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Annotated, Any

from fastapi import APIRouter
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.coordinator.actors import kv_request
from corral.coordinator.auth import Access, Principal, require
from corral.coordinator.connections import Connections
from corral.coordinator.link_core import LinkCore, finishes
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic, wait_any
from corral.coordinator.service import Coordinator
from corral.errors import CorralError, Forbidden
from corral.ids import RunId, RunnerId
from corral.protocol import messages as m
from corral.protocol.outputs import (
    Alive,
    Apply,
    Close,
    CommandsAcked,
    KvRequested,
    Register,
    Send,
    ServerOutput,
    Stopping,
    Tunnelled,
)
from corral.protocol.server import ServerSession
from corral.runners import RunnerState

log = logging.getLogger("corral.coordinator")
_accepted = itertools.count(1)  # sockets in the order they opened: the newer one wins
REASON_STORE_FAILED = "corral.store_failed"


class SocketLink:
    def __init__(self, coordinator: Coordinator, ws: WebSocket, principal: Principal) -> None:
        self.coordinator = coordinator
        self.principal = principal  # the token the socket was opened with
        self.core = LinkCore(coordinator.store, coordinator.settings)
        self.ws = ws
        settings = coordinator.settings
        self.session = ServerSession(
            time.time(),
            lost_threshold_s=settings.ws_lost_after_s,
            ping_interval_s=settings.ws_ping_interval_s,
            ack_interval_s=settings.ws_ack_interval_s,
        )
        self.seq = next(_accepted)
        self.runner_id: RunnerId | None = None
        self.closed = asyncio.Event()
        self.slots_changed = asyncio.Event()
        self.draining = False
        self.left = False  # the runner closed as one that shuts down (its work has stopped)
        self._send_lock = asyncio.Lock()
        self._cancels_sent: set[RunId] = set()
        self._sent_idx = 0  # commands sent on this socket, up to here
        self._finishing: Counter[tuple[str, int]] = Counter()  # read, not yet applied
        self._work: asyncio.Queue[Apply | CommandsAcked | Stopping | KvRequested] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def connections(self) -> Connections:
        return self.coordinator.connections

    async def run(self) -> None:
        self.connections.open += 1
        try:
            await self._serve()
        finally:
            self.connections.open -= 1

    async def _serve(self) -> None:
        await self.ws.accept()
        self._tasks = [
            self._start(self._read(), "reading"),
            self._start(self._tick(), "timing"),
            self._start(self._store_work(), "storing"),
        ]
        try:
            await self.closed.wait()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._forget()

    def _start(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """One of the socket's loops. If it fails, the socket is closed (1011): ``run`` then
        ends its other loops and frees what it held — a socket never outlives its loops."""

        async def guarded() -> None:
            try:
                await work
            except Exception:
                log.exception("runner %s: %s failed; closing its socket", self.runner_id, what)
                await self._close(m.CLOSE_INTERNAL_ERROR, m.REASON_INTERNAL_ERROR)
            finally:
                self.closed.set()  # whichever loop ends, the socket is done

        return asyncio.create_task(guarded())

    # ---- reading and timing --------------------------------------------------------------

    async def _read(self) -> None:
        while not self.closed.is_set():
            try:
                frame = await self.ws.receive()
            except RuntimeError:  # receive() after the socket was closed from our side
                return
            if frame["type"] == "websocket.disconnect":
                code, reason = frame.get("code", 1000), frame.get("reason")
                self.left = code == m.CLOSE_NORMAL and reason == m.REASON_RUNNER_SHUTDOWN
                return
            try:
                text = frame.get("text")
                if text is None:
                    raise m.ProtocolError(m.MALFORMED_FRAME, "frames are JSON text, not binary")
                message = m.decode(text, side="server")
            except m.ProtocolError as exc:
                log.warning("runner socket %s: %s", self.runner_id, exc.reason[:200])
                await self._handle(self.session.receive_error(exc))
                continue
            await self._handle(self.session.receive(message, time.time()))

    async def _tick(self) -> None:
        while not self.closed.is_set():
            deadline = self.session.next_deadline()
            delay = 1.0 if deadline is None else max(0.0, deadline - time.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closed.wait(), min(delay, 1.0))
            if not self.closed.is_set():
                await self._handle(self.session.tick(time.time()))

    # ---- what the session asks -----------------------------------------------------------

    async def _handle(self, outputs: list[ServerOutput]) -> None:
        for out in outputs:
            if isinstance(out, Send):
                await self._send(out.message)
            elif isinstance(out, Close):
                await self._close(out.code, out.reason)
            elif isinstance(out, Register):
                await self._register(out.init)  # the runner sends nothing until it is answered
            elif isinstance(out, Apply):
                if ended := finishes(out.events):
                    # Those slots are free on the runner: fill them while the reports are
                    # being committed, not after.
                    self._finishing.update(ended)
                    self.slots_changed.set()
                self._work.put_nowait(out)
            elif isinstance(out, CommandsAcked | KvRequested):
                self._work.put_nowait(out)
            elif isinstance(out, Alive):
                if self.runner_id is not None:
                    self.connections.pinged.add(self.runner_id)
            elif isinstance(out, Stopping):
                self.draining = True  # no more claims from now on; the store learns in turn
                self.slots_changed.set()
                self._work.put_nowait(out)
            elif isinstance(out, Tunnelled):
                await self.coordinator.tunnels.receive(self, out.message)

    async def send_message(self, message: m.ToClientMessage) -> None:
        """Send one message outside the session's outputs (the tunnel's: coordinator/tunnel.py)."""
        await self._send(message)

    async def protocol_error(self, error: m.ProtocolError) -> None:
        await self._handle(self.session.receive_error(error))

    async def _store_work(self) -> None:
        """What the read loop handed over, in order, one store call at a time. If one
        fails (the database is away), the socket is closed: the runner reconnects and
        sends again what was not acknowledged."""
        try:
            while True:
                out = await self._work.get()
                assert self.runner_id is not None  # nothing is handed over before registering
                if isinstance(out, Apply):
                    try:
                        await self._apply(out.events)
                    except m.ProtocolError as exc:  # never acknowledged: nothing was stored
                        log.warning("runner %s: refused: %s", self.runner_id, exc.reason)
                        await self._handle(self.session.receive_error(exc))
                        return
                elif isinstance(out, CommandsAcked):
                    await self.coordinator._db(
                        self.core.acknowledge, self.runner_id, out.last_command_idx
                    )
                elif isinstance(out, KvRequested):
                    result = await self.coordinator._db(
                        kv_request,
                        self.coordinator.store,
                        self.runner_id,
                        out.actor_id,
                        out.op,
                        self.coordinator.clock.now(),
                    )
                    await self._handle(self.session.kv_answered(out.request_id, result))
                else:
                    await self.coordinator._db(
                        self.core.draining, self.runner_id, self.coordinator.clock.now()
                    )
        except Exception:
            log.exception("runner %s: storing what it sent failed", self.runner_id)
            await self._close(m.CLOSE_GOING_AWAY, REASON_STORE_FAILED)

    async def _send(self, message: Any) -> None:
        async with self._send_lock:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self.ws.send_text(m.encode(message))

    async def _close(self, code: int, reason: str) -> None:
        if not self.closed.is_set():
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self.ws.close(code, reason)
            self.closed.set()

    async def _register(self, init: m.ToServerInit) -> None:
        coordinator = self.coordinator
        try:
            self.principal.check_labels(init.labels)
            registration = await coordinator._db(
                self.core.register, init, coordinator.clock.now(), self.principal.token_id
            )
        except Forbidden as exc:  # another token's runner id, or labels it may not have
            log.warning("runner socket refused: %s", exc.message)
            await self._close(m.CLOSE_POLICY_VIOLATION, f"corral.{exc.code}")
            return
        runner_id = self.runner_id = registration.runner_id
        previous = self.connections.by_runner.get(runner_id)
        if previous is not None and previous is not self and previous.seq > self.seq:
            # A newer socket of the runner registered while this one waited on the store:
            # this one is stale (the runner has left it) and must not evict the newer.
            await self._handle(self.session.evict())
            return
        self.connections.by_runner[runner_id] = self
        if previous is not None and previous is not self:
            await previous._handle(previous.session.evict())  # the newer socket wins
        same = init.runner_id == runner_id
        missed = registration.missed
        self._sent_idx = max([c.idx for c in missed], default=init.last_command_idx if same else 0)
        await self._handle(
            self.session.registered(
                runner_id, registration.last_event_idx, registration.missed, time.time()
            )
        )
        if init.metadata.get("tunnel"):  # it takes the gateway's requests for its actors
            await coordinator.tunnels.resume(runner_id, self)
        coordinator.notifier.notify(RUNS_AVAILABLE)
        self._tasks.append(self._start(self._push_work(), "pushing work"))
        log.info(
            "runner %s connected (%s, %d slots, websocket)", runner_id, init.name, init.total_slots
        )

    async def _apply(self, events: tuple[m.Indexed, ...]) -> None:
        assert self.runner_id is not None
        coordinator = self.coordinator
        try:
            applied = await coordinator._db(
                self.core.apply, self.runner_id, events, coordinator.clock.now()
            )
        finally:
            self._finishing.subtract(finishes(events))
            self._finishing = +self._finishing  # drop the zeros
        coordinator.notifier.notify(*applied.wake)
        if applied.finished or applied.abandon:
            # A slot may be free; abandon_run commands (runs no longer the runner's) were
            # stored: the push loop sends them, in order after what it has sent.
            self.slots_changed.set()
            if applied.abandon:
                self._announce(self.runner_id)
        await self._handle(self.session.applied(applied.last_idx))

    def _announce(self, runner_id: RunnerId) -> None:
        """New commands are stored: if this socket is not the runner's newest, wake the
        newest, which sends them."""
        if self.connections.by_runner.get(runner_id) is not self:
            self.coordinator.notifier.notify(runner_topic(runner_id))

    async def _forget(self) -> None:
        if self.runner_id is None or self.connections.by_runner.get(self.runner_id) is not self:
            return
        del self.connections.by_runner[self.runner_id]
        coordinator = self.coordinator
        # It said it was stopping, and then it left: stopped. Not if the socket just broke.
        if await coordinator._db(
            self.core.gone, self.runner_id, self.draining and self.left, coordinator.clock.now()
        ):
            coordinator.notifier.notify(RUNS_AVAILABLE)

    # ---- pushing work --------------------------------------------------------------------

    async def _push_work(self) -> None:
        """Fill free slots with pending runs and pass cancellations on, as they come."""
        assert self.runner_id is not None
        runner_id, coordinator = self.runner_id, self.coordinator
        while not self.closed.is_set():
            runs_event = coordinator.notifier.event(RUNS_AVAILABLE)
            orders = coordinator.notifier.event(runner_topic(runner_id))
            self.slots_changed.clear()
            try:
                commands = await coordinator._db(
                    self.core.push_work,
                    runner_id,
                    coordinator.clock.now(),
                    self._cancels_sent,
                    claim=not self.draining,
                    after=self._sent_idx,
                    finishing=frozenset(self._finishing),
                )
            except CorralError as exc:  # lost or stopped meanwhile: it must reconnect
                log.warning("runner %s: %s", runner_id, exc)
                await self._close(m.CLOSE_GOING_AWAY, m.REASON_RUNNER_LOST)
                return
            if commands:
                coordinator.metrics.started_on_socket(c.body for c in commands)
                await self._handle(self.session.push(commands))
                self._sent_idx = max(self._sent_idx, commands[-1].idx)  # once sent, not before
                self._announce(runner_id)
            await wait_any(
                [runs_event, orders, self.slots_changed, self.closed],
                coordinator.settings.poll_timeout_s,
            )


router = APIRouter(tags=["runner protocol"])


@router.websocket("/runner/socket")
async def runner_socket(
    ws: WebSocket, principal: Annotated[Principal, require(Access.RUNNER)]
) -> None:
    """The WebSocket runner link (JSON frames of ``corral.protocol.messages``)."""
    await SocketLink(ws.app.state.coordinator, ws, principal).run()


async def close_token(coordinator: Coordinator, token_id: str) -> None:
    """A token was revoked: the sockets opened with it are closed (they cannot reconnect)."""
    for link in list(coordinator.connections.by_runner.values()):
        if link.principal.token_id == token_id:
            await link._close(m.CLOSE_POLICY_VIOLATION, "corral.token_revoked")


async def drain(coordinator: Coordinator, runner_id: str, grace_s: float) -> None:
    """Forced drain: no new work; the runner finishes (up to ``grace_s``) and leaves."""
    await coordinator._db(
        coordinator.store.set_runner_state,
        runner_id,
        RunnerState.DRAINING,
        coordinator.clock.now(),
    )
    link = coordinator.connections.by_runner.get(runner_id)
    if link is not None:
        link.draining = True
        await link._handle(link.session.drain(grace_s))


async def stop(coordinator: Coordinator, runner_id: str) -> None:
    """Stop a runner now: what it holds goes back to pending; its socket is closed."""
    await coordinator._db(
        coordinator.store.set_runner_state,
        runner_id,
        RunnerState.STOPPED,
        coordinator.clock.now(),
    )
    coordinator.notifier.notify(RUNS_AVAILABLE)
    link = coordinator.connections.by_runner.get(runner_id)
    if link is not None:
        await link._handle(link.session.stop())
