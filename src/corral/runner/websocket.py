"""The WebSocket transport: one socket to the coordinator, a pump around RunnerConnection.

The pure ``RunnerConnection`` decides everything (numbering, replay after reconnect,
duplicate drops, pings, acks, backoff, the runner-lost timer); this pump only moves
frames, reads the clock and carries out its outputs: start/cancel/abandon a run, stop
all work when the lost timer fires, drain when asked. Reports go out as numbered events;
a report's future ends when the coordinator acknowledges it (after committing it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import time
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

# Imported by name: ``websockets.ConnectionClosed`` is a lazy import, resolved again on
# each use (about 4 µs, once a frame sent).
from websockets.exceptions import ConnectionClosed

from corral import __version__, errors
from corral.credentials import auth_headers
from corral.errors import CorralError, InvalidRequest, LeaseLost
from corral.ids import RunId, RunnerId
from corral.protocol import messages as wire
from corral.protocol.outputs import (
    Closed,
    Connected,
    DrainRequested,
    Execute,
    KvAnswered,
    Reconnect,
    RunnerOutput,
    Send,
    StopAllWork,
    TunnelAcked,
    TunnelDropped,
    TunnelReceived,
)
from corral.protocol.runner import ConnectionState, RunnerConnection, TunnelReply
from corral.runner.coordinators import Coordinator, Coordinators, Resolve, resolve_host
from corral.runner.settings import RunnerSettings
from corral.runner.transport import Host
from corral.runner.tunnel import RunnerTunnel

log = logging.getLogger("corral.runner")
MAX_FRAME = 64 * 1024 * 1024


def socket_url(coordinator_url: str) -> str:
    base = coordinator_url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base.removeprefix("https://") + "/runner/socket"
    return "ws://" + base.removeprefix("http://") + "/runner/socket"


class WebSocketTransport:
    kind = "websocket"

    def __init__(
        self,
        host: Host,
        settings: RunnerSettings,
        *,
        rng: random.Random | None = None,
        resolve: Resolve = resolve_host,
    ) -> None:
        self.host = host
        self.settings = settings
        rng = rng or random.Random()
        # Coordinators it may reach, tried in turn: once a socket ends or fails, the next.
        self.coordinators = Coordinators(settings.coordinator_urls, resolve=resolve, rng=rng)
        self.coordinator: Coordinator | None = None  # the one it connects (or is connected) to
        self.conn = RunnerConnection(
            name=settings.name,
            version=__version__,
            total_slots=settings.slots,
            labels=settings.labels,
            # tunnel: the gateway may send requests for our actors through this link.
            metadata={"hostname": socket.gethostname(), "tunnel": wire.TUNNEL_STARTING},
            rng=rng,
            max_backoff_s=settings.max_backoff_s,
            # Our processes must be gone (SIGTERM, grace, SIGKILL) before the lease ends.
            stop_margin_s=settings.kill_grace_s + 1.0,
            actor_names=sorted(settings.actor_kinds),
            pool=settings.pool,
            actor_slots=settings.actor_slots if settings.actor_kinds else 0,
            addresses=len(self.coordinators),
        )
        self._ws: ClientConnection | None = None
        self._futures: dict[int, asyncio.Future[None]] = {}
        self._kv: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pending: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._flush_scheduled = False
        self._outbox: list[RunnerOutput] = []  # outputs to carry out (``_run``)
        self._outbox_draining = False
        self._connected = asyncio.Event()
        self._retick = asyncio.Event()  # a deadline earlier than the ticker sleeps toward
        self._tick_at = 0.0
        self._over = asyncio.Event()
        self._main: asyncio.Task[None] | None = None
        self.tunnel = RunnerTunnel(host, self)

    @property
    def runner_id(self) -> RunnerId | None:
        return self.conn.runner_id

    @property
    def reports(self) -> WebSocketTransport:
        return self

    # ---- the Transport interface ---------------------------------------------------------

    async def open(self) -> None:
        self._main = asyncio.create_task(self._connect_forever(), name="websocket")
        connected = asyncio.ensure_future(self._connected.wait())
        await asyncio.wait({connected, self._main}, return_when=asyncio.FIRST_COMPLETED)
        connected.cancel()
        if self._main.done():
            await self._main

    async def serve(self) -> None:
        assert self._main is not None, "open() first"
        await asyncio.shield(self._main)

    def stop_claiming(self) -> None:
        self._run(self.conn.stopping(time.time()))

    async def close(self) -> None:
        self._flush()
        self._over.set()
        outputs = self.conn.shutdown(time.time())
        await self._carry_out(outputs)
        if self._ws is not None:
            with contextlib.suppress(ConnectionClosed, OSError):
                await self._ws.close(wire.CLOSE_NORMAL, wire.REASON_RUNNER_SHUTDOWN)
        if self._main is not None:
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._main
        await self.tunnel.aclose()

    # ---- reports (the ReportSink) --------------------------------------------------------

    def send(self, event: dict[str, Any]) -> asyncio.Future[None]:
        """Queue a report; reports made in the same moment travel in one frame."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((event, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        outputs = self.conn.send_events([event for event, _ in batch], time.time())
        numbered = self.conn.unacked_events[-len(batch) :]
        for indexed, (_, future) in zip(numbered, batch, strict=True):
            self._futures[indexed.idx] = future
        self._run(outputs)

    def _settle_acknowledged(self) -> None:
        unacked = {e.idx for e in self.conn.unacked_events}
        for idx in [i for i in self._futures if i not in unacked]:
            future = self._futures.pop(idx)
            if not future.done():
                future.set_result(None)

    def _fail_all(self, error: Exception) -> None:
        for future in self._futures.values():
            if not future.done():
                future.set_exception(error)
        self._futures.clear()

    # ---- actors' key-value state ---------------------------------------------------------

    async def kv(
        self, actor_id: str, op: dict[str, Any], generation: int | None = None
    ) -> dict[str, Any]:
        """One KV operation (see ``corral.store.kv``) of that ``generation`` of the actor;
        waits through reconnects. Raises ``CorralError`` when it is refused, or
        ``lease_lost`` when the work had to stop."""
        request_id, outputs = self.conn.kv_request(actor_id, op, time.time(), generation=generation)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._kv[request_id] = future
        self._run(outputs)
        result = await future
        if not result.get("ok"):
            code = str(result.get("code", "kv_refused"))
            raise CorralError(str(result.get("error", code)), code=code)
        return result

    # ---- the tunnel (the runner's end is corral.runner.tunnel) ----------------------------

    def tunnel_send(self, message: TunnelReply) -> None:
        self._run(self.conn.tunnel_send(message, time.time()))

    def tunnel_room(self, request_id: str) -> int:
        return self.conn.tunnel_room(request_id)

    def tunnel_consumed(self, request_id: str, seq: int, nbytes: int, *, final: bool) -> None:
        self._run(self.conn.tunnel_consumed(request_id, seq, nbytes, time.time(), final=final))

    def tunnel_unacknowledged(self, request_id: str) -> int:
        return self.conn.tunnel_unacknowledged(request_id)

    def tunnel_forget(self, request_id: str) -> None:
        self.conn.tunnel_forget(request_id)

    def tunnel_version(self) -> int:
        return self.conn.coordinator_tunnel

    # ---- the socket ----------------------------------------------------------------------

    async def _connect_forever(self) -> None:
        while not self._over.is_set():
            if self.conn.state is ConnectionState.CLOSED:
                return
            coordinator = self.coordinator = await self.coordinators.current()
            self.conn.addresses = len(self.coordinators)
            outputs = self.conn.connect(time.time())
            try:
                async with websockets.connect(
                    socket_url(coordinator.url),
                    additional_headers=auth_headers(self.settings.token),
                    open_timeout=10,
                    max_size=MAX_FRAME,
                    compression=None,  # small JSON frames: not worth the CPU
                    # The protocol's own pings find a dead socket (RunnerConnection.silence_s).
                    ping_interval=None,
                    **_reaching(coordinator),
                ) as ws:
                    self._ws = ws
                    await self._carry_out(outputs)
                    await self._converse(ws)
                    if ws.close_reason == wire.protocol_error_reason(wire.INVALID_INIT):
                        # What this runner says of itself breaks the coordinator's limits.
                        raise InvalidRequest("the coordinator refused this runner's Init")
                    lost = self.conn.socket_closed(time.time())
            except (OSError, TimeoutError, websockets.WebSocketException) as exc:
                if refusal := _refusal(exc):
                    raise refusal from exc  # asking again cannot change the answer
                log.warning("coordinator socket %s: %s", coordinator, exc)
                lost = (
                    self.conn.socket_closed(time.time())
                    if self.conn.state is ConnectionState.ACTIVE
                    else self.conn.connect_failed(time.time())
                )
            finally:
                self._ws = None
                self._connected.clear()
            # Whatever happened to that one, the next attempt goes elsewhere.
            self.coordinators.move_on(coordinator)
            await self._carry_out(lost)
            await self._wait_to_reconnect()

    async def _converse(self, ws: ClientConnection) -> None:
        ticker = asyncio.create_task(self._tick_while_open())
        try:
            async for frame in ws:
                try:
                    message = wire.decode(frame, side="client")
                except wire.ProtocolError as exc:
                    log.warning("bad frame from the coordinator: %s", exc)
                    await ws.close(wire.CLOSE_POLICY_VIOLATION, exc.reason[:120])
                    return
                try:
                    outputs = self.conn.receive(message, time.time())
                except wire.ProtocolError as exc:  # a valid frame at the wrong moment
                    log.warning("coordinator broke the protocol: %s", exc)
                    await ws.close(wire.CLOSE_POLICY_VIOLATION, exc.reason[:120])
                    return
                await self._carry_out(outputs)
                self._settle_acknowledged()
                if self.conn.state is ConnectionState.CLOSED:
                    return
                deadline = self.conn.next_deadline()
                if deadline is not None and deadline < self._tick_at:
                    self._retick.set()  # e.g. the Init: ack and ping timers start now
        except ConnectionClosed:
            return
        finally:
            ticker.cancel()

    async def _tick_while_open(self) -> None:
        while True:
            deadline = self.conn.next_deadline()
            self._tick_at = time.time() + 1.0 if deadline is None else deadline
            self._retick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retick.wait(), max(0.0, self._tick_at - time.time()))
            if self.conn.state is ConnectionState.DISCONNECTED:
                # This socket is given up (its Reconnect may be due at once: a coordinator
                # that stops): ticking is ``_wait_to_reconnect``'s now, not ours.
                return
            await self._carry_out(self.conn.tick(time.time()))

    async def _wait_to_reconnect(self) -> None:
        """Tick while disconnected: reconnect when the backoff says so, and stop all work
        if the runner-lost timer runs out first."""
        while self.conn.state is ConnectionState.DISCONNECTED and not self._over.is_set():
            deadline = self.conn.next_deadline()
            await asyncio.sleep(1.0 if deadline is None else max(0.0, deadline - time.time()))
            outputs = self.conn.tick(time.time())
            await self._carry_out(outputs)
            if any(isinstance(o, Reconnect) for o in outputs):
                return

    # ---- outputs -------------------------------------------------------------------------

    def _run(self, outputs: list[RunnerOutput]) -> None:
        """Carry ``outputs`` out soon, after those asked before (one task drains them all,
        in order: a tunnel's numbered messages must leave in the order they were numbered)."""
        if not outputs:
            return
        self._outbox.extend(outputs)
        if not self._outbox_draining:
            self._outbox_draining = True
            asyncio.get_running_loop().create_task(self._drain_outbox())

    async def _drain_outbox(self) -> None:
        try:
            while self._outbox:
                outputs, self._outbox = self._outbox, []
                try:
                    await self._carry_out(outputs)
                except Exception:  # as a task of its own would have: logged, the rest goes on
                    log.exception("carrying out %d outputs failed", len(outputs))
        finally:
            self._outbox_draining = False

    async def _carry_out(self, outputs: list[RunnerOutput]) -> None:
        for out in outputs:
            if isinstance(out, Send):
                ws = self._ws
                if ws is not None:
                    with contextlib.suppress(ConnectionClosed, OSError):
                        await ws.send(wire.encode(out.message))
            elif isinstance(out, Execute):
                self._execute(out.command.body)
            elif isinstance(out, Connected):
                if out.fresh and self._futures:
                    # A new identity: reports of the old one will never be acknowledged
                    # (the connection also says StopAllWork: those runs are not ours) —
                    # but for the late reports carried over, under their new numbers.
                    carried = {
                        new: self._futures.pop(old)
                        for old, new in out.carried
                        if old in self._futures
                    }
                    self._fail_all(LeaseLost("the coordinator gave this runner a new id"))
                    self._futures.update(carried)
                if out.carried:
                    log.warning(
                        "runner %s: %d reports of work done under the former id sent again",
                        out.runner_id,
                        len(out.carried),
                    )
                log.info(
                    "runner %s connected (%s, %d slots, websocket)",
                    out.runner_id,
                    self.settings.name,
                    self.settings.slots,
                )
                self._connected.set()
            elif isinstance(out, StopAllWork):
                log.warning("away longer than the runner-lost threshold: stopping all work")
                self.tunnel.abort_all()
                self.host.stop_all_work()
            elif isinstance(out, TunnelReceived):
                self.tunnel.received(out.message)
            elif isinstance(out, TunnelAcked):
                self.tunnel.acked(out.request_id)
            elif isinstance(out, TunnelDropped):
                self.tunnel.abort_all()
            elif isinstance(out, KvAnswered):
                future = self._kv.pop(out.request_id, None)
                if future is not None and not future.done():
                    future.set_result(out.result)
            elif isinstance(out, DrainRequested):
                log.info("the coordinator asks this runner to drain within %ss", out.grace_s)
                self.host.drain(out.grace_s)
            elif isinstance(out, Closed) and out.reconnect:
                # This socket is done (silent, or closed by the coordinator): drop it now,
                # without a closing handshake a half-open socket would never answer.
                if self._ws is not None:
                    if out.reason == wire.REASON_COORDINATOR_LEAVING:
                        log.info(
                            "coordinator %s is stopping: moving on, runs kept", self.coordinator
                        )
                    else:
                        log.warning("dropping the coordinator socket: %s", out.reason)
                    self._ws.transport.abort()
            elif isinstance(out, Closed) and not self._over.is_set():
                log.warning("coordinator closed the link: %s", out.reason)
                self._over.set()
                if out.reason == wire.REASON_STOPPED:
                    # The coordinator has already given our runs back to pending: running
                    # them on would run them twice.
                    self.host.stop_all_work()
                self.host.drain()

    def _execute(self, body: dict[str, Any]) -> None:
        """Carry out one command; one this runner cannot (a coordinator of another version)
        is logged, and a run it cannot start is reported failed, never left hanging."""
        try:
            self._dispatch(body)
        except Exception as exc:
            log.exception("command %r could not be carried out", body.get("type"))
            run = body.get("run")
            if body.get("type") == "start_run" and isinstance(run, dict):
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    self.send(
                        {
                            "type": "finished",
                            "run_id": str(run["run_id"]),
                            "attempt": int(run["attempts"]),
                            "status": "failed",
                            "error": f"this runner could not read the assignment: {exc!r}",
                        }
                    )

    def _dispatch(self, body: dict[str, Any]) -> None:
        kind = body.get("type")
        if kind == "start_run":
            self.host.start(body["run"])
        elif kind == "cancel_run":
            self.host.cancel(RunId(str(body["run_id"])))
        elif kind == "abandon_run":
            self.host.abandon(RunId(str(body["run_id"])))
        elif kind == "start_actor":
            self.host.actors.start(body)
        elif kind == "stop_actor":
            self.host.actors.stop(str(body["actor_id"]), int(body["generation"]))
        else:
            log.warning("unknown command %r ignored", kind)


def _reaching(coordinator: Coordinator) -> dict[str, Any]:
    """How ``websockets.connect`` reaches it: at its address, if it has one (the Host header
    and TLS server name stay the URL's name), and then directly: a proxy would resolve the
    name again."""
    if coordinator.address is None:
        return {}
    return {"host": coordinator.address, "proxy": None}


def _refusal(exc: Exception) -> CorralError | None:
    """The coordinator refused the socket itself (HTTP 4xx: a bad token, a bad request):
    the error it answered; None for an outage (5xx, network) that a retry may outlast."""
    if not isinstance(exc, websockets.InvalidStatus):
        return None
    status = exc.response.status_code
    if not 400 <= status < 500:
        return None
    try:
        body = json.loads(exc.response.body or b"null")
    except ValueError:
        body = None
    return errors.from_wire(status, body)
