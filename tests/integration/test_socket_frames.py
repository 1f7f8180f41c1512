"""The coordinator's runner socket, frame by frame: a real uvicorn on a free local port, and
runners played by hand with the ``websockets`` client, speaking ``corral.protocol.messages``.

* A peer that breaks the protocol (a frame that is not JSON, an unknown message, an Init of
  a future protocol version, anything before Init, no Init within the init timeout) has its
  socket closed with 1008 and a ``corral.protocol_error:<code>`` / ``corral.init_timeout``
  reason, while another runner's socket on the same coordinator goes on and completes a run.
* A second socket with the same runner id evicts the first (``corral.evicted``).
* Commands the runner has not acknowledged are sent again on its next socket; events it
  sends again after a reconnect are applied once (by index).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from api_fixtures import HEADERS, live_server, with_token
from fastapi import FastAPI
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from corral.coordinator.app import create_app
from corral.coordinator.service import Coordinator
from corral.coordinator.settings import CoordinatorSettings
from corral.protocol import messages as m

pytestmark = pytest.mark.anyio

M = TypeVar("M")
STEP_S = 10.0  # the bound on any single expected frame (a correctness bound, not a benchmark)
INIT_TIMEOUT_S = 5.0  # ServerSession's default; the coordinator has no setting for it


# ---- the coordinator under a real uvicorn, WebSockets enabled -------------------------------


@dataclass
class Served:
    app: FastAPI
    http: httpx.AsyncClient
    ws_url: str

    @property
    def coordinator(self) -> Coordinator:
        coordinator: Coordinator = self.app.state.coordinator
        return coordinator

    async def create_run(self, *argv: str) -> str:
        response = await self.http.post("/runs", json={"type": "command", "command": list(argv)})
        assert response.status_code == 201, response.text
        run_id: str = response.json()["run_id"]
        return run_id

    async def run(self, run_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def log_texts(self, run_id: str) -> list[str]:
        response = await self.http.get(f"/runs/{run_id}/logs")
        assert response.status_code == 200, response.text
        return [line["text"] for line in response.json()["lines"]]

    async def runners(self) -> list[dict[str, Any]]:
        response = await self.http.get("/runners")
        assert response.status_code == 200, response.text
        found: list[dict[str, Any]] = response.json()["runners"]
        return found

    async def connect(self) -> Peer:
        return Peer(
            await connect(
                f"{self.ws_url}/runner/socket", open_timeout=STEP_S, additional_headers=HEADERS
            )
        )


@contextlib.asynccontextmanager
async def serve(db_url: str, poll_timeout_s: float = 5.0, **more: Any) -> AsyncIterator[Served]:
    # No reconciler: these tests decide every step themselves (nothing is declared lost).
    settings = with_token(CoordinatorSettings(db_url=db_url, poll_timeout_s=poll_timeout_s, **more))
    app = create_app(settings, reconcile=False)
    with live_server(app, ws="websockets-sansio", graceful_shutdown_s=2) as url:
        async with httpx.AsyncClient(base_url=url, timeout=STEP_S, headers=HEADERS) as http:
            yield Served(app, http, "ws://" + url.removeprefix("http://"))


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(str(tmp_path / "corral.db")) as found:
        yield found


@pytest.fixture
async def served_any(db_url: str) -> AsyncIterator[Served]:
    """The same, on SQLite and on PostgreSQL (the link's state lives in the store)."""
    async with serve(db_url) as found:
        yield found


# ---- a runner played by hand ----------------------------------------------------------------


class Peer:
    """One runner socket; every receive is bounded by ``STEP_S``."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.runner_id: str | None = None

    async def send(self, message: m.Message) -> None:
        await self.ws.send(m.encode(message))

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def recv(self) -> m.ToClientMessage:
        frame = await asyncio.wait_for(self.ws.recv(), STEP_S)
        return m.decode(frame, side="client")

    async def expect(self, kind: type[M]) -> M:
        message = await self.recv()
        assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
        return message

    async def init(
        self,
        name: str,
        *,
        runner_id: str | None = None,
        last_command_idx: int = 0,
        slots: int = 1,
        labels: tuple[str, ...] = (),
        metadata: dict[str, Any] | None = None,
    ) -> m.ToClientInit:
        await self.send(
            m.ToServerInit(
                name=name,
                version="test",
                protocol_version=m.PROTOCOL_VERSION,
                total_slots=slots,
                last_command_idx=last_command_idx,
                runner_id=runner_id,  # type: ignore[arg-type]
                labels=labels,
                metadata={"hostname": f"{name}.test", **(metadata or {})},
            )
        )
        hello = await self.expect(m.ToClientInit)
        self.runner_id = hello.runner_id
        return hello

    async def nothing_pending(self) -> None:
        """Nothing was sent before now: a ping's pong is the next frame."""
        await self.send(m.ToServerPing(ts=123.0))
        assert await self.recv() == m.ToClientPong(ts=123.0)

    async def closed_with(self) -> tuple[int | None, str | None]:
        """Wait until the coordinator closes this socket; its close code and reason. Frames
        still arriving before the close are skipped."""
        with contextlib.suppress(ConnectionClosed):
            while True:
                await asyncio.wait_for(self.ws.recv(), STEP_S)
        return self.ws.close_code, self.ws.close_reason

    async def close(self) -> None:
        await self.ws.close()


def started(run_id: str, attempt: int = 1) -> dict[str, Any]:
    return {"type": "started", "run_id": run_id, "attempt": attempt}


def logs(run_id: str, *lines: tuple[int, str], attempt: int = 1) -> dict[str, Any]:
    return {
        "type": "logs",
        "run_id": run_id,
        "attempt": attempt,
        "lines": [{"line_no": n, "stream": "stdout", "text": t, "ts": 1.0} for n, t in lines],
    }


def finished(run_id: str, attempt: int = 1) -> dict[str, Any]:
    return {
        "type": "finished",
        "run_id": run_id,
        "attempt": attempt,
        "status": "completed",
        "exit_code": 0,
    }


def events(first_idx: int, *bodies: dict[str, Any]) -> m.ToServerEvents:
    return m.ToServerEvents(tuple(m.Indexed(first_idx + i, b) for i, b in enumerate(bodies)))


def start_commands(message: m.ToClientCommands) -> dict[str, m.Indexed]:
    """The start_run commands of a frame, by run id."""
    return {c.body["run"]["run_id"]: c for c in message.commands if c.body["type"] == "start_run"}


async def complete_a_run(served: Served, peer: Peer, first_event_idx: int = 1) -> str:
    """Create a run, receive it on ``peer`` (one slot), report it done; the run id."""
    run_id = await served.create_run("true")
    (command,) = (await peer.expect(m.ToClientCommands)).commands
    assert command.body["type"] == "start_run" and command.body["run"]["run_id"] == run_id
    attempt = command.body["run"]["attempts"]
    await peer.send(events(first_event_idx, started(run_id, attempt), finished(run_id, attempt)))
    ack = await peer.expect(m.ToClientAckEvents)
    assert ack.last_event_idx == first_event_idx + 1
    await peer.send(m.ToServerAckCommands(command.idx))
    run = await served.run(run_id)
    assert run["status"] == "completed" and run["runner_id"] == peer.runner_id, run
    return run_id


# ---- protocol errors ------------------------------------------------------------------------

FUTURE = m.PROTOCOL_VERSION + 1


def _init_frame(**changes: Any) -> str:
    frame = {
        "v": m.PROTOCOL_VERSION,
        "type": "ToServerInit",
        "name": "bad",
        "version": "test",
        "protocol_version": m.PROTOCOL_VERSION,
        "total_slots": 1,
        "last_command_idx": 0,
        "runner_id": None,
        "labels": [],
        "metadata": {},
    }
    return json.dumps({**frame, **changes})


BAD_OPENINGS = {
    "not_json": ("this is {not json", m.MALFORMED_FRAME),
    "binary_frame": (_init_frame().encode(), m.MALFORMED_FRAME),
    "not_an_object": ("[1, 2, 3]", m.MALFORMED_FRAME),
    "init_missing_field": (json.dumps({"v": 1, "type": "ToServerInit"}), m.MALFORMED_FRAME),
    "unknown_message": (json.dumps({"v": 1, "type": "ToServerBogus"}), m.UNKNOWN_MESSAGE),
    "client_message_to_server": (
        json.dumps({"v": 1, "type": "ToClientPong", "ts": 1.0}),
        m.UNKNOWN_MESSAGE,
    ),
    "init_future_protocol": (_init_frame(protocol_version=FUTURE), m.UNSUPPORTED_VERSION),
    "frame_future_version": (_init_frame(v=FUTURE), m.UNSUPPORTED_VERSION),
    "ping_before_init": (m.encode(m.ToServerPing(ts=1.0)), m.EXPECTED_INIT),
    "events_before_init": (
        m.encode(events(1, started("run_000000000000"))),
        m.EXPECTED_INIT,
    ),
}


@pytest.mark.parametrize("frame,code", BAD_OPENINGS.values(), ids=BAD_OPENINGS.keys())
async def test_bad_first_frame_closes_only_that_socket(
    served: Served, frame: str | bytes, code: str
) -> None:
    good = await served.connect()
    await good.init("good")
    bad = await served.connect()
    await bad.send_raw(frame)
    assert await bad.closed_with() == (
        m.CLOSE_POLICY_VIOLATION,
        f"corral.protocol_error:{code}",
    )
    await complete_a_run(served, good)
    assert [r["name"] for r in await served.runners()] == ["good"]  # nothing registered


async def test_bad_frame_after_init_closes_only_that_socket(served: Served) -> None:
    good = await served.connect()
    await good.init("good")
    runner_id = None
    frames: list[tuple[str | bytes, str]] = [
        ("{{{", m.MALFORMED_FRAME),
        (json.dumps({"v": 1, "type": "ToServerTeleport"}), m.UNKNOWN_MESSAGE),
        (m.encode(m.ToServerPing(ts=1.0)).encode(), m.MALFORMED_FRAME),
        (json.dumps({"v": 1, "type": "ToServerAckCommands", "last_command_idx": -1}),
         m.MALFORMED_FRAME),
        (_init_frame(name="bad"), m.DUPLICATE_INIT),
    ]  # fmt: skip
    for frame, code in frames:
        bad = await served.connect()
        runner_id = (await bad.init("bad", runner_id=runner_id)).runner_id
        await bad.send_raw(frame)
        assert await bad.closed_with() == (m.CLOSE_POLICY_VIOLATION, m.protocol_error_reason(code))
    await complete_a_run(served, good)


async def test_no_init_within_the_timeout(served: Served) -> None:
    good = await served.connect()
    await good.init("good")
    silent = await served.connect()
    opened = time.monotonic()
    # A live socket that says nothing: the coordinator's own pings do not count.
    assert await silent.closed_with() == (m.CLOSE_POLICY_VIOLATION, m.REASON_INIT_TIMEOUT)
    waited = time.monotonic() - opened
    assert INIT_TIMEOUT_S - 0.5 <= waited <= INIT_TIMEOUT_S + 3.0, waited
    await complete_a_run(served, good)


# ---- eviction, and replay across reconnects -------------------------------------------------


async def test_second_socket_with_the_same_id_evicts_the_first(served_any: Served) -> None:
    served = served_any
    first = await served.connect()
    hello = await first.init("runner-a")
    second = await served.connect()
    again = await second.init("runner-a", runner_id=hello.runner_id)
    assert again.runner_id == hello.runner_id

    assert await first.expect(m.ToClientClose) == m.ToClientClose(m.REASON_EVICTED)
    assert await first.closed_with() == (m.CLOSE_NORMAL, m.REASON_EVICTED)
    # The newer socket is the runner now: it gets the work, and there is one runner.
    await complete_a_run(served, second)
    (runner,) = await served.runners()
    assert runner["runner_id"] == hello.runner_id
    assert runner["state"] == "active" and runner["transport"] == "websocket"


async def test_unacknowledged_commands_are_sent_again(served_any: Served) -> None:
    served = served_any
    first = await served.connect()
    hello = await first.init("runner-a", slots=2)
    runner_id = hello.runner_id
    run_1 = await served.create_run("true")
    (cmd_1,) = (await first.expect(m.ToClientCommands)).commands
    assert cmd_1.body["run"]["run_id"] == run_1
    await first.close()  # gone before acknowledging it

    second = await served.connect()
    await second.init("runner-a", runner_id=runner_id, slots=2)  # it never saw command 1
    assert start_commands(await second.expect(m.ToClientCommands)) == {run_1: cmd_1}
    await second.send(m.ToServerAckCommands(cmd_1.idx))
    run_2 = await served.create_run("true")
    (cmd_2,) = (await second.expect(m.ToClientCommands)).commands
    assert cmd_2.idx == cmd_1.idx + 1 and cmd_2.body["run"]["run_id"] == run_2
    commands = served.coordinator.store.commands

    async def acked() -> int:
        return (await served.coordinator.in_thread(commands.state, runner_id)).acked_command_idx

    deadline = time.monotonic() + STEP_S
    while await acked() < cmd_1.idx:
        assert time.monotonic() < deadline, "the acknowledgement was not stored"
        await asyncio.sleep(0.01)
    await second.close()

    # It executed command 2 but was cut before acknowledging it: it says so in its Init,
    # and gets nothing again. Acknowledged command 1 is not resent either.
    third = await served.connect()
    await third.init("runner-a", runner_id=runner_id, last_command_idx=cmd_2.idx, slots=2)
    await third.nothing_pending()
    await third.close()

    # A runner that lost command 2 (says it has up to 1) gets command 2 alone.
    fourth = await served.connect()
    await fourth.init("runner-a", runner_id=runner_id, last_command_idx=cmd_1.idx, slots=2)
    assert start_commands(await fourth.expect(m.ToClientCommands)) == {run_2: cmd_2}
    await fourth.nothing_pending()
    for run_id in (run_1, run_2):
        assert (await served.run(run_id))["status"] == "claimed"


async def commands_until_acked(peer: Peer, last_event_idx: int) -> list[m.Indexed]:
    """Frames until one acknowledges events up to ``last_event_idx``, in a frame of its own
    or in a Commands frame (``ACKS_IN_COMMANDS``); the commands that came meanwhile. Each
    frame is bounded by ``STEP_S``: an acknowledgement withheld or lost fails here."""
    commands: list[m.Indexed] = []
    while True:
        message = await peer.recv()
        if isinstance(message, m.ToClientCommands):
            commands += message.commands
            acked = message.ack_events
        else:
            assert isinstance(message, m.ToClientAckEvents), message
            acked = message.last_event_idx
        assert acked <= last_event_idx, message
        if acked == last_event_idx:
            return commands


async def test_reports_are_acknowledged_with_the_next_runs_or_alone(served_any: Served) -> None:
    """A runner that reads acknowledgements in Commands frames has each report acknowledged
    after its commit: with the start of the run its freed slot takes (the claim commits with
    the report), or alone when no run is waiting — never held for commands that do not come."""
    served = served_any
    peer = await served.connect()
    await peer.init("runner-a", metadata={m.ACKS_IN_COMMANDS: 1})
    run_1, run_2 = await served.create_run("true"), await served.create_run("true")
    (cmd_1,) = (await peer.expect(m.ToClientCommands)).commands
    assert cmd_1.body["run"]["run_id"] == run_1
    await peer.send(events(1, started(run_1), finished(run_1)))
    (cmd_2,) = await commands_until_acked(peer, 2) or [await peer.expect(m.ToClientCommands)]
    assert cmd_2.body["run"]["run_id"] == run_2
    assert (await served.run(run_1))["status"] == "completed"
    await peer.send(events(3, started(run_2), finished(run_2)))
    assert await commands_until_acked(peer, 4) == []  # nothing waits: acknowledged alone
    await peer.nothing_pending()
    assert (await served.run(run_2))["status"] == "completed"


async def test_events_sent_again_are_applied_once(served_any: Served) -> None:
    served = served_any
    first = await served.connect()
    hello = await first.init("runner-a")
    run_id = await served.create_run("true")
    (cmd,) = (await first.expect(m.ToClientCommands)).commands
    await first.send(events(1, started(run_id), logs(run_id, (0, "once")), finished(run_id)))
    assert await first.expect(m.ToClientAckEvents) == m.ToClientAckEvents(3)
    await first.close()  # as if the acknowledgement had been lost with the socket

    second = await served.connect()
    again = await second.init("runner-a", runner_id=hello.runner_id, last_command_idx=cmd.idx)
    assert again.last_event_idx == 3
    # The runner replays 1–3 anyway (event 2 under the same index but another line: only
    # the index decides), then sends a new one.
    await second.send(events(1, started(run_id), logs(run_id, (1, "replayed")), finished(run_id)))
    await second.send(events(4, logs(run_id, (1, "new"))))
    # Nothing for the replay (no Apply, so no ack), then the ack of event 4.
    assert await second.expect(m.ToClientAckEvents) == m.ToClientAckEvents(4)
    await second.nothing_pending()  # and no abandon_run (a refused duplicate would send one)

    run = await served.run(run_id)
    assert run["status"] == "completed" and run["attempts"] == 1, run
    assert await served.log_texts(run_id) == ["once", "new"]
    state = await served.coordinator.in_thread(
        served.coordinator.store.commands.state, hello.runner_id
    )
    assert state.last_event_idx == 4
