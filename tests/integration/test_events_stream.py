"""``GET /events`` served by a real uvicorn (responses must really stream), on SQLite and
PostgreSQL: a run's life arrives live and in order; a reconnect and a coordinator restart
resume without a gap or a duplicate; a slow stream is dropped with a clear message and
resumes; bad resumes and filters naming nothing are refused and change nothing."""

from __future__ import annotations

import contextlib
import json
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from api_fixtures import HEADERS, Api, live_server, with_token
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse

from corral.actors.model import NewActor
from corral.coordinator.app import CorralServer, create_app
from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio
STEP_S = 10.0  # the bound on any one expected message (correctness, not speed)


@contextlib.asynccontextmanager
async def served(settings: CoordinatorSettings) -> AsyncIterator[Api]:
    app = create_app(with_token(settings), reconcile=False)
    with live_server(app) as url:
        async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=STEP_S) as client:
            yield Api(app, client)


class Stream:
    """One open ``GET /events``: its messages one at a time, each within ``STEP_S``."""

    def __init__(self, messages: AsyncIterator[ServerSentEvent]) -> None:
        self._messages = messages
        self.last_id = 0

    async def next(self) -> ServerSentEvent:
        with anyio.fail_after(STEP_S):
            message = await anext(self._messages)
        if message.id:
            self.last_id = int(message.id)
        return message

    async def events(self, count: int) -> list[dict[str, Any]]:
        found = []
        while len(found) < count:
            message = await self.next()
            assert message.event not in ("dropped",), message.data
            if message.event not in ("ready", "caught_up"):
                found.append(json.loads(message.data))
        return found


@contextlib.asynccontextmanager
async def stream(api: Api, **params: Any) -> AsyncIterator[Stream]:
    headers = {}
    if "last_event_id" in params:
        headers["Last-Event-ID"] = str(params.pop("last_event_id"))
    async with aconnect_sse(api.client, "GET", "/events", params=params, headers=headers) as source:
        assert source.response.status_code == 200, await source.response.aread()
        opened = Stream(source.aiter_sse())
        ready = await opened.next()
        assert ready.event == "ready"
        yield opened


async def a_run_to_the_end(api: Api, runner_id: str, *lines: str) -> str:
    run_id = await api.create_command()
    run = await api.claim_one(runner_id)
    assert run["run_id"] == run_id
    await api.started(run_id, runner_id)
    if lines:
        await api.log(run_id, runner_id, 1, *lines)
    assert (await api.complete(run_id, runner_id, exit_code=0)).status_code == 200
    return run_id


async def test_a_runs_life_arrives_live_and_in_order(db_url: str) -> None:
    async with served(CoordinatorSettings(db_url=db_url)) as api:
        runner_id = await api.register()
        async with stream(api, kind="run,log") as events:
            run_id = await a_run_to_the_end(api, runner_id, "hello", "world")
            got = await events.events(6)
        assert [(e["kind"], e["data"].get("status", e["data"].get("text"))) for e in got] == [
            ("run", "pending"),
            ("run", "claimed"),
            ("run", "running"),
            ("log", "hello"),
            ("log", "world"),
            ("run", "completed"),
        ]
        assert {e["run_id"] for e in got} == {run_id}
        assert [e["id"] for e in got] == sorted(e["id"] for e in got)
        assert got[1]["runner_id"] == runner_id


async def test_a_reconnect_resumes_without_a_gap_or_a_duplicate(db_url: str) -> None:
    async with served(CoordinatorSettings(db_url=db_url)) as api:
        runner_id = await api.register()
        async with stream(api, kind="run") as events:
            await a_run_to_the_end(api, runner_id)
            first = await events.events(2)  # pending, claimed: the rest is not read
        resume_at = first[-1]["id"]
        await a_run_to_the_end(api, runner_id)  # while nobody listens
        for how in ({"last_event_id": resume_at}, {"after": resume_at}):
            async with stream(api, kind="run", **how) as resumed:
                rest = await resumed.events(6)
                assert [e["data"]["status"] for e in rest] == [
                    "running",
                    "completed",
                    "pending",
                    "claimed",
                    "running",
                    "completed",
                ]
                assert rest[0]["id"] > resume_at
                assert len({e["id"] for e in first + rest}) == 8


async def test_a_restarted_coordinator_resumes_where_the_stream_was(db_url: str) -> None:
    settings = CoordinatorSettings(db_url=db_url)
    async with served(settings) as api:
        runner_id = await api.register()
        async with stream(api, kind="run") as events:
            await a_run_to_the_end(api, runner_id)
            seen = await events.events(4)
    async with served(settings) as again:  # a new coordinator process on the same database
        await a_run_to_the_end(again, runner_id)
        async with stream(again, kind="run", last_event_id=seen[-1]["id"]) as resumed:
            rest = await resumed.events(4)
    assert [e["data"]["status"] for e in seen + rest] == [
        "pending",
        "claimed",
        "running",
        "completed",
    ] * 2
    assert rest[0]["id"] > seen[-1]["id"]


