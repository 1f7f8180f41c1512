"""The actors a runner hosts: their processes, and the local API each one is given.

A ``start_actor`` command starts the kind's command (``actors/kinds.py``) with

    PORT                     a free local port the actor must listen on
    CORRAL_ACTOR_ID, CORRAL_ACTOR_KEY, CORRAL_ACTOR_GENERATION
    CORRAL_ACTOR_INPUT       its input (CORRAL_ACTOR_INPUT_FILE names a file holding it when
                             it is too large for an environment variable)
    CORRAL_ACTOR_API         http://127.0.0.1:P/actors/<secret>: this generation's own
                             endpoint on the runner — POST kv, sleep, stop, alarm, activity

and reports ``running`` once the process accepts connections on PORT (not before; not at
all if it does not within the kind's start threshold: it is stopped), ``stopped`` with its
exit status when it exits (0 when it ended because it was told to stop). ``stop_actor``
sends SIGTERM, then SIGKILL after the stop threshold. A process the runner ends of its own
accord — a start that took too long, the end of a drain's grace, the work stopped — is
reported with no exit status (a crash, for the crash policy to decide), never 0: whatever
the process answers a SIGTERM with, 0 would be a graceful exit, which destroys the actor
and drops its KV. Commands and the local API name the
generation: those of an older one are ignored or refused.

The gateway's side (``port_of``, ``touch``) finds the port of a running generation and
counts requests as activity: an actor idle for its kind's ``sleep_after`` is put to sleep
(intent Sleep).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from corral.actors.kinds import ActorKind
from corral.agents.base import ProcessSpec
from corral.errors import CorralError
from corral.runner.process import Child
from corral.runner.transport import ReportSink

log = logging.getLogger("corral.runner")
INPUT_ENV_MAX_BYTES = 64 * 1024  # larger inputs go through a file (argv+env are limited)
ACCEPT_POLL_S = 0.001  # how often a starting actor's PORT is tried: the cold wake waits on it
ACCEPT_PROBE_TIMEOUT_S = 0.05  # a loopback connect that takes longer: try again later
IDLE_CHECK_S = 1.0

KvCall = Callable[[str, dict[str, Any], int], Awaitable[dict[str, Any]]]  # actor, op, generation


@dataclass
class HostedActor:
    """One generation of one actor on this runner."""

    actor_id: str
    generation: int
    key: str | None
    kind: ActorKind
    port: int
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    child: Child | None = None
    accepting: bool = False
    # Set once its start is decided: it accepts connections, or it never will.
    started: asyncio.Event = field(default_factory=asyncio.Event)
    stop_asked: bool = False  # it is being stopped (told to, or of the runner's accord)
    told_to_stop: bool = False  # by the coordinator (stop_actor): its SIGTERM is an end
    sleep_asked: bool = False
    last_activity: float = field(default_factory=time.monotonic)
    input_file: str | None = None


def free_port() -> int:
    """A local port nobody listens on now (the actor binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def accepts(port: int) -> bool:
    """Does a process accept connections on local ``port`` now? (Without the event loop: a
    loopback connect is answered at once, accepted or refused.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(ACCEPT_PROBE_TIMEOUT_S)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def exit_status(returncode: int, asked_to_stop: bool) -> int:
    """The status reported: 0 for an end it was asked for (SIGTERM included), 128+N for a
    death by signal N, else its own."""
    if asked_to_stop and returncode in (0, -signal.SIGTERM):
        return 0
    return 128 - returncode if returncode < 0 else returncode


class ActorHost:
    def __init__(
        self,
        kinds: Mapping[str, ActorKind],
        reports: ReportSink,
        kv: KvCall | None,
        base_env: Mapping[str, str],
    ) -> None:
        self.kinds = dict(kinds)
        self.reports = reports
        self._kv = kv
        self._base_env = dict(base_env)
        self._actors: dict[str, HostedActor] = {}
        self._by_secret: dict[str, HostedActor] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._api: uvicorn.Server | None = None
        self._api_url: str | None = None
        self._api_task: asyncio.Task[None] | None = None

    # ---- the gateway's side ---------------------------------------------------------------

    def port_of(self, actor_id: str, generation: int) -> int | None:
        """The port to reach ``actor_id`` at, if this runner runs that generation and it
        accepts connections (and was not told to stop); else None."""
        hosted = self._actors.get(actor_id)
        if hosted is None or hosted.generation != generation:
            return None
        if not hosted.accepting or hosted.stop_asked:
            return None
        return hosted.port

    async def port_when_started(self, actor_id: str, generation: int) -> int | None:
        """``port_of``, once that generation's start is decided if it is starting: the
        gateway may send a request as soon as the start command went out
        (``wire.TUNNEL_STARTING``)."""
        hosted = self._actors.get(actor_id)
        if hosted is not None and hosted.generation == generation:
            await hosted.started.wait()
        return self.port_of(actor_id, generation)

    def touch(self, actor_id: str) -> None:
        """A request reached the actor: it is not idle."""
        if hosted := self._actors.get(actor_id):
            hosted.last_activity = time.monotonic()

    # ---- commands --------------------------------------------------------------------------

    def start(self, body: dict[str, Any]) -> None:
        actor_id, generation = str(body["actor_id"]), int(body["generation"])
        current = self._actors.get(actor_id)
        if current is not None and current.generation >= generation:
            return  # a repeated command
        kind = self.kinds.get(str(body["name"]))
        if kind is None:
            log.warning("actor %s: this runner has no kind %r", actor_id, body["name"])
            self._state(actor_id, generation, "stopped", 127)
            return
        if current is not None:
            self._kill(current)  # an older generation still here: it is not the actor now
        hosted = HostedActor(actor_id, generation, body.get("key"), kind, free_port())
        self._actors[actor_id] = hosted
        self._by_secret[hosted.secret] = hosted
        task = asyncio.create_task(self._supervise(hosted, body.get("input")))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def stop(self, actor_id: str, generation: int) -> None:
        hosted = self._actors.get(actor_id)
        if hosted is None or hosted.generation != generation:
            return
        hosted.told_to_stop = True
        if not hosted.stop_asked:
            self._terminate(hosted)

    def _terminate(self, hosted: HostedActor) -> None:
        """SIGTERM (then SIGKILL after the stop threshold, ``_stop_within``)."""
        hosted.stop_asked = True
        if hosted.child is not None:
            hosted.child.signal_group(signal.SIGTERM)

    def stop_all(self, *, now: bool) -> None:
        """Stop every actor: at once (``now``: they are being placed elsewhere), or by
        SIGTERM and the stop threshold."""
        for hosted in list(self._actors.values()):
            if now:
                self._kill(hosted)
            elif not hosted.stop_asked:
                self._terminate(hosted)

    @property
    def running(self) -> int:
        return len(self._actors)

    async def close(self) -> None:
        """Every actor process gone (killed if need be), then the local API."""
        self.stop_all(now=True)
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=10.0)
        if self._api is not None:
            self._api.should_exit = True
        if self._api_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._api_task

    # ---- one generation's life -----------------------------------------------------------

    async def _supervise(self, hosted: HostedActor, input: str | None) -> None:
        try:
            returncode = await self._run(hosted, input)
            ours = hosted.stop_asked and not hosted.told_to_stop  # the runner's own accord
            status = None if ours else exit_status(returncode, hosted.told_to_stop)
        except (OSError, ValueError) as exc:
            log.warning("actor %s: cannot start %s: %s", hosted.actor_id, hosted.kind.name, exc)
            status = 127
        finally:
            hosted.started.set()  # it never will (if it had not)
            if self._actors.get(hosted.actor_id) is hosted:
                del self._actors[hosted.actor_id]
            self._by_secret.pop(hosted.secret, None)
            if hosted.input_file:
                with contextlib.suppress(OSError):
                    os.unlink(hosted.input_file)
        self._state(hosted.actor_id, hosted.generation, "stopped", status)

    async def _run(self, hosted: HostedActor, input: str | None) -> int:
        env = await self._environment(hosted, input)
        spec = ProcessSpec(hosted.kind.command, hosted.kind.working_dir, env)
        child = hosted.child = await Child.spawn(spec)
        drains = [
            asyncio.create_task(_log_lines(hosted.actor_id, stream))
            for stream in (child.proc.stdout, child.proc.stderr)
            if stream is not None
        ]
        if hosted.stop_asked:  # told to stop while it was being spawned
            child.signal_group(signal.SIGTERM)
        exited = asyncio.create_task(child.proc.wait())
        try:
            accepting = await self._accepting(hosted, exited)
            hosted.accepting = accepting
            if accepting:
                hosted.last_activity = time.monotonic()
                # Reported before the requests held for it go: the coordinator stores it
                # before it passes on their answers (what was sent before them first).
                self._state(hosted.actor_id, hosted.generation, "running")
            hosted.started.set()
            if accepting:
                await self._watch_idle(hosted, exited)
            elif not exited.done():
                if not hosted.stop_asked:  # a failed start, not an end it was asked for
                    log.warning("actor %s: no connection on PORT in time", hosted.actor_id)
                    hosted.stop_asked = True
                child.signal_group(signal.SIGTERM)
            return await _stop_within(child, exited, hosted.kind.stop_threshold_s)
        finally:
            await asyncio.gather(*drains, return_exceptions=True)

    async def _accepting(self, hosted: HostedActor, exited: asyncio.Task[int]) -> bool:
        # Nothing tells us when a process starts listening, so its port is tried often (a
        # cold wake waits on this) and cheaply: a refused loopback connect is immediate.
        deadline = time.monotonic() + hosted.kind.start_threshold_s
        while not exited.done() and time.monotonic() < deadline and not hosted.stop_asked:
            if accepts(hosted.port):
                return True
            await asyncio.wait({exited}, timeout=ACCEPT_POLL_S)
        return False

    async def _watch_idle(self, hosted: HostedActor, exited: asyncio.Task[int]) -> None:
        """Until it exits or is told to stop; ask for sleep once it is idle long enough."""
        sleep_after = hosted.kind.sleep_after_s
        while not exited.done() and not hosted.stop_asked:
            await asyncio.wait({exited}, timeout=IDLE_CHECK_S)
            idle = time.monotonic() - hosted.last_activity
            if sleep_after is not None and idle >= sleep_after and not hosted.sleep_asked:
                log.info("actor %s idle for %.0f s: sleep", hosted.actor_id, idle)
                self._intent(hosted, "sleep")

    async def _environment(self, hosted: HostedActor, input: str | None) -> dict[str, str]:
        env = {**self._base_env, **hosted.kind.env}
        env.update(
            PORT=str(hosted.port),
            CORRAL_ACTOR_ID=hosted.actor_id,
            CORRAL_ACTOR_KEY=hosted.key or "",
            CORRAL_ACTOR_GENERATION=str(hosted.generation),
            CORRAL_ACTOR_API=f"{await self._api_base()}/{hosted.secret}",
        )
        text = input or ""
        if len(text.encode()) <= INPUT_ENV_MAX_BYTES:
            env["CORRAL_ACTOR_INPUT"] = text
        else:
            fd, path = tempfile.mkstemp(prefix="corral-actor-input-")
            with os.fdopen(fd, "w") as out:
                out.write(text)
            hosted.input_file = env["CORRAL_ACTOR_INPUT_FILE"] = path
        return env

    def _kill(self, hosted: HostedActor) -> None:
        hosted.stop_asked = True
        if hosted.child is not None:
            hosted.child.signal_group(signal.SIGKILL)

    # ---- events ----------------------------------------------------------------------------

    def _state(self, actor_id: str, generation: int, state: str, code: int | None = None) -> None:
        event: dict[str, Any] = {
            "type": "actor_state",
            "actor_id": actor_id,
            "generation": generation,
            "state": state,
        }
        if code is not None:
            event["code"] = code
        self.reports.send(event)

    def _intent(self, hosted: HostedActor, intent: str) -> None:
        if intent == "sleep":
            if hosted.sleep_asked:
                return
            hosted.sleep_asked = True
        self.reports.send(
            {"type": "actor_intent", "actor_id": hosted.actor_id,
             "generation": hosted.generation, "intent": intent}
        )  # fmt: skip

    # ---- the local API -------------------------------------------------------------------

    async def _api_base(self) -> str:
        """The runner's local actor API, started with the first actor."""
        if self._api_url is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            port = listener.getsockname()[1]
            config = uvicorn.Config(
                self._api_app(), log_level="warning", lifespan="off", access_log=False
            )
            self._api = _QuietServer(config)
            self._api_task = asyncio.create_task(self._api.serve(sockets=[listener]))
            self._api_url = f"http://127.0.0.1:{port}/actors"
        return self._api_url

    def _api_app(self) -> Starlette:
        async def call(request: Request) -> JSONResponse:
            hosted = self._by_secret.get(request.path_params["secret"])
            if hosted is None or self._actors.get(hosted.actor_id) is not hosted:
                return _refusal(410, "actor_gone", "this generation of the actor has ended")
            try:
                body = await request.json() if await request.body() else {}
            except ValueError:
                return _refusal(400, "invalid_request", "the body must be JSON")
            if not isinstance(body, dict):
                return _refusal(400, "invalid_request", "the body must be a JSON object")
            return await self._answer(hosted, request.path_params["call"], body)

        return Starlette(routes=[Route("/actors/{secret}/{call}", call, methods=["POST"])])

    async def _answer(self, hosted: HostedActor, call: str, body: dict[str, Any]) -> JSONResponse:
        if call == "kv":
            if self._kv is None:
                return _refusal(501, "kv_unavailable", "KV needs the WebSocket transport")
            try:
                return JSONResponse(await self._kv(hosted.actor_id, body, hosted.generation))
            except CorralError as exc:
                status = 413 if exc.code == "payload_too_large" else 409
                if exc.code == "invalid_request":
                    status = 400
                return _refusal(status, exc.code, exc.message)
        if call in ("sleep", "stop"):
            self._intent(hosted, call)
            return JSONResponse({"ok": True})
        if call == "alarm":
            at = body.get("at")
            if at is not None and (isinstance(at, bool) or not isinstance(at, int | float)):
                return _refusal(400, "invalid_request", "'at' must be epoch seconds or null")
            self.reports.send(
                {"type": "actor_alarm", "actor_id": hosted.actor_id,
                 "generation": hosted.generation, "at": at}
            )  # fmt: skip
            return JSONResponse({"ok": True})
        if call == "activity":
            hosted.last_activity = time.monotonic()
            return JSONResponse({"ok": True})
        return _refusal(404, "not_found", f"no call {call!r}")


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: SIGTERM is the runner's (it drains)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _refusal(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"ok": False, "code": code, "error": message}, status_code=status)


async def _stop_within(child: Child, exited: asyncio.Task[int], grace_s: float) -> int:
    """Its exit status; SIGKILL if it outlives ``grace_s`` after a SIGTERM it was sent."""
    while not exited.done():
        done, _ = await asyncio.wait({exited}, timeout=grace_s)
        if not done:
            child.signal_group(signal.SIGKILL)
    return exited.result()


async def _log_lines(actor_id: str, stream: asyncio.StreamReader) -> None:
    """An actor's output goes to the runner's log (and its pipe never fills up)."""
    while line := await stream.readline():
        log.info("actor %s: %s", actor_id, line.decode(errors="replace").rstrip())
