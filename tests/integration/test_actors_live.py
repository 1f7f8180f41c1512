"""Actors end to end in one test process: a real coordinator (uvicorn, SQLite and
PostgreSQL), real runners on the WebSocket link, and the example agent actor
(``examples/agent_actor.py``) as a real process resuming a Claude session of the fake CLI.

Each step asserts what the API shows: placed and running, a request answered by the
actor's process, its session id in its KV, sleep (stopped, unplaced), a request through the
gateway that wakes it and resumes the same session in a new generation, the deferred wake
of seed 002 (a wake between the sleep intent and the stop), destroy (KV dropped), and a
runner's drain (GoingAway) that moves its actor to a second runner (seed 000's shutdown).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fixtures import TOKEN, auth_headers, error_code, live_server, with_token

from corral.actors.kinds import ActorKind
from corral.actors.model import INPUT_MAX_BYTES
from corral.coordinator.app import create_app
from corral.coordinator.link_core import LinkCore
from corral.coordinator.settings import CoordinatorSettings
from corral.runner.core import RunnerCore
from corral.runner.settings import RunnerSettings

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
STEP_S = 20.0


def agent_kind(tmp_path: Path) -> ActorKind:
    return ActorKind(
        name="agent",
        command=(sys.executable, str(ROOT / "examples" / "agent_actor.py")),
        env={
            "CLAUDE_BIN": str(ROOT / "tests" / "fakes" / "claude"),
            "FAKE_CLAUDE_HOME": str(tmp_path / "claude-home"),
            "PYTHONPATH": str(ROOT / "src"),
        },
        stop_threshold_s=5.0,
    )


def calling_kind(name: str, **changes: Any) -> ActorKind:
    script = ROOT / "tests" / "fakes" / "calling_actor.py"
    kind = ActorKind(name, (sys.executable, str(script)), env={"PYTHONPATH": str(ROOT / "src")})
    return replace(kind, **changes)


class World:
    def __init__(self, url: str, client: httpx.AsyncClient, tmp_path: Path) -> None:
        self.url = url
        self.client = client
        self.tmp_path = tmp_path
        self.runners: list[RunnerCore] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def runner(self) -> RunnerCore:
        settings = RunnerSettings(
            coordinator_url=self.url,
            token=TOKEN,
            transport="websocket",
            slots=1,
            actor_kinds={
                "agent": agent_kind(self.tmp_path),
                "calls": calling_kind("calls", stop_threshold_s=5.0),
                "idle": calling_kind("idle", sleep_after_s=1.0),
                "deaf": ActorKind(
                    "deaf",
                    (sys.executable, "-c", "import time; time.sleep(60)"),
                    start_threshold_s=1.0,
                ),
            },
            actor_slots=4,
            drain_grace_s=STEP_S,
        )
        runner = RunnerCore(settings, host_env={"PATH": "/usr/bin:/bin"})
        self.runners.append(runner)
        self._tasks.append(asyncio.create_task(runner.run()))
        await until(lambda: _ready(runner), lambda ok: ok, "the runner connected")
        return runner

    async def actor(self, actor_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/actors/{actor_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def becomes(self, actor_id: str, what: str, check: Callable[[dict[str, Any]], bool]
                      ) -> dict[str, Any]:  # fmt: skip
        return await until(lambda: self.actor(actor_id), check, what)

    async def close(self) -> None:
        for runner in self.runners:
            runner.drain(0.0)
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), STEP_S)


async def _ready(runner: RunnerCore) -> bool:
    return runner.runner_id is not None


async def until(get: Callable[[], Awaitable[Any]], check: Callable[[Any], bool], what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + STEP_S
    while True:
        value = await get()
        if check(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}; last: {value}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def world(db_url: str, tmp_path: Path) -> AsyncIterator[World]:
    settings = with_token(CoordinatorSettings(db_url=db_url, reconcile_interval_s=0.2))
    app = create_app(settings)
    with live_server(app, ws="websockets-sansio", graceful_shutdown_s=2) as url:
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, headers=auth_headers(), timeout=STEP_S)
            )
            w = World(url, client, tmp_path)
            try:
                yield w
            finally:
                await w.close()


async def message(port: int, text: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=STEP_S) as direct:
        response = await direct.post(f"http://127.0.0.1:{port}/message", content=text)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_an_agent_actor_sleeps_wakes_resumes_its_session_and_is_destroyed(
    world: World,
) -> None:
    runner = await world.runner()
    created = await world.client.post(
        "/actors", json={"name": "agent", "key": "issue-12", "input": "triage"}
    )
    assert created.status_code == 201, created.text
    actor_id = created.json()["actor_id"]
    assert created.json()["state"] in ("starting", "running")
    again = await world.client.post("/actors", json={"name": "agent", "key": "issue-12"})
    assert again.status_code == 200 and again.json()["actor_id"] == actor_id

    running = await world.becomes(actor_id, "running", lambda a: a["state"] == "running")
    assert running["generation"] == 1 and running["runner_id"] == runner.runner_id
    assert running["connectable"] and running["connectable_at"] is not None
    port = runner.actors.port_of(actor_id, 1)
    assert port is not None and runner.actors.port_of(actor_id, 2) is None
    first = await message(port, "hello")
    assert first["reply"] == "turn 1: hello" and first["generation"] == 1
    kv = (await world.client.get(f"/actors/{actor_id}/kv")).json()["entries"]
    assert kv == [{"key": "session_id", "value": first["session_id"]}]

    # Sleep (through the API): stopped, unplaced; the process is gone from the runner.
    slept = await world.client.post(f"/actors/{actor_id}/sleep")
    assert slept.json()["state"] == "sleeping" and not slept.json()["connectable"]
    asleep = await world.becomes(actor_id, "asleep", lambda a: a["runner_id"] is None)
    assert asleep["state"] == "sleeping" and asleep["sleep_at"] is not None
    assert runner.actors.port_of(actor_id, 1) is None and runner.actors.running == 0

    # A request through the gateway wakes it: a new generation, the same KV.
    through = await world.client.get(f"/gateway/{actor_id}/")
    assert through.status_code == 200, through.text
    assert through.json()["generation"] == 2
    assert through.json()["session_id"] == first["session_id"]
    awake = await world.actor(actor_id)
    assert awake["state"] == "running" and awake["generation"] == 2
    port = runner.actors.port_of(actor_id, 2)
    assert port is not None
    second = await message(port, "and again")
    assert second["session_id"] == first["session_id"]
    assert second["reply"] == "turn 2: and again" and second["generation"] == 2

    # Seed 002: its own sleep intent, then a wake before it has stopped: deferred, and
    # it comes back once it has stopped.
    async with httpx.AsyncClient(timeout=STEP_S) as direct:
        assert (await direct.get(f"http://127.0.0.1:{port}/sleep")).status_code == 200
    await world.becomes(actor_id, "marked sleeping", lambda a: a["state"] == "sleeping")
    woken = (await world.client.post(f"/actors/{actor_id}/wake")).json()
    assert woken["will_wake"] or woken["runner_id"] is None or woken["generation"] == 3
    back = await world.becomes(
        actor_id, "deferred wake", lambda a: a["state"] == "running" and a["generation"] == 3
    )
    assert not back["will_wake"]

    # Destroy: stopped, then destroyed with its KV.
    gone = await world.client.delete(f"/actors/{actor_id}")
    assert gone.json()["state"] in ("stopping", "destroyed")
    await world.becomes(actor_id, "destroyed", lambda a: a["state"] == "destroyed")
    assert (await world.client.get(f"/actors/{actor_id}/kv")).json()["entries"] == []
    assert runner.actors.running == 0


async def test_a_draining_runner_sends_its_actor_to_a_second_runner(world: World) -> None:
    first = await world.runner()
    created = await world.client.post(
        "/actors", json={"name": "agent", "key": "thread-9", "crash_policy": "restart"}
    )
    actor_id = created.json()["actor_id"]
    await world.becomes(actor_id, "running", lambda a: a["state"] == "running")
    port = first.actors.port_of(actor_id, 1)
    assert port is not None
    session = (await message(port, "remember me"))["session_id"]

    first.drain()  # ToServerStopping: the coordinator sends GoingAway to its actors
    queued = await world.becomes(actor_id, "queued", lambda a: a["state"] == "pending")
    assert queued["runner_id"] is None and queued["pending_allocation_at"] is not None
    second = await world.runner()
    moved = await world.becomes(actor_id, "moved", lambda a: a["state"] == "running")
    assert moved["runner_id"] == second.runner_id and moved["generation"] == 2
    port = second.actors.port_of(actor_id, 2)
    assert port is not None
    assert (await message(port, "still there?"))["session_id"] == session


async def test_bad_input_gets_clear_codes(world: World) -> None:
    runner = await world.runner()
    post = world.client.post
    assert error_code(await post("/actors", json={"name": "nobody"})) == "unknown_actor_name"
    too_long = await post("/actors", json={"name": "agent", "key": "k" * 1025})
    assert too_long.status_code == 413 and error_code(too_long) == "key_too_long"
    bad_name = await post("/actors", json={"name": "no spaces"})
    assert bad_name.status_code == 422
    bad_policy = await post("/actors", json={"name": "agent", "crash_policy": "explode"})
    assert bad_policy.status_code == 422
    largest = "i" * INPUT_MAX_BYTES
    created = await post("/actors", json={"name": "calls", "input": largest})
    assert created.status_code == 201, created.text[:200]
    big = created.json()["actor_id"]
    await world.becomes(big, "running", lambda a: a["state"] == "running")
    port = runner.actors.port_of(big, 1)
    assert port is not None
    assert (await get(port, "/input"))["input_bytes"] == INPUT_MAX_BYTES  # through a file
    over = await post("/actors", json={"name": "calls", "input": largest + "i"})
    assert over.status_code == 413 and error_code(over) == "input_too_large"
    missing = await world.client.get("/actors/act_nope")
    assert missing.status_code == 404 and error_code(missing) == "actor_not_found"
    assert error_code(await world.client.post("/actors/act_nope/wake")) == "actor_not_found"
    bad_state = await world.client.get("/actors", params={"state": "dancing"})
    assert bad_state.status_code == 422


async def get(port: int, path: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=STEP_S) as direct:
        response = await direct.get(f"http://127.0.0.1:{port}{path}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_the_actor_api_alarm_stop_and_kv_limits_with_real_processes(world: World) -> None:
    runner = await world.runner()
    actor_id = (await world.client.post("/actors", json={"name": "calls"})).json()["actor_id"]
    await world.becomes(actor_id, "running", lambda a: a["state"] == "running")
    port = runner.actors.port_of(actor_id, 1)
    assert port is not None
    # A value over 128 KiB is refused with its code, through the local API and the link.
    assert (await get(port, "/kv/too-big"))["code"] == "payload_too_large"
    assert (await world.client.get(f"/actors/{actor_id}/kv")).json()["entries"] == []
    # An alarm 1 s ahead, then asleep: the alarm wakes it (a new generation).
    await get(port, "/alarm/1")
    asleep = await world.becomes(actor_id, "asleep", lambda a: a["runner_id"] is None)
    assert asleep["state"] == "sleeping" and asleep["alarm_at"] is not None
    woken = await world.becomes(actor_id, "woken by its alarm", lambda a: a["state"] == "running")
    assert woken["generation"] == 2 and woken["alarm_at"] is None
    # Intent Stop, then a clean exit: destroyed.
    port = runner.actors.port_of(actor_id, 2)
    assert port is not None
    await get(port, "/stop")
    await world.becomes(actor_id, "destroyed", lambda a: a["state"] == "destroyed")


async def test_an_idle_actor_sleeps_and_one_that_never_listens_is_stopped(world: World) -> None:
    await world.runner()
    idle = (await world.client.post("/actors", json={"name": "idle"})).json()["actor_id"]
    await world.becomes(idle, "running", lambda a: a["state"] == "running")
    slept = await world.becomes(idle, "asleep when idle", lambda a: a["runner_id"] is None)
    assert slept["state"] == "sleeping"
    deaf = (await world.client.post("/actors", json={"name": "deaf"})).json()["actor_id"]
    # Never accepts on PORT within its start threshold: stopped, a failed start (a crash:
    # the sleep policy lets it sleep), never running.
    failed = await world.becomes(deaf, "a failed start", lambda a: a["runner_id"] is None)
    assert failed["state"] == "sleeping" and failed["connectable_at"] is None


async def test_a_woken_actors_answer_comes_after_its_running_is_stored(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race widened: the store applies a runner's "running" report half a second late
    (the gateway sends a request to an actor still starting, and its runner holds it until
    the actor accepts). The actor's answer still reaches the caller only after that report is
    stored: the API then shows the generation that answered, running."""
    runner = await world.runner()
    actor_id = (await world.client.post("/actors", json={"name": "calls"})).json()["actor_id"]
    await world.becomes(actor_id, "running", lambda a: a["state"] == "running")
    assert (await world.client.post(f"/actors/{actor_id}/sleep")).status_code == 200
    await world.becomes(actor_id, "asleep", lambda a: a["runner_id"] is None)

    late: list[float] = []
    apply = LinkCore.apply

    def apply_late(core: LinkCore, runner_id: Any, last: int, events: Any, now: float) -> Any:
        if any(getattr(e, "type", None) == "actor_state" and e.state == "running" for e in events):
            late.append(now)
            time.sleep(0.5)  # in the writer's thread: every write waits, as on a slow disk
        return apply(core, runner_id, last, events, now)

    monkeypatch.setattr(LinkCore, "apply", apply_late)
    through = await world.client.get(f"/gateway/{actor_id}/")
    assert through.status_code == 200, through.text
    assert through.json()["generation"] == 2
    shown = await world.actor(actor_id)
    assert (shown["state"], shown["generation"], shown["runner_id"]) == (
        "running", 2, runner.runner_id
    )  # fmt: skip
    assert late  # the report did go through the slowed apply
