"""The WebSocket runner link on the coordinator: ``SocketPump``, a thin pump around
``RunnerChannel``.

One pump per connected runner socket. It feeds frames and the time to the pure channel
(``link_core.RunnerChannel``, which wraps the protocol's ``ServerSession``) and carries out
what it asks: register the runner, apply its events (and only then acknowledge them),
persist command acknowledgements, note pings, push work, wake waiters. While the runner
is active the push loop fills its free slots: pending runs are claimed into the runner's
free slots together with their numbered start commands (one transaction), and every
command stored since (a cancel request stores its cancel command) is sent in order — all
stored before they are sent, so a restarted coordinator resends whatever the runner had
not acknowledged. What touches the store is
``LinkCore`` (synchronous, run here in a thread: the writes of all sockets on one, committed
in groups, ``writer.py``); this module only moves frames and waits.
Its deadlines (the Init's, the runner's lost threshold) are kept by the coordinator's one
timer for all sockets (``deadlines.py``), which calls ``tick``.

The read loop never waits on the store after registration: applying events, persisting
command acks, marking a runner draining and actors' KV requests go, in order, to one
worker task (so a KV read sees every write the runner asked for before it). A tunnel
message read while that worker has something to do joins its queue too: an actor's answer
reaches its caller only once what the runner sent before it is stored (its "running"). A
ping read late is a heartbeat written late, and a slow database then makes a working
runner look lost, its runs given to others while it still runs them (found by
``tests/sim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Annotated, Any, Protocol

from fastapi import APIRouter
from starlette import types as asgi
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.coordinator.actors import kv_request
from corral.coordinator.auth import (
    CLOSE_POLICY_VIOLATION,
    GRANTS,
    Access,
    Principal,
    require,
)
from corral.coordinator.connections import Connections
from corral.coordinator.deadlines import RECHECK_S
from corral.coordinator.link_core import (
    Applied,
    ApplyEvents,
    ChannelOutput,
    LinkCore,
    Pushed,
    PushWork,
    RunnerChannel,
    Wake,
)
from corral.coordinator.notifier import (
    RUNS_AVAILABLE,
    Event,
    actor_topic,
    runner_topic,
    wait_any,
)
from corral.coordinator.service import Coordinator
from corral.coordinator.waiters import Waiter, after_claim
from corral.coordinator.writer import answer
from corral.errors import CorralError, Forbidden
from corral.ids import RunId, RunnerId
from corral.protocol import messages as m
from corral.protocol.outputs import (
    Alive,
    Close,
    CommandsAcked,
    KvRequested,
    Register,
    Send,
    Stopping,
    Tunnelled,
)
from corral.protocol.server import SessionState
from corral.store.runners import Head

log = logging.getLogger("corral.coordinator")
REASON_STORE_FAILED = "corral.store_failed"
PATH = "/runner/socket"
# What a send or a close on a socket already gone raises: Starlette's WebSocket says so
# with WebSocketDisconnect, plain ASGI with OSError (uvicorn's ClientDisconnected), and a
# message after the close with RuntimeError.
GONE = (WebSocketDisconnect, OSError, RuntimeError)


class Socket(Protocol):
    """What the pump uses of a WebSocket: ``AsgiSocket``, or Starlette's ``WebSocket``."""

    async def accept(self) -> None: ...

    async def receive(self) -> asgi.Message: ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class AsgiSocket:
    """A runner's WebSocket as plain ASGI messages. Starlette's ``WebSocket`` checks the
    state of every message and sends each through its app's and its route's exception
    handlers, on every frame."""

    def __init__(self, receive: asgi.Receive, send: asgi.Send) -> None:
        self._receive = receive
        self._send = send

    async def accept(self) -> None:
        opened = await self._receive()
        if opened["type"] != "websocket.connect":  # as Starlette's: the client is gone
            raise RuntimeError(f"expected websocket.connect, got {opened['type']!r}")
        await self._send({"type": "websocket.accept"})

    async def receive(self) -> asgi.Message:
        return await self._receive()

    async def send_text(self, data: str) -> None:
        await self._send({"type": "websocket.send", "text": data})

    async def close(self, code: int, reason: str) -> None:
        await self._send({"type": "websocket.close", "code": code, "reason": reason})


