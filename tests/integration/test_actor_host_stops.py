"""How a runner reports the end of an actor process it ended (``runner/actors.py``), with
real processes: an end the coordinator asked for (``stop_actor``) is the exit status, 0
for a SIGTERM; an end of the runner's own accord — the end of a drain's grace, a start
that took too long — has no exit status (a crash, for the crash policy), never 0, which
the coordinator takes for a graceful exit: it destroys the actor and drops its KV."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from corral.actors.kinds import ActorKind
from corral.runner.actors import ActorHost

pytestmark = pytest.mark.anyio
WAIT_S = 20.0
# Listens on PORT; a SIGTERM ends it with status 0 (as many servers do).
LISTENER = (
    "import os, signal, socket, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(os.environ['PORT']))); s.listen()\n"
    "time.sleep(60)\n"
)
# Never listens; a SIGTERM ends it with status 0.
DEAF = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "time.sleep(60)\n"
)


class Reports:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def send(self, event: dict[str, Any]) -> asyncio.Future[None]:
        self.events.append(event)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def state(self, state: str) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            found = [e for e in self.events if e.get("state") == state]
            if found:
                return found[0]
            assert asyncio.get_running_loop().time() < deadline, f"no {state}: {self.events}"
            await asyncio.sleep(0.02)


def host(reports: Reports, script: str, **kind: Any) -> ActorHost:
    kinds = {"k": ActorKind("k", (sys.executable, "-c", script), **kind)}
    return ActorHost(kinds, reports, None, {"PATH": "/usr/bin:/bin"})


def start(actors: ActorHost) -> None:
    actors.start({"actor_id": "act_1", "generation": 1, "name": "k", "key": None, "input": None})


async def test_a_stop_the_coordinator_asked_for_reports_the_exit_status() -> None:
    reports = Reports()
    actors = host(reports, LISTENER)
    start(actors)
    await reports.state("running")
    actors.stop("act_1", 1)
    assert (await reports.state("stopped"))["code"] == 0
    await actors.close()


async def test_the_end_of_a_drain_reports_no_exit_status() -> None:
    reports = Reports()
    actors = host(reports, LISTENER)
    start(actors)
    await reports.state("running")
    actors.stop_all(now=False)  # the drain's grace is over, no stop_actor came
    assert "code" not in await reports.state("stopped")
    await actors.close()


async def test_a_start_that_took_too_long_reports_no_exit_status() -> None:
    reports = Reports()
    actors = host(reports, DEAF, start_threshold_s=0.5)
    start(actors)
    assert "code" not in await reports.state("stopped")
    assert not [e for e in reports.events if e.get("state") == "running"]
    await actors.close()


# ---- a request for a generation that is starting (wire.TUNNEL_STARTING) ---------------------

SLOW_LISTENER = "import time; time.sleep(0.3)\n" + LISTENER


async def test_a_request_for_a_starting_generation_waits_until_it_accepts() -> None:
    reports = Reports()
    actors = host(reports, SLOW_LISTENER)
    start(actors)
    assert actors.port_of("act_1", 1) is None  # not accepting yet
    assert await actors.port_when_started("act_1", 2) is None  # not that generation
    assert await actors.port_when_started("act_2", 1) is None  # not here
    port = await asyncio.wait_for(actors.port_when_started("act_1", 1), WAIT_S)
    assert port is not None and port == actors.port_of("act_1", 1)
    await actors.close()


async def test_a_request_for_a_start_that_fails_finds_no_port() -> None:
    """The runner answers it 503 (``actor_not_here``): the actor never saw it."""
    reports = Reports()
    actors = host(reports, DEAF, start_threshold_s=0.5)
    start(actors)
    assert await asyncio.wait_for(actors.port_when_started("act_1", 1), WAIT_S) is None
    await actors.close()


async def test_a_request_for_an_actor_that_cannot_be_spawned_finds_no_port() -> None:
    reports = Reports()
    kinds = {"k": ActorKind("k", ("/nonexistent/actor",))}
    actors = ActorHost(kinds, reports, None, {"PATH": "/usr/bin:/bin"})
    start(actors)
    assert await asyncio.wait_for(actors.port_when_started("act_1", 1), WAIT_S) is None
    assert (await reports.state("stopped"))["code"] == 127
    await actors.close()
