"""The coordinator's REST API end to end, in process, on SQLite and PostgreSQL.

Runs are created by clients, claimed by runners over the long-poll protocol, reported,
listed, followed and cancelled; sessions are started, then resumed on the runner that
holds them. Waits are on conditions (a waiter registered, a claim attempted), never sleeps.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from api_fixtures import (
    HEADERS,
    RUN_ID,
    Api,
    error_code,
    live_server,
    running_api,
    wait_until,
    with_token,
)
from fastapi import FastAPI

from corral.coordinator.app import create_app
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic
from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio

# A correctness bound for "answers at once" (the waits themselves are 20 s), not a benchmark.
AT_ONCE_S = 2.0
LONG_WAIT_S = 20.0


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url, poll_timeout_s=5.0)


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "corral.toml"
    path.write_text(text)
    return path


def ts(value: str | None) -> datetime:
    assert value is not None
    return datetime.fromisoformat(value)


# ---- creating and reading runs ---------------------------------------------------------------


async def test_create_run_answers_201_with_a_pending_run_id(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        response = await api.client.post("/runs", json={"type": "command", "command": ["true"]})
        assert response.status_code == 201
        body = response.json()
        assert set(body) == {"run_id", "status"}
        assert re.fullmatch(RUN_ID, body["run_id"])
        assert body["status"] == "pending"

        run = await api.run(body["run_id"])
        assert run["run_id"] == body["run_id"]
        assert run["status"] == "pending"
        assert run["type"] == "command"
        assert run["command"] == ["true"]
        assert run["attempts"] == 0
        assert run["runner_id"] is None
        for unset in ("exit_code", "error", "session_id", "cost_usd", "result"):
            assert run[unset] is None, unset
        assert run["created_at"] is not None
        assert run["claimed_at"] is run["started_at"] is run["finished_at"] is None


async def test_a_run_through_the_runner_protocol(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        run_id = await api.create_command("echo", "hi", labels=["gpu"], env={"A": "1"})
        runner_id = await api.register("runner-a", labels=["gpu", "linux"], slots=2)

        response = await api.poll(runner_id, max_runs=2, timeout=0)
        assert response.status_code == 200
        (assignment,) = response.json()["runs"]
        assert assignment["run_id"] == run_id
        assert assignment["status"] == "claimed"
        assert assignment["runner_id"] == runner_id
        assert assignment["attempts"] == 1
        assert assignment["command"] == ["echo", "hi"]
        assert assignment["env"] == {"A": "1"}
        assert assignment["agent"] is None
        assert assignment["required_runner"] is None

        await api.started(run_id, runner_id, 1)
        running = await api.run(run_id)
        assert running["status"] == "running"
        assert running["started_at"] is not None

        await api.log(run_id, runner_id, 1, "hello", "world")
        response = await api.complete(run_id, runner_id, 1, exit_code=0)
        assert response.status_code == 200, response.text
        assert response.json() == {"ok": True, "status": "completed"}

        run = await api.run(run_id)
        assert run["status"] == "completed"
        assert run["runner_id"] == runner_id
        assert run["attempts"] == 1
        assert run["exit_code"] == 0
        assert run["error"] is None
        assert run["session_id"] is None
        assert run["cost_usd"] is None
        assert (
            ts(run["created_at"])
            <= ts(run["claimed_at"])
            <= ts(run["started_at"])
            <= ts(run["finished_at"])
        )

        logs = (await api.client.get(f"/runs/{run_id}/logs")).json()
        assert [(ln["line_no"], ln["stream"], ln["text"]) for ln in logs["lines"]] == [
            (0, "stdout", "hello"),
            (1, "stdout", "world"),
        ]
        assert all(ln["attempt"] == 1 for ln in logs["lines"])
        assert logs["next_after"] == logs["lines"][-1]["id"]
        rest = (
            await api.client.get(f"/runs/{run_id}/logs", params={"after": logs["next_after"]})
        ).json()
        assert rest == {"lines": [], "next_after": logs["next_after"]}

        # A repeated report (its first answer lost on the way) is accepted and changes nothing.
        again = await api.complete(run_id, runner_id, 1, exit_code=0)
        assert again.status_code == 200
        assert (await api.run(run_id)) == run


async def test_list_runs_filters_and_pages(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        alpha = [await api.create_command(session_name="alpha") for _ in range(2)]
        others = [await api.create_command() for _ in range(3)]
        runner_id = await api.register()
        claimed = {r["run_id"] for r in await api.claim(runner_id, max_runs=2)}
        assert len(claimed) == 2

        async def listed(**params: Any) -> list[str]:
            response = await api.client.get("/runs", params=params)
            assert response.status_code == 200, response.text
            return [r["run_id"] for r in response.json()["runs"]]

        everything = await listed()
        assert set(everything) == set(alpha + others)
        assert set(await listed(status="claimed")) == claimed
        assert set(await listed(status="pending")) == set(alpha + others) - claimed
        assert set(await listed(status="pending,claimed")) == set(everything)
        assert await listed(status="completed") == []
        assert set(await listed(session="alpha")) == set(alpha)
        assert set(await listed(runner_id=runner_id)) == claimed

        # Pages of two, following 'next' as 'before', give every run once, newest first.
        pages: list[list[str]] = []
        params: dict[str, Any] = {"limit": 2}
        while True:
            body = (await api.client.get("/runs", params=params)).json()
            pages.append([r["run_id"] for r in body["runs"]])
            if body["next"] is None:
                break
            assert body["next"] == body["runs"][-1]["run_id"]
            params = {"limit": 2, "before": body["next"]}
        assert [len(p) for p in pages] == [2, 2, 1]
        assert [run_id for page in pages for run_id in page] == everything

        runs = (await api.client.get("/runs")).json()["runs"]
        keys = [(ts(r["created_at"]), r["run_id"]) for r in runs]
        assert keys == sorted(keys, reverse=True)


async def test_batch_creates_every_run(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        response = await api.client.post(
            "/runs:batch",
            json={
                "runs": [
                    {"type": "command", "command": ["echo", "1"]},
                    {"type": "command", "command": ["echo", "2"], "priority": 5},
                    {"type": "start_session", "prompt": "hi", "session_name": "b"},
                ]
            },
        )
        assert response.status_code == 201, response.text
        created = response.json()["runs"]
        assert len(created) == 3
        assert all(re.fullmatch(RUN_ID, r["run_id"]) for r in created)
        assert {r["status"] for r in created} == {"pending"}
        assert len({r["run_id"] for r in created}) == 3

        listed = (await api.client.get("/runs")).json()["runs"]
        assert {r["run_id"] for r in listed} == {r["run_id"] for r in created}

        # The higher priority run is claimed first.
        runner_id = await api.register()
        assert (await api.claim_one(runner_id))["run_id"] == created[1]["run_id"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/runs", {"type": "command", "command": ["true"]}),  # the plain ASGI route
        ("/runs:batch", {"runs": [{"type": "command", "command": ["true"]}] * 2}),
    ],
)
async def test_a_create_sent_again_with_its_key_gets_the_same_runs(
    settings: CoordinatorSettings, path: str, body: dict[str, Any]
) -> None:
    """``Idempotency-Key``: the request sent again (its answer lost) gets the runs it
    created; with other runs, the key is refused; a key no header can be, refused too."""
    async with running_api(settings) as api:
        key = {"Idempotency-Key": "create-1"}
        first = await api.client.post(path, json=body, headers=key)
        again = await api.client.post(path, json=body, headers=key)
        assert first.status_code == again.status_code == 201
        assert again.json() == first.json()
        assert len((await api.client.get("/runs")).json()["runs"]) == len(body.get("runs", [1]))

        other = {**body, "priority": 3} if path == "/runs" else {"runs": body["runs"][:1]}
        reused = await api.client.post(path, json=other, headers=key)
        assert reused.status_code == 422 and error_code(reused) == "idempotency_key_reused"
        too_long = {"Idempotency-Key": "k" * 256}
        refused = await api.client.post(path, json=body, headers=too_long)
        assert refused.status_code == 422 and error_code(refused) == "invalid_idempotency_key"
        fresh = await api.client.post(path, json=body, headers={"Idempotency-Key": "create-2"})
        assert fresh.json() != first.json()  # another key, other runs


# ---- long-polls ------------------------------------------------------------------------------


async def test_long_poll_answers_204_after_its_timeout(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        runner_id = await api.register()
        started = time.monotonic()
        response = await api.poll(runner_id, timeout=0.3)
        elapsed = time.monotonic() - started
        assert response.status_code == 204
        assert response.content == b""
        assert elapsed >= 0.25

        control = await api.client.get(
            "/runner/control", params={"runner_id": runner_id, "timeout": 0.1}
        )
        assert control.status_code == 204


async def test_waiting_long_poll_returns_at_once_when_a_run_is_created(
    settings: CoordinatorSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_api(settings) as api:
        runner_id = await api.register()
        store = api.coordinator.store
        claimable = store.runs.claimable
        empty_reads = 0

        def counting_read(*args: Any, **kwargs: Any) -> Any:
            nonlocal empty_reads
            found = claimable(*args, **kwargs)
            if not found:
                empty_reads += 1
            return found

        monkeypatch.setattr(store.runs, "claimable", counting_read)

        result: dict[str, Any] = {}

        async def poll() -> None:
            result["response"] = await api.poll(runner_id, timeout=LONG_WAIT_S)
            result["done_at"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            # The poller found nothing claimable and holds the wake-up event: it waits now.
            await wait_until(
                lambda: empty_reads >= 1 and RUNS_AVAILABLE in api.coordinator.notifier._events,
                what="the long-poll to wait",
            )
            assert "response" not in result
            created_at = time.monotonic()
            run_id = await api.create_command()
            with anyio.fail_after(LONG_WAIT_S / 2):
                await wait_until(lambda: "response" in result, timeout=LONG_WAIT_S / 2)

        assert result["done_at"] - created_at < AT_ONCE_S
        response = result["response"]
        assert response.status_code == 200
        assert [r["run_id"] for r in response.json()["runs"]] == [run_id]


async def test_control_long_poll_gets_a_cancel_at_once(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        run_id = await api.create_command("sleep", "100")
        runner_id = await api.register()
        await api.claim_one(runner_id)
        await api.started(run_id, runner_id)

        result: dict[str, Any] = {}

        async def control() -> None:
            result["response"] = await api.client.get(
                "/runner/control", params={"runner_id": runner_id, "timeout": LONG_WAIT_S}
            )
            result["done_at"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(control)
            topic = runner_topic(runner_id)
            await wait_until(
                lambda: topic in api.coordinator.notifier._events,
                what="the control long-poll to wait",
            )
            cancelled_at = time.monotonic()
            response = await api.client.post(f"/runs/{run_id}/cancel")
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "running"  # its runner has to stop it
            assert response.json()["cancel_requested"] is True
            await wait_until(lambda: "response" in result, timeout=LONG_WAIT_S / 2)

        assert result["done_at"] - cancelled_at < AT_ONCE_S
        assert result["response"].status_code == 200
        command = {"idx": 1, "body": {"type": "cancel_run", "run_id": run_id}}
        assert result["response"].json() == {"commands": [command]}

        # A stored command: told again until the runner says it handled it (``after``).
        again = await api.client.get("/runner/control", params={"runner_id": runner_id})
        assert again.json() == {"commands": [command]}
        handled = await api.client.get(
            "/runner/control", params={"runner_id": runner_id, "after": 1, "timeout": 0}
        )
        assert handled.status_code == 204
        assert (
            await api.coordinator.in_thread(
                api.coordinator.store.commands.unacknowledged, runner_id, 0
            )
            == []
        )
        # Not a second path: a heartbeat says nothing of it.
        beat = await api.heartbeat(runner_id, [{"run_id": run_id, "attempt": 1}])
        assert beat.json() == {"abandon": []}
        # The runner's failure report then shows as cancelled.
        response = await api.fail(run_id, runner_id, 1, exit_code=-15, error="SIGTERM")
        assert response.status_code == 200, response.text
        assert (await api.run(run_id))["status"] == "cancelled"


async def test_cancel_of_a_pending_run_cancels_it(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        run_id = await api.create_command()
        response = await api.client.post(f"/runs/{run_id}/cancel")
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "cancelled"
        run = await api.run(run_id)
        assert run["status"] == "cancelled"
        assert run["finished_at"] is not None
        runner_id = await api.register()
        assert await api.claim(runner_id) == []


# ---- following logs --------------------------------------------------------------------------


def test_follow_streams_log_lines_and_ends_with_the_run(db_url: str) -> None:
    # ASGITransport buffers a whole response, so this one needs a real server. A follower
    # that missed a wake-up would only look again after poll_timeout_s: make that long.
    app = create_app(with_token(CoordinatorSettings(db_url=db_url, poll_timeout_s=LONG_WAIT_S)))
    with live_server(app) as url:
        anyio.run(_follow_scenario, app, url, backend="asyncio")


async def _follow_scenario(app: FastAPI, url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=HEADERS) as client:
        api = Api(app, client)
        run_id = await api.create_command()
        runner_id = await api.register()
        await api.claim_one(runner_id)
        await api.started(run_id, runner_id)
        await api.log(run_id, runner_id, 1, "one")

        params = {"follow": "true"}
        async with client.stream("GET", f"/runs/{run_id}/logs", params=params) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            lines = response.aiter_lines()
            with anyio.fail_after(AT_ONCE_S * 2):
                first = json.loads(await anext(lines))
                assert first["event"] == "line"
                assert first["text"] == "one"

                # The run is still running: this line arrives through the open stream.
                await api.log(run_id, runner_id, 1, "two", first_line=1)
                second = json.loads(await anext(lines))
                assert (second["event"], second["text"], second["line_no"]) == ("line", "two", 1)
                assert second["id"] > first["id"]

                response_done = await api.complete(run_id, runner_id, 1, exit_code=0)
                assert response_done.status_code == 200
                end = json.loads(await anext(lines))
                assert end["event"] == "end"
                assert end["run"]["run_id"] == run_id
                assert end["run"]["status"] == "completed"
                assert [line async for line in lines if line] == []

        # A pending run cancelled while followed ends the stream too; 'after' skips lines.
        other = await api.create_command()
        async with client.stream("GET", f"/runs/{other}/logs", params=params) as response:
            lines = response.aiter_lines()
            cancel = await client.post(f"/runs/{other}/cancel")
            assert cancel.status_code == 200
            with anyio.fail_after(AT_ONCE_S * 2):
                end = json.loads(await anext(lines))
            assert (end["event"], end["run"]["status"]) == ("end", "cancelled")

        first_id = (await client.get(f"/runs/{run_id}/logs")).json()["lines"][0]["id"]
        response = await client.get(
            f"/runs/{run_id}/logs", params={"follow": "true", "after": first_id}
        )
        events = [json.loads(line) for line in response.text.splitlines()]
        assert [e.get("text") for e in events] == ["two", None]
        assert events[-1]["event"] == "end"


# ---- sessions --------------------------------------------------------------------------------

RESEARCHER = """
[agents.researcher]
executor = "claude"
model = "sonnet"
allowed_tools = ["Read", "Grep"]
budget_usd = 5.0
"""


async def start_session(
    api: Api, runner_id: str, *, session_id: str, cost: float, **body: Any
) -> str:
    """A start_session run that its runner claims, names its session, and completes."""
    run_id = await api.create(type="start_session", prompt="look into it", **body)
    assignment = await api.claim_one(runner_id)
    assert assignment["run_id"] == run_id
    await api.started(run_id, runner_id)
    seen = await api.runner_post(run_id, "session", runner_id, 1, session_id=session_id)
    assert seen.status_code == 200, seen.text
    done = await api.complete(
        run_id,
        runner_id,
        1,
        exit_code=0,
        result="found it",
        session_id=session_id,
        cost_usd=cost,
        num_turns=3,
        usage={"input_tokens": 10},
    )
    assert done.status_code == 200, done.text
    return run_id


async def test_a_session_is_started_and_resumed_on_its_runner(db_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(db_url=db_url, config_path=write_config(tmp_path, RESEARCHER))
    async with running_api(settings) as api:
        host_a = await api.register("host-a")
        host_b = await api.register("host-b")
        run_id = await api.create(
            type="start_session",
            prompt="look into it",
            session_name="s1",
            agent_name="researcher",
            project_dir="/proj/x",
        )
        assignment = await api.claim_one(host_a)
        assert assignment["agent"]["name"] == "researcher"
        assert assignment["agent"]["model"] == "sonnet"
        assert assignment["agent"]["allowed_tools"] == ["Read", "Grep"]
        assert assignment["agent"]["budget_usd"] == 5.0
        assert assignment["prompt"] == "look into it"
        await api.started(run_id, host_a)

        seen = await api.runner_post(run_id, "session", host_a, 1, session_id="sess-1")
        assert seen.status_code == 200, seen.text
        session = (await api.client.get("/sessions/sess-1")).json()
        assert session["runner_id"] == host_a
        assert session["session_name"] == "s1"
        assert session["project_dir"] == "/proj/x"
        assert session["last_run_id"] == run_id

        done = await api.complete(
            run_id, host_a, 1, exit_code=0, result="found it", session_id="sess-1", cost_usd=0.25
        )
        assert done.status_code == 200, done.text
        run = await api.run(run_id)
        assert (run["session_id"], run["cost_usd"], run["result"]) == ("sess-1", 0.25, "found it")

        expected = {
            "session_id": "sess-1",
            "result": "found it",
            "is_error": False,
            "cost_usd": 0.25,
            "last_run_id": run_id,
        }
        assert (await api.client.get("/sessions/sess-1/result")).json() == expected
        assert (await api.client.get("/sessions/s1/result")).json() == expected  # by name

        # The resume goes back to host-a and /proj/x, whoever asks for a run.
        resume_id = await api.create(type="resume_session", session_id="sess-1", prompt="more")
        resume = await api.run(resume_id)
        assert resume["type"] == "resume_session"
        assert resume["session_id"] == "sess-1"
        assert resume["project_dir"] == "/proj/x"
        assert await api.claim(host_b) == []
        assignment = await api.claim_one(host_a)
        assert assignment["run_id"] == resume_id
        assert assignment["required_runner"] == "host-a"
        assert assignment["project_dir"] == "/proj/x"
        assert assignment["session_id"] == "sess-1"
        assert assignment["agent"]["name"] == "researcher"

        # By name, too.
        by_name = await api.create(type="resume_session", session_name="s1", prompt="again")
        assert (await api.run(by_name))["session_id"] == "sess-1"
        listed = (await api.client.get("/runs", params={"session": "sess-1"})).json()["runs"]
        assert {r["run_id"] for r in listed} == {run_id, resume_id, by_name}


async def test_resume_of_an_unknown_session_is_404(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        before = api.snapshot()
        response = await api.client.post(
            "/runs", json={"type": "resume_session", "session_id": "nope", "prompt": "more"}
        )
        assert response.status_code == 404
        assert error_code(response) == "session_not_found"
        assert (await api.client.get("/sessions/nope")).status_code == 404
        assert api.snapshot() == before


@contextlib.asynccontextmanager
async def researcher_session(
    db_url: str, tmp_path: Path, *, budget_usd: float, session_id: str, cost: float
) -> AsyncIterator[Api]:
    """The API with a "researcher" agent of ``budget_usd``, and a session of it (started on
    runner "host-a") that cost ``cost``."""
    config = write_config(tmp_path, f"[agents.researcher]\nbudget_usd = {budget_usd}\n")
    settings = CoordinatorSettings(db_url=db_url, config_path=config)
    async with running_api(settings) as api:
        runner_id = await api.register("host-a")
        await start_session(
            api, runner_id, session_id=session_id, cost=cost, agent_name="researcher"
        )
        yield api


async def test_resume_over_the_agent_budget_is_409(db_url: str, tmp_path: Path) -> None:
    session = researcher_session(db_url, tmp_path, budget_usd=0.01, session_id="sess-b", cost=0.02)
    async with session as api:
        before = api.snapshot()
        response = await api.client.post(
            "/runs", json={"type": "resume_session", "session_id": "sess-b", "prompt": "more"}
        )
        assert response.status_code == 409
        assert error_code(response) == "budget_exceeded"
        assert "budget" in response.json()["error"]["message"]
        assert api.snapshot() == before


async def test_resume_under_the_budget_is_accepted(db_url: str, tmp_path: Path) -> None:
    session = researcher_session(db_url, tmp_path, budget_usd=1.0, session_id="sess-c", cost=0.5)
    async with session as api:
        await api.create(type="resume_session", session_id="sess-c", prompt="more")