async def test_a_slow_stream_is_dropped_with_its_position_and_resumes(db_url: str) -> None:
    async with served(CoordinatorSettings(db_url=db_url, event_queue_size=5)) as api:
        runner_id = await api.register()
        run_id = await api.create_command()
        await api.claim_one(runner_id)
        await api.started(run_id, runner_id)
        lines = [f"line {i}" for i in range(20)]
        async with stream(api, kind="log") as events:
            assert (await events.next()).event == "caught_up"
            await api.log(run_id, runner_id, 1, *lines)  # one batch of 20: over 5 behind
            dropped = await events.next()
        assert dropped.event == "dropped"
        body = json.loads(dropped.data)
        assert body["reason"] == "slow_consumer" and "resume" in body["message"]
        async with stream(api, kind="log", after=body["last_event_id"]) as resumed:
            assert [e["data"]["text"] for e in await resumed.events(20)] == lines
        metrics = (await api.client.get("/metrics")).text
        assert "corral_event_subscribers 0.0" in metrics


async def test_actors_and_pools_changes_arrive_filtered_by_actor_or_pool(db_url: str) -> None:
    async with served(CoordinatorSettings(db_url=db_url)) as api:
        store = api.app.state.coordinator.store
        async with stream(api, kind="actor,pool") as events:
            put = await api.client.put("/pools/sl", json={"serverless": {"url": "http://x"}})
            assert put.status_code == 200
            # Written by another hand than the coordinator's: found by the stream all the same.
            actor, _, _ = await anyio.to_thread.run_sync(
                store.actors.create, NewActor("echo", "k", pool="sl"), 1.0
            )
            got = await events.events(2)
        assert [(e["kind"], e["actor_id"], e["pool"]) for e in got] == [
            ("pool", None, "sl"),
            ("actor", actor.id, "sl"),
        ]
        assert got[0]["data"]["serverless"]["url"] == "http://x"
        assert got[1]["data"]["state"] == "pending" and got[1]["data"]["placed"] == 0
        async with stream(api, actor=actor.id, after=0) as mine:
            (only,) = await mine.events(1)
            assert only["id"] == got[1]["id"]
            assert (await mine.next()).event == "caught_up"


async def stopped_while_following(
    tmp_path: Path, follow: Callable[[httpx.Client, threading.Event], str]
) -> list[str]:
    """How ``follow`` ended (what it returned, or the error that cut it), its coordinator
    stopped (a 60 s grace, longer than live_server waits) once it set its event."""
    app = create_app(with_token(CoordinatorSettings(db_url=f"sqlite:///{tmp_path}/c.db")))
    following = threading.Event()
    outcome: list[str] = []

    def reader(url: str) -> None:
        try:
            with httpx.Client(base_url=url, headers=HEADERS, timeout=STEP_S) as client:
                outcome.append(follow(client, following))
        except httpx.HTTPError as exc:
            outcome.append(f"cut: {exc!r}")

    with live_server(app, server_class=CorralServer, graceful_shutdown_s=60) as url:
        thread = threading.Thread(target=reader, args=(url,))
        thread.start()
        assert await anyio.to_thread.run_sync(following.wait, STEP_S)
    await anyio.to_thread.run_sync(thread.join, STEP_S)
    return outcome


async def test_a_stopping_coordinator_ends_its_open_streams_cleanly_at_once(
    tmp_path: Path,
) -> None:
    """Without ``end_streams`` uvicorn waits out its grace (here longer than live_server
    waits for it to stop) and then cuts the stream mid-response."""

    def follow(client: httpx.Client, caught_up: threading.Event) -> str:
        with connect_sse(client, "GET", "/events") as source:
            for message in source.iter_sse():
                if message.event == "caught_up":
                    caught_up.set()
        return "ended cleanly"

    assert await stopped_while_following(tmp_path, follow) == ["ended cleanly"]


async def test_a_stopping_coordinator_ends_its_log_follows_cleanly_at_once(
    tmp_path: Path,
) -> None:
    """A followed log of a run that has not ended: the stream ends cleanly after its lines,
    without the run (its client goes on elsewhere after its last line); without
    ``end_streams`` uvicorn waits out its grace and then cuts it."""

    def follow(client: httpx.Client, following: threading.Event) -> str:
        run = client.post("/runs", json={"type": "command", "command": ["true"]}).json()
        path = f"/runs/{run['run_id']}/logs"
        with client.stream("GET", path, params={"follow": "true"}) as response:
            following.set()
            received = list(response.iter_lines())
        return f"ended cleanly after {received}"

    assert await stopped_while_following(tmp_path, follow) == ["ended cleanly after []"]


