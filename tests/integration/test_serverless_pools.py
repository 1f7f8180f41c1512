"""Serverless pools over real sockets: the API (PUT and GET /pools/{name}, GET /pools, bad
input), the
coordinator's autoscaler opening GET /start on a real endpoint that runs a runner for the
life of the stream, scaling up with the actors a pool wants and down to nothing, and the
errors a pool shows (refused, a bad first event, a stream that ends early); the demand the
autoscaler acts on is kept and is a pool event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fixtures import TOKEN, Api, error_code, live_server, running_api, wait_until, with_token
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse

from corral.actors.model import NewActor
from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.events import EventFilter
from corral.runner.serverless import ServerlessEndpoint
from corral.runner.settings import RunnerSettings
from corral.store import Store
from corral.store.events import EventStore

pytestmark = pytest.mark.anyio
STEP_S = 20.0


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Api]:
    async with running_api(CoordinatorSettings(db_url=db_url)) as found:
        yield found


async def test_a_pool_is_put_and_shown_with_its_demand(api: Api) -> None:
    body = {"serverless": {"url": "http://127.0.0.1:9/", "min_runners": 0, "margin": 2}}
    put = await api.client.put("/pools/sl", json=body)
    assert put.status_code == 200, put.text
    pool = (await api.client.get("/pools/sl")).json()
    assert pool["serverless"] == {
        "url": "http://127.0.0.1:9",
        "headers": {},
        "request_lifespan": 300.0,
        "slots_per_runner": 1,
        "min_runners": 0,
        "max_runners": 10,
        "margin": 2,
    }
    assert (pool["wanted_slots"], pool["desired_runners"], pool["errors"]) == (0, 2, [])
    plain = await api.client.put("/pools/sl", json={"serverless": None})
    assert plain.json()["serverless"] is None and plain.json()["desired_runners"] is None
    assert (await api.client.put("/pools/a-first", json={})).status_code == 200
    listed = (await api.client.get("/pools")).json()["pools"]
    assert [(p["name"], p["serverless"]) for p in listed] == [("a-first", None), ("sl", None)]
    assert listed[1] == (await api.client.get("/pools/sl")).json()


@pytest.mark.parametrize(
    "body",
    [
        {"serverless": {"url": "ftp://x/"}},
        {"serverless": {"url": "http://x", "min_runners": 3, "max_runners": 2}},
        {"serverless": {"url": "http://x", "slots_per_runner": 0}},
        {"serverless": {"url": "http://x", "request_lifespan": -1}},
        {"serverless": {"url": "http://x", "surprise": 1}},
    ],
)
async def test_bad_pools_are_refused(api: Api, body: dict[str, Any]) -> None:
    response = await api.client.put("/pools/sl", json=body)
    assert (response.status_code, error_code(response)) == (422, "invalid_request")
    missing = await api.client.get("/pools/sl")
    assert (missing.status_code, error_code(missing)) == (404, "pool_not_found")


# ---- the autoscaler and a real endpoint ----------------------------------------------------


@pytest.fixture
def endpoint() -> Iterator[tuple[ServerlessEndpoint, str]]:
    found = ServerlessEndpoint(RunnerSettings(), drain_grace_s=1.0, ping_interval_s=0.5)
    with live_server(found.app()) as url:  # type: ignore[arg-type]
        yield found, url


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[FastAPI, str]]:
    settings = with_token(
        CoordinatorSettings(
            db_url=f"sqlite:///{tmp_path}/c.db",
            poll_timeout_s=5.0,
            autoscale_interval_s=0.1,
            ws_lost_after_s=3.0,
        )
    )
    app = create_app(settings)
    with live_server(app, ws="websockets-sansio", graceful_shutdown_s=2) as url:
        app.state.coordinator.settings = CoordinatorSettings(
            **{**settings.__dict__, "public_url": url}
        )
        yield app, url


def client(url: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=STEP_S)


async def pool_runners(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    runners: list[dict[str, Any]] = (await http.get("/pools/sl")).json()["runners"]
    return runners


async def test_the_autoscaler_runs_what_the_actors_want_and_scales_down(
    coordinator: tuple[FastAPI, str], endpoint: tuple[ServerlessEndpoint, str]
) -> None:
    app, url = coordinator
    served, endpoint_url = endpoint
    store: Store = app.state.coordinator.store
    async with client(url) as http:
        body = {"serverless": {"url": endpoint_url, "max_runners": 3}}
        assert (await http.put("/pools/sl", json=body)).status_code == 200
        assert (await http.get("/pools/sl")).json()["desired_runners"] == 0
        # An actor wants a slot in the pool (no runner hosts it: it is queued) → desired 1.
        store.actors.create(NewActor(name="echo", key="a", pool="sl"), 0.0)
        pool = (await http.get("/pools/sl")).json()
        assert (pool["wanted_slots"], pool["desired_runners"]) == (1, 1)
        started: list[dict[str, Any]] = []

        async def one_started() -> bool:
            started[:] = [r for r in await pool_runners(http) if r["runner_id"]]
            return len(started) == 1

        await wait_async(one_started, "the endpoint's runner")
        runner_id = started[0]["runner_id"]
        listed = (await http.get("/runners")).json()
        mine = [r for r in listed["runners"] if r["runner_id"] == runner_id]
        assert mine and mine[0]["state"] == "active" and mine[0]["name"] == "sl-serverless"
        assert len(served.runners) == 1
        # Nothing wanted any more (the pool made plain: no endpoint): the stream is closed,
        # the runner drains and leaves.
        assert (await http.put("/pools/sl", json={"serverless": None})).status_code == 200
        await wait_until(lambda: not served.runners, timeout=STEP_S, what="the runner to leave")

        async def stopped() -> bool:
            listed = (await http.get("/runners")).json()["runners"]
            return [r["state"] for r in listed if r["runner_id"] == runner_id] == ["stopped"]

        await wait_async(stopped, "the runner stopped")
        assert (await http.get("/pools/sl")).json()["errors"] == []
    # What the autoscaler wanted, each change once, as the pool's events. Its first look
    # at the pool may come after the actor was created: then it never saw (0, 0).
    events = EventStore(store.db)
    demands = [
        (e.data["wanted_slots"], e.data["desired_runners"])
        for e in events.read(0, EventFilter.parse(kind="pool", pool="sl"), limit=100)
        if e.data.get("serverless") is not None
    ]
    assert demands in ([(None, None), (0, 0), (1, 1)], [(None, None), (1, 1)])


def broken_endpoint() -> FastAPI:
    app = FastAPI()

    @app.get("/refuses/start")
    async def refuses() -> PlainTextResponse:
        return PlainTextResponse("no capacity", status_code=503)

    @app.get("/garbage/start")
    async def garbage() -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            yield "event: started\ndata: not json\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/short/start")
    async def short() -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            yield 'event: started\ndata: {"runner_id": "rnr_000000000009"}\n\n'

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.mark.parametrize(
    ("path", "kind", "says"),
    [
        ("refuses", "http_error", "HTTP 503: no capacity"),
        ("garbage", "bad_payload", "not json"),
        ("short", "stream_ended_early", "ended after"),
    ],
)
async def test_a_pools_endpoint_errors_are_shown(
    coordinator: tuple[FastAPI, str], path: str, kind: str, says: str
) -> None:
    _, url = coordinator
    with live_server(broken_endpoint()) as broken:
        async with client(url) as http:
            body = {"serverless": {"url": f"{broken}/{path}", "min_runners": 1}}
            assert (await http.put("/pools/sl", json=body)).status_code == 200

            async def errored() -> bool:
                return bool((await http.get("/pools/sl")).json()["errors"])

            await wait_async(errored, "an error")
            error = (await http.get("/pools/sl")).json()["errors"][0]
            assert error["kind"] == kind and says in error["message"]
            assert (await http.put("/pools/sl", json={"serverless": None})).status_code == 200


async def wait_async(check: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + STEP_S
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_runner_drains_before_its_lifespan_ends_and_another_takes_its_place(
    coordinator: tuple[FastAPI, str], endpoint: tuple[ServerlessEndpoint, str]
) -> None:
    _, url = coordinator
    _, endpoint_url = endpoint  # its runners drain a grace (1 s) before their lifespan ends
    async with client(url) as http:
        body = {"serverless": {"url": endpoint_url, "min_runners": 1, "request_lifespan": 2.5}}
        assert (await http.put("/pools/sl", json=body)).status_code == 200
        seen: list[str] = []

        async def two_runners() -> bool:
            for runner in await pool_runners(http):
                if runner["runner_id"] and runner["runner_id"] not in seen:
                    seen.append(runner["runner_id"])
            return len(seen) == 2

        await wait_async(two_runners, "a second runner after the first one's lifespan")

        async def first_stopped() -> bool:
            listed = (await http.get("/runners")).json()["runners"]
            return [r["state"] for r in listed if r["runner_id"] == seen[0]] == ["stopped"]

        await wait_async(first_stopped, "the first runner to leave")
        assert (await http.get("/pools/sl")).json()["errors"] == []  # its end was expected
        assert (await http.put("/pools/sl", json={"serverless": None})).status_code == 200