class SocketPump:
    """One runner socket: frames in and out, store calls in a thread, waits. A
    ``LiveLink`` for the rest of the coordinator (``Connections``)."""

    def __init__(self, coordinator: Coordinator, ws: Socket, principal: Principal) -> None:
        self.coordinator = coordinator
        self.principal = principal  # the token the socket was opened with
        self.core = LinkCore(coordinator.store, coordinator.settings)
        self.ws = ws
        connections = coordinator.connections
        self.channel = RunnerChannel.open(
            connections.accepted(),
            coordinator.clock.now(),
            coordinator.settings,
            sockets=connections.open,
            tunnel_end=coordinator.tunnels.end,
        )
        self.closed = asyncio.Event()
        # Another round of the push loop is wanted: the channel asked (a slot may be free,
        # commands wait), or a round of the socket waiters woke it with runs.
        self.push_wanted = Event()  # waited on with its runner's topic (``wait_any``)
        self._woken = False
        self._reserved: list[RunId] | None = None  # what that round reserved for it
        # The push loop's next claim, queued by whoever woke it (``_push_soon``), and
        # whether the loop waits for that (nothing of its own in flight).
        self._pushing: asyncio.Future[Pushed] | None = None
        self._parked = False
        self._send_lock = asyncio.Lock()
        self._work: asyncio.Queue[
            ApplyEvents | CommandsAcked | Stopping | KvRequested | Tunnelled
        ] = asyncio.Queue()
        self._unstored = 0  # handed to the store worker and not done yet
        # The store worker's apply in flight, until the channel is told it committed
        # (``_committed_apply``).
        self._applying: asyncio.Future[Applied] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def connections(self) -> Connections:
        return self.coordinator.connections

    @property
    def seq(self) -> int:
        return self.channel.seq

    @property
    def token_id(self) -> str | None:
        return self.principal.token_id

    @property
    def runner_id(self) -> RunnerId | None:
        return self.channel.runner_id

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
            self._start(self._store_work(), "storing"),
        ]
        self.coordinator.deadlines.add(self, self.channel.session.next_deadline())
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
                log.exception(
                    "runner %s: %s failed; closing its socket", self.channel.runner_id, what
                )
                await self.close(m.CLOSE_INTERNAL_ERROR, m.REASON_INTERNAL_ERROR)
            finally:
                self.closed.set()  # whichever loop ends, the socket is done

        return asyncio.create_task(guarded())

    # ---- what the rest of the coordinator asks (``LiveLink``) ------------------------------

    def behind(self, head: Head) -> bool:
        return self.channel.behind(head)

    async def drain(self, grace_s: float) -> None:
        await self._handle(self.channel.drain(grace_s))

    async def stop(self) -> None:
        await self._handle(self.channel.stop())

    async def evict(self) -> None:
        await self._handle(self.channel.evict())

    async def leave(self) -> None:
        await self._handle(self.channel.leave())

    async def close(self, code: int, reason: str) -> None:
        if not self.closed.is_set():
            with contextlib.suppress(*GONE):
                await self.ws.close(code, reason)
            self.closed.set()

    # ---- reading and timing --------------------------------------------------------------

    async def _read(self) -> None:
        clock = self.coordinator.clock
        while not self.closed.is_set():
            try:
                frame = await self.ws.receive()
            except RuntimeError:  # receive() after the socket was closed from our side
                return
            if frame["type"] == "websocket.disconnect":
                self.channel.disconnected(frame.get("code", 1000), frame.get("reason"))
                return
            try:
                text = frame.get("text")
                if text is None:
                    raise m.ProtocolError(m.MALFORMED_FRAME, "frames are JSON text, not binary")
                message = m.decode(text, side="server")
            except m.ProtocolError as exc:
                log.warning("runner socket %s: %s", self.channel.runner_id, exc.reason[:200])
                await self._handle(self.channel.receive_error(exc))
                continue
            await self._handle(self.channel.receive(message, clock.now()))

    def tick(self, now: float) -> float | None:
        """Its deadline may have passed (the coordinator's one timer asks:
        ``coordinator.deadlines``): a session whose time is up closes the socket. When to
        look again: its next deadline, soon while it registers, never once it is closing."""
        outputs = self.channel.tick(now)
        if PushWork() in outputs:  # the wait for announced late reports is over
            outputs.remove(PushWork())
            self._push_soon()
        if outputs:  # a Close: its task ends the socket, as a loop of it would
            self._tasks.append(self._start(self._handle(outputs), "timing"))
        deadline = self.channel.next_deadline()
        if deadline is None and self.channel.session.state is not SessionState.CLOSED:
            return now + RECHECK_S  # registering: the store's time, not the runner's
        return deadline

    # ---- what the channel asks -----------------------------------------------------------

    async def _handle(self, outputs: list[ChannelOutput]) -> None:
        for out in outputs:
            if isinstance(out, Send):
                await self._send(out.message)
            elif isinstance(out, Close):
                await self.close(out.code, out.reason)
            elif isinstance(out, Register):
                await self._register(out.init)  # the runner sends nothing until it is answered
            elif isinstance(out, ApplyEvents | CommandsAcked | KvRequested | Stopping):
                self._unstored += 1
                self._work.put_nowait(out)
            elif isinstance(out, PushWork):
                self._push_soon()
            elif isinstance(out, Wake):
                self.coordinator.notifier.notify(*out.topics)
            elif isinstance(out, Alive) and self.channel.runner_id is not None:
                self.connections.note_ping(self.channel.runner_id)
            elif isinstance(out, Tunnelled):
                if self._unstored:
                    # What the runner sent before it is applied first: an actor's answer
                    # never reaches its caller before its "running" is stored.
                    self._unstored += 1
                    self._work.put_nowait(out)
                else:
                    await self.coordinator.tunnels.receive(self, out.message)

    async def send_message(self, message: m.ToClientMessage) -> None:
        """Send one message outside the channel's outputs (the tunnel's: coordinator/tunnel.py)."""
        await self._send(message)

    async def protocol_error(self, error: m.ProtocolError) -> None:
        await self._handle(self.channel.receive_error(error))

    async def _store_work(self) -> None:
        """What the read loop handed over, in order, one store call at a time. If one
        fails (the database is away), the socket is closed: the runner reconnects and
        sends again what was not acknowledged."""
        try:
            while True:
                out = await self._work.get()
                try:
                    await self._store(out)
                finally:
                    self._unstored -= 1
        except Exception:
            log.exception("runner %s: storing what it sent failed", self.channel.runner_id)
            await self.close(m.CLOSE_GOING_AWAY, REASON_STORE_FAILED)

    async def _store(
        self, out: ApplyEvents | CommandsAcked | Stopping | KvRequested | Tunnelled
    ) -> None:
        coordinator, channel, core = self.coordinator, self.channel, self.core
        runner_id = channel.runner_id
        assert runner_id is not None  # nothing is handed over before registering
        now = coordinator.clock.now()
        if isinstance(out, ApplyEvents):
            self._applying = coordinator.submit_write(
                runner_id, core.apply, runner_id, out.last_idx, out.events, now
            )
            await answer(self._applying)
            await self._handle(self._committed_apply(hold=False))
        elif isinstance(out, CommandsAcked):
            await coordinator.in_writer(
                runner_id, core.acknowledge, runner_id, out.last_command_idx
            )
        elif isinstance(out, KvRequested):
            result = await coordinator.in_writer(
                runner_id,
                kv_request,
                coordinator.store,
                runner_id,
                out.actor_id,
                out.op,
                now,
                generation=out.generation,
            )
            await self._handle(channel.kv_answered(out.request_id, result))
        elif isinstance(out, Tunnelled):  # read after events not yet applied then
            await coordinator.tunnels.receive(self, out.message)
        else:
            await coordinator.in_writer(runner_id, core.draining, runner_id, now)

    def _committed_apply(self, *, hold: bool) -> list[ChannelOutput]:
        """The channel told that the store worker's apply committed, once it has and only
        once: by the worker, or first by the push loop answered in the same group (``hold``:
        its acknowledgement then goes with the commands it sends next, in the same step)."""
        applying = self._applying
        if applying is None or not applying.done() or applying.cancelled():
            return []
        if applying.exception() is not None:
            return []  # the worker raises it, and closes the socket
        self._applying = None
        return self.channel.applied(applying.result(), hold=hold)

    async def _send(self, message: Any) -> None:
        async with self._send_lock:
            with contextlib.suppress(*GONE):
                await self.ws.send_text(m.encode(message))

    async def _register(self, init: m.ToServerInit) -> None:
        coordinator = self.coordinator
        try:
            self.principal.check_labels(init.labels)
            registration = await coordinator.in_thread(
                self.core.register, init, coordinator.clock.now(), self.principal.token_id
            )
        except Forbidden as exc:  # another token's runner id, or labels it may not have
            log.warning("runner socket refused: %s", exc.message)
            await self.close(m.CLOSE_POLICY_VIOLATION, f"corral.{exc.code}")
            return
        self.channel.runner_id = registration.runner_id
        evicted = self.connections.take_over(registration.runner_id, self)
        if evicted is self:
            await self.evict()  # a newer socket of the runner registered meanwhile
            return
        if evicted is not None:
            await evicted.evict()  # the newer socket wins
        await self._handle(self.channel.registered(registration, coordinator.clock.now()))
        coordinator.notifier.notify(*registration.woken)
        if tunnel := init.metadata.get("tunnel"):  # it takes the gateway's requests for actors
            version = tunnel if type(tunnel) is int else 1
            # A runner too old to say where its tunnel was is taken to have been here.
            end = coordinator.tunnels.end
            elsewhere = init.metadata.get(m.TUNNEL_WITH, end) != end
            await coordinator.tunnels.resume(
                registration.runner_id, self, version=version, elsewhere=elsewhere
            )
        self._tasks.append(self._start(self._push_work(), "pushing work"))
        log.info(
            "runner %s connected (%s, %d slots, websocket)",
            registration.runner_id,
            init.name,
            init.total_slots,
        )

    async def _forget(self) -> None:
        channel, coordinator = self.channel, self.coordinator
        if not self.connections.forget(channel.runner_id, self):
            return
        assert channel.runner_id is not None
        if await coordinator.in_thread(
            self.core.gone, channel.runner_id, channel.stopped_for_good, coordinator.clock.now()
        ):
            coordinator.notifier.notify(RUNS_AVAILABLE)

    # ---- pushing work --------------------------------------------------------------------

    async def _push_work(self) -> None:
        """Fill free slots with pending runs and send the commands stored for the runner
        (cancels among them), as they come.

        Stored commands and orders wake it at once (its runner's topic), and so does a
        final report (a slot is free). New runs wake it only through the socket waiters
        (``coordinator.waiters``): while its runner has a free slot it waits there, and a
        round wakes it with the runs reserved for it."""
        channel, coordinator = self.channel, self.coordinator
        notifier = coordinator.notifier
        runner_id = channel.runner_id
        init = channel.session.init
        assert runner_id is not None and init is not None
        declined: frozenset[RunId] = frozenset()
        try:
            while not self.closed.is_set():
                runs_event = notifier.event(RUNS_AVAILABLE)
                orders = notifier.event(runner_topic(runner_id))
                self.push_wanted.clear()
                reserved, self._reserved = self._reserved, None
                pushing, self._pushing = self._pushing, None
                if pushing is None:
                    pushing = self._submit_push()
                try:
                    pushed = await answer(pushing)
                except asyncio.CancelledError:
                    self._stored_behind(pushing)
                    raise
                except CorralError as exc:  # lost or stopped meanwhile
                    log.warning("runner %s: %s", runner_id, exc)
                    await self._follow_orders(runner_id)  # stopped: it is told so
                    # Lost: it must reconnect (as a new runner).
                    await self.close(m.CLOSE_GOING_AWAY, m.REASON_RUNNER_LOST)
                    return
                self._woken = False  # what was reserved for it, it tried to claim
                if pushed.commands:
                    coordinator.metrics.started_on_socket(c.body for c in pushed.commands)
                # The reports that freed these slots were mostly committed with this claim
                # (one group): acknowledged in the frame of its commands, one frame not two.
                held = self._committed_apply(hold=bool(pushed.commands))
                await self._handle([*held, *channel.pushed(pushed), *channel.release_ack()])
                self._starts_sent(pushed.commands)
                declined, missed = after_claim(reserved, pushed.claimed, declined)
                if missed:  # taken by others, or not for it: another round hands them out
                    notifier.notify(RUNS_AVAILABLE)
                waiter = None
                if channel.wants_runs:
                    if runs_event.is_set():
                        continue  # runs came while it claimed: the round may have missed it
                    waiter = Waiter(
                        init.name,
                        frozenset(init.labels),
                        channel.free_slots,
                        self._wake,
                        declined,
                    )
                    coordinator.waiters.add(waiter)
                try:
                    # Not on ``closed``: a socket that closes cancels its loops. Each event
                    # waited on is a task while it waits, at every idle socket.
                    self._parked = True
                    await wait_any([orders, self.push_wanted], None)
                finally:
                    self._parked = False
                    if waiter is not None:
                        coordinator.waiters.discard(waiter)
                if orders.is_set() and not self.closed.is_set():
                    # The runner's row changed: a drain or a stop asked through another
                    # coordinator (its NOTIFY woke us) is passed on before anything is pushed.
                    await self._follow_orders(runner_id)
        finally:
            if self._woken:  # woken for runs it will not claim now: others may take them
                notifier.notify(RUNS_AVAILABLE)
            if self._pushing is not None:  # its claim runs all the same: nobody reads it
                self._pushing.add_done_callback(self._stored_behind)

    def _starts_sent(self, commands: list[m.Indexed]) -> None:
        """Actors this socket told to start: the gateway may send their requests now
        (``TunnelHub.starting``), and waits for nothing else."""
        topics = []
        for command in commands:
            if command.body.get("type") == "start_actor":
                actor_id = str(command.body["actor_id"])
                self.coordinator.tunnels.start_sent(self, actor_id, int(command.body["generation"]))
                topics.append(actor_topic(actor_id))
        self.coordinator.notifier.notify(*topics)

    def _submit_push(self) -> asyncio.Future[Pushed]:
        runner_id = self.channel.runner_id
        assert runner_id is not None
        coordinator = self.coordinator
        return coordinator.submit_write(
            runner_id,
            self.core.push_work,
            runner_id,
            coordinator.clock.now(),
            self.channel.push_request(),
        )

    def _stored_behind(self, push: asyncio.Future[Pushed]) -> None:
        """A push of this socket ran, and nobody will send what it stored (the socket
        closes): the runner's newest socket, woken by its topic, sends it (the command it
        claimed a run with, above all; else the run waits, claimed, for a round that never
        comes)."""
        ran = push.done() and not push.cancelled() and push.exception() is None
        if ran and push.result().commands and self.runner_id is not None:
            self.coordinator.notifier.notify(runner_topic(self.runner_id))

    def _wake(self, reserved: list[RunId] | None) -> None:
        """A round of the socket waiters reserved these runs for it (None: claim without a
        reservation), or a client creates runs it fits."""
        self._woken, self._reserved = True, reserved
        self._push_soon()

    def _push_soon(self) -> None:
        """Another round of the push loop. If the loop waits, its claim is queued at once,
        in the turn of the event loop that asks: a client's create queued in that turn
        commits with it (``Coordinator.create_runs``), and a final report's freed slot is
        claimed for in the turn the report is read, before the report's own commit, so the
        socket is back among the waiters by the time anyone hears the run ended."""
        if self._parked and self._pushing is None and self.coordinator.writer.open:
            self._pushing = self._submit_push()
        self.push_wanted.set()

    async def _follow_orders(self, runner_id: RunnerId) -> None:
        order = await self.coordinator.in_thread(
            self.core.order, runner_id, self.coordinator.clock.now()
        )
        await self._handle(self.channel.ordered(order))


