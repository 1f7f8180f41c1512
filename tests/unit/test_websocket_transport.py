"""The WebSocket pump's handling of commands it cannot carry out (no socket needed: events
made while disconnected wait in the connection's replay buffer)."""

from __future__ import annotations

import asyncio

import pytest

from corral.runner.core import RunnerCore
from corral.runner.settings import RunnerSettings
from corral.runner.websocket import WebSocketTransport

pytestmark = pytest.mark.anyio


async def test_a_start_the_runner_cannot_read_fails_the_run_instead_of_the_link() -> None:
    runner = RunnerCore(RunnerSettings(transport="websocket", slots=2))
    transport = runner.transport
    assert isinstance(transport, WebSocketTransport)
    # A coordinator of another version: the assignment lacks fields this runner needs.
    transport._execute({"type": "start_run", "run": {"run_id": "run_x", "attempts": 2}})
    transport._execute({"type": "teleport_run", "run_id": "run_y"})  # unknown: ignored
    await asyncio.sleep(0)  # reports made in one moment leave together
    (event,) = [e.body for e in transport.conn.unacked_events]
    assert event["type"] == "finished" and event["status"] == "failed"
    assert (event["run_id"], event["attempt"]) == ("run_x", 2)
    assert "could not read the assignment" in event["error"]
    assert runner.attempts == {}
