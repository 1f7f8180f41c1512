"""The WebSocket runner link on the coordinator: a thin pump around ``ServerSession``.

One ``SocketLink`` per connected runner socket. It feeds frames and the time to the pure
session and carries out what the session asks: register the runner, apply its events
(and only then acknowledge them), persist command acknowledgements, note pings. While
the runner is active it pushes work: pending runs are claimed into the runner's free
slots together with their numbered start commands (one transaction), cancellations
become numbered cancel commands — all stored before they are sent, so a restarted
coordinator resends whatever the runner had not acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import APIRouter
from pydantic import TypeAdapter, ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.coordinator.connections import Connections
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic, wait_any
from corral.coordinator.schemas import RunnerEvent, run_assignment_json
from corral.coordinator.service import Coordinator
from corral.errors import CorralError
from corral.ids import RunId
from corral.protocol import messages as m
from corral.protocol.outputs import (
    Alive,
    Apply,
    Close,
    CommandsAcked,
    Register,
    Send,
    ServerOutput,
    Stopping,
)
from corral.protocol.server import ServerSession
from corral.runners import RunnerState
from corral.runs import Run
from corral.store.link import Command

log = logging.getLogger("corral.coordinator")


class SocketLink:
    def __init__(self, coordinator: Coordinator, ws: WebSocket) -> None:
        self.coordinator = coordinator
        self.ws = ws
        settings = coordinator.settings
        self.session = ServerSession(
            time.time(),
            lost_threshold_s=settings.ws_lost_after_s,
            ping_interval_s=settings.ws_ping_interval_s,
            ack_interval_s=settings.ws_ack_interval_s,
        )
        self.runner_id: str | None = None
        self.closed = asyncio.Event()
        self.slots_changed = asyncio.Event()
        self.draining = False
        self._send_lock = asyncio.Lock()
        self._cancels_sent: set[RunId] = set()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def connections(self) -> Connections:
        return self.coordinator.connections

    async def run(self) -> None:
        await self.ws.accept()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._tick())]
        try:
            await self.closed.wait()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._forget()

    # ---- reading and timing --------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while not self.closed.is_set():
                text = await self.ws.receive_text()
                try:
                    message = m.decode(text, side="server")
                except m.ProtocolError as exc:
                    await self._handle(self.session.receive_error(exc))
                    continue
                await self._handle(self.session.receive(message, time.time()))
        except (WebSocketDisconnect, RuntimeError, KeyError):
            self.closed.set()

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
                await self._register(out.init)
            elif isinstance(out, Apply):
                await self._apply(out.events)
            elif isinstance(out, CommandsAcked):
                assert self.runner_id is not None
                await self.coordinator._db(
                    self.coordinator.store.link.acknowledge, self.runner_id, out.last_command_idx
                )
            elif isinstance(out, Alive):
                if self.runner_id is not None:
                    self.connections.pinged.add(self.runner_id)
            elif isinstance(out, Stopping):
                await self._mark_draining()

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
        coordinator, store = self.coordinator, self.coordinator.store
        runner, _ = await coordinator._db(
            store.register_runner,
            name=init.name,
            hostname=str(init.metadata.get("hostname", "")),
            labels=list(init.labels),
            slots=init.total_slots,
            version=init.version,
            transport="websocket",
            now=coordinator.clock.now(),
            runner_id=init.runner_id,
            held=None,
            lost_after_s=coordinator.settings.ws_lost_after_s,
        )
        self.runner_id = runner.id
        same = init.runner_id == runner.id
        state = await coordinator._db(store.link.state, runner.id)
        missed = await coordinator._db(
            store.link.unacknowledged,
            runner.id,
            max(init.last_command_idx, state.acked_command_idx) if same else 0,
        )
        previous = self.connections.by_runner.get(runner.id)
        self.connections.by_runner[runner.id] = self
        if previous is not None and previous is not self:
            await previous._handle(previous.session.evict())  # the newer socket wins
        await self._handle(
            self.session.registered(
                runner.id,
                state.last_event_idx if same else 0,
                [m.Indexed(c.idx, c.body) for c in missed],
                time.time(),
            )
        )
        coordinator.notifier.notify(RUNS_AVAILABLE)
        self._tasks.append(asyncio.create_task(self._push_work()))
        log.info(
            "runner %s connected (%s, %d slots, websocket)", runner.id, init.name, init.total_slots
        )

    async def _apply(self, events: tuple[m.Indexed, ...]) -> None:
        assert self.runner_id is not None
        runner_id = self.runner_id
        parsed = _parse_events(events)
        outcomes = await self.coordinator.apply_events(runner_id, parsed) if parsed else []
        last = events[-1].idx
        await self.coordinator._db(self.coordinator.store.link.events_applied, runner_id, last)
        refused = [
            e.run_id
            for e, error in zip(parsed, outcomes, strict=True)
            if error is not None and error.code == "lease_lost"
        ]
        if refused:  # the run is not ours any more on the coordinator's side: stop it there
            await self._push([{"type": "abandon_run", "run_id": r} for r in dict.fromkeys(refused)])
        if any(e.type == "finished" for e in parsed):
            self.slots_changed.set()
        await self._handle(self.session.applied(last))

    async def _mark_draining(self) -> None:
        self.draining = True
        self.slots_changed.set()
        if self.runner_id is not None:
            await self.coordinator._db(
                self.coordinator.store.set_runner_state,
                self.runner_id,
                RunnerState.DRAINING,
                self.coordinator.clock.now(),
            )

    async def _forget(self) -> None:
        if self.runner_id is None or self.connections.by_runner.get(self.runner_id) is not self:
            return
        del self.connections.by_runner[self.runner_id]
        if self.draining:  # it said it was stopping, and now it has gone: stopped
            with contextlib.suppress(CorralError):
                await self.coordinator._db(
                    self.coordinator.store.set_runner_state,
                    self.runner_id,
                    RunnerState.STOPPED,
                    self.coordinator.clock.now(),
                )
            self.coordinator.notifier.notify(RUNS_AVAILABLE)

    # ---- pushing work --------------------------------------------------------------------

    async def _push(self, bodies: list[dict[str, Any]]) -> None:
        assert self.runner_id is not None
        commands = await self.coordinator._db(
            self.coordinator.store.link.push, self.runner_id, bodies, self.coordinator.clock.now()
        )
        await self._handle(self.session.push(_indexed(commands)))

    async def _push_work(self) -> None:
        """Fill free slots with pending runs and pass cancellations on, as they come."""
        assert self.runner_id is not None
        runner_id, coordinator = self.runner_id, self.coordinator
        while not self.closed.is_set():
            runs_event = coordinator.notifier.event(RUNS_AVAILABLE)
            orders = coordinator.notifier.event(runner_topic(runner_id))
            self.slots_changed.clear()
            if not self.draining:
                try:
                    commands = await coordinator._db(
                        coordinator.store.link.claim_into_commands,
                        runner_id,
                        coordinator.clock.now(),
                        _start_body,
                    )
                except CorralError as exc:  # lost or stopped meanwhile: it must reconnect
                    log.warning("runner %s: %s", runner_id, exc)
                    await self._close(m.CLOSE_GOING_AWAY, m.REASON_RUNNER_LOST)
                    return
                if commands:
                    await self._handle(self.session.push(_indexed(commands)))
            cancels = await coordinator._db(coordinator.store.cancel_requests, runner_id)
            new = [r for r in cancels if r not in self._cancels_sent]
            if new:
                self._cancels_sent.update(new)
                await self._push([{"type": "cancel_run", "run_id": r} for r in new])
            await wait_any(
                [runs_event, orders, self.slots_changed, self.closed],
                coordinator.settings.poll_timeout_s,
            )


def _start_body(run: Run) -> dict[str, Any]:
    return {"type": "start_run", "run": run_assignment_json(run)}


def _indexed(commands: list[Command]) -> list[m.Indexed]:
    return [m.Indexed(c.idx, c.body) for c in commands]


_EVENTS: TypeAdapter[RunnerEvent] = TypeAdapter(RunnerEvent)


def _parse_events(events: tuple[m.Indexed, ...]) -> list[RunnerEvent]:
    """Event bodies as the runner protocol defines them; a malformed one is dropped (and
    acknowledged with the rest: sending it again would not make it valid)."""
    parsed = []
    for event in events:
        try:
            parsed.append(_EVENTS.validate_python(event.body))
        except ValidationError as exc:
            log.warning("dropping malformed event %d: %s", event.idx, exc)
    return parsed


router = APIRouter(tags=["runner protocol"])


@router.websocket("/runner/socket")
async def runner_socket(ws: WebSocket) -> None:
    """The WebSocket runner link (JSON frames of ``corral.protocol.messages``)."""
    await SocketLink(ws.app.state.coordinator, ws).run()


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