def route(scope: asgi.Scope) -> bool:
    """Is this the runner link's WebSocket (served by ``serve``)?"""
    if scope["type"] != "websocket":
        return False
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path == root + PATH


async def serve(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    """The runner link as plain ASGI: the coordinator's app hands its upgrades over before
    FastAPI's routing (``app.CoordinatorApp``), behind the same ``Guard``, so that a socket
    costs no dependency solving when it opens and no Starlette wrappers on each frame. It
    checks what the route below declares (runner access); the route stays for the apps
    without that shortcut, and for the tests that walk every route."""
    principal: Principal = scope["state"]["principal"]
    if principal.role not in GRANTS[Access.RUNNER]:
        # Closed before it is accepted: the client sees HTTP 403, as from the route.
        await send(
            {"type": "websocket.close", "code": CLOSE_POLICY_VIOLATION, "reason": "forbidden"}
        )
        return
    coordinator = scope["app"].state.coordinator
    await SocketPump(coordinator, AsgiSocket(receive, send), principal).run()


router = APIRouter(tags=["runner protocol"])


@router.websocket(PATH)
async def runner_socket(
    ws: WebSocket, principal: Annotated[Principal, require(Access.RUNNER)]
) -> None:
    """The WebSocket runner link (JSON frames of ``corral.protocol.messages``)."""
    await SocketPump(ws.app.state.coordinator, ws, principal).run()