async def test_a_deflated_stream_carries_what_a_plain_one_does_and_ends_whole(
    tmp_path: Path,
) -> None:
    """A client that accepts deflate (httpx and browsers do) gets the stream compressed: its
    raw bytes, ended by a stopping coordinator, are one zlib stream whose trailer zlib
    checks, holding the same events as a plain stream's."""
    app = create_app(with_token(CoordinatorSettings(db_url=f"sqlite:///{tmp_path}/c.db")))
    raw: dict[str, bytes] = {"deflate": b"", "identity": b""}
    headers: dict[str, httpx.Headers] = {}
    caught_up = {name: threading.Event() for name in raw}
    runs_seen = {name: threading.Event() for name in raw}

    def follow(url: str, encoding: str) -> None:
        reader = zlib.decompressobj()
        plain = b""
        with (
            httpx.Client(base_url=url, headers=HEADERS, timeout=STEP_S) as client,
            client.stream("GET", "/events", headers={"Accept-Encoding": encoding}) as response,
        ):
            headers[encoding] = response.headers
            for chunk in response.iter_raw():
                raw[encoding] += chunk
                plain += reader.decompress(chunk) if encoding == "deflate" else chunk
                if b"event: caught_up" in plain:
                    caught_up[encoding].set()
                if plain.count(b"event: run\n") == 3:
                    runs_seen[encoding].set()

    with live_server(app, server_class=CorralServer, graceful_shutdown_s=60) as url:
        readers = [threading.Thread(target=follow, args=(url, name)) for name in raw]
        for reader in readers:
            reader.start()
        for ready in caught_up.values():
            assert await anyio.to_thread.run_sync(ready.wait, STEP_S)
        async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=STEP_S) as client:
            for _ in range(3):
                body = {"type": "command", "command": ["true"]}
                assert (await client.post("/runs", json=body)).status_code == 201
        for seen in runs_seen.values():
            assert await anyio.to_thread.run_sync(seen.wait, STEP_S)
    for reader in readers:
        await anyio.to_thread.run_sync(reader.join, STEP_S)
    assert headers["deflate"]["content-encoding"] == "deflate"
    assert "content-encoding" not in headers["identity"]
    assert headers["deflate"]["vary"] == "Accept-Encoding"
    decoded = zlib.decompress(raw["deflate"])  # a wrong trailer or a cut stream raises

    def events(body: bytes) -> list[bytes]:
        return [m for m in body.split(b"\n\n") if b"event: run\n" in m]

    assert len(events(decoded)) == 3 and events(decoded) == events(raw["identity"])
    assert len(raw["deflate"]) < len(raw["identity"])


async def test_an_open_stream_is_a_subscriber_in_the_metrics(db_url: str) -> None:
    async with served(CoordinatorSettings(db_url=db_url)) as api, stream(api):
        metrics = (await api.client.get("/metrics")).text
        assert "corral_event_subscribers 1.0" in metrics


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"kind": "run,bogus"}, 422, "invalid_request"),
        ({"run_id": "run_000000000000"}, 404, "run_not_found"),
        ({"runner": "rnr_000000000000"}, 404, "runner_not_found"),
        ({"plan": "prj_000000000000"}, 404, "project_not_found"),
        ({"session": "nobody"}, 404, "session_not_found"),
        ({"actor": "act_000000000000"}, 404, "actor_not_found"),
        ({"after": 10_000}, 422, "unknown_event_id"),
        ({"after": -1}, 422, "invalid_request"),
        ({"last_event_id": "12abc"}, 422, "invalid_request"),
        ({"last_event_id": "999999"}, 422, "unknown_event_id"),
    ],
)
async def test_bad_filters_and_resumes_are_refused_and_change_nothing(
    db_url: str, params: dict[str, Any], status: int, code: str
) -> None:
    async with served(CoordinatorSettings(db_url=db_url)) as api:
        runner_id = await api.register()
        await a_run_to_the_end(api, runner_id)
        before = api.snapshot()
        query = dict(params)  # the parameter's dict is shared by both backends' runs
        headers = {}
        if "last_event_id" in query:
            headers["Last-Event-ID"] = query.pop("last_event_id")
        response = await api.client.get("/events", params=query, headers=headers)
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
        assert api.snapshot() == before


async def test_a_resume_from_events_retention_deleted_is_gone(db_url: str) -> None:
    settings = CoordinatorSettings(db_url=db_url)
    async with served(settings) as api:
        runner_id = await api.register()
        await a_run_to_the_end(api, runner_id)
        hub = api.coordinator.events
        hub.events.number()
        newest = hub.events.latest()
        assert hub.events.collect(cutoff=float("inf"), batch=100) > 0
        response = await api.client.get("/events", params={"after": 1})
        assert response.status_code == 410, response.text
        assert response.json()["error"]["code"] == "events_expired"
        # From the newest deleted on, the stream goes on.
        async with stream(api, after=newest) as events:
            await a_run_to_the_end(api, runner_id)
            assert (await events.events(1))[0]["id"] > newest
