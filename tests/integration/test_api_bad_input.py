"""Requests the coordinator must refuse: each gets a 4xx with ``{error: {code, message}}``,
a stable code, and leaves every stored row as it was.

Each case runs against a seeded store (two runners; a completed, a running and a pending
run) on SQLite and PostgreSQL, and compares all rows before and after the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest
from api_fixtures import Api, error_code, running_api

from corral.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.anyio

MAX_PROMPT = 100
MAX_BODY = 4096
JSON = {"content-type": "application/json"}
UNKNOWN_RUN = "run_000000000000"


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(
        db_url=db_url, max_prompt_bytes=MAX_PROMPT, max_body_bytes=MAX_BODY, poll_timeout_s=1.0
    )


@dataclass
class Seed:
    runner_a: str
    runner_b: str
    done: str  # completed by runner_a, attempt 1
    running: str  # running on runner_a, attempt 1
    pending: str


async def seed(api: Api) -> Seed:
    done = await api.create_command("echo", "done", priority=10)
    running = await api.create_command("sleep", "100", priority=5)
    pending = await api.create_command("echo", "later")
    runner_a = await api.register("runner-a")
    runner_b = await api.register("runner-b")
    assert (await api.claim_one(runner_a))["run_id"] == done
    await api.started(done, runner_a)
    await api.log(done, runner_a, 1, "done")
    assert (await api.complete(done, runner_a, 1, exit_code=0)).status_code == 200
    assert (await api.claim_one(runner_a))["run_id"] == running
    await api.started(running, runner_a)
    return Seed(runner_a, runner_b, done, running, pending)


Send = Callable[[Api, Seed], Awaitable[httpx.Response]]


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    code: str
    send: Send


def post_run(body: object) -> Send:
    async def send(api: Api, s: Seed) -> httpx.Response:
        return await api.client.post("/runs", json=body)

    return send


def raw_post(path: str, content: bytes) -> Send:
    async def send(api: Api, s: Seed) -> httpx.Response:
        return await api.client.post(path, content=content, headers=JSON)

    return send


def get(path: str, **params: str) -> Send:
    async def send(api: Api, s: Seed) -> httpx.Response:
        return await api.client.get(path.format(s=s), params=params)

    return send


def post(path: str) -> Send:
    async def send(api: Api, s: Seed) -> httpx.Response:
        return await api.client.post(path.format(s=s))

    return send


async def streamed_body_over_the_limit(api: Api, s: Seed) -> httpx.Response:
    async def chunks() -> AsyncIterator[bytes]:  # no content-length: sent chunked
        yield b'{"type": "command", "command": ["echo", "'
        for _ in range(4):
            yield b"x" * (MAX_BODY // 2)
        yield b'"]}'

    return await api.client.post("/runs", content=chunks(), headers=JSON)


async def completion_from_another_runner(api: Api, s: Seed) -> httpx.Response:
    return await api.complete(s.running, s.runner_b, 1, exit_code=0)


async def completion_with_a_wrong_attempt(api: Api, s: Seed) -> httpx.Response:
    return await api.complete(s.running, s.runner_a, 2, exit_code=0)


async def completion_of_a_pending_run(api: Api, s: Seed) -> httpx.Response:
    return await api.complete(s.pending, s.runner_a, 1, exit_code=0)


async def started_by_another_runner(api: Api, s: Seed) -> httpx.Response:
    return await api.runner_post(s.running, "started", s.runner_b, 1)


async def logs_from_another_runner(api: Api, s: Seed) -> httpx.Response:
    line = {"line_no": 7, "stream": "stdout", "text": "x", "ts": 0.0}
    return await api.runner_post(s.running, "logs", s.runner_b, 1, lines=[line])


async def completed_run_reported_failed(api: Api, s: Seed) -> httpx.Response:
    return await api.fail(s.done, s.runner_a, 1, exit_code=1, error="late")


async def completed_route_given_failed(api: Api, s: Seed) -> httpx.Response:
    return await api.complete(s.running, s.runner_a, 1, status="failed")


async def failed_route_given_completed(api: Api, s: Seed) -> httpx.Response:
    return await api.fail(s.running, s.runner_a, 1, status="completed")


async def unknown_report_status(api: Api, s: Seed) -> httpx.Response:
    return await api.fail(s.running, s.runner_a, 1, status="exploded")


async def poll_by_unknown_runner(api: Api, s: Seed) -> httpx.Response:
    return await api.poll("rnr_000000000000", timeout=0)


async def heartbeat_of_unknown_runner(api: Api, s: Seed) -> httpx.Response:
    return await api.heartbeat("rnr_000000000000")


async def register_without_name(api: Api, s: Seed) -> httpx.Response:
    return await api.client.post("/runner/register", json={"hostname": "h"})


CASES = [
    Case("malformed-json", 400, "malformed_json", raw_post("/runs", b'{"type": "command", ')),
    Case("malformed-json-batch", 400, "malformed_json", raw_post("/runs:batch", b"{runs: [}")),
    Case(
        "malformed-json-runner",
        400,
        "malformed_json",
        raw_post("/runner/register", b'{"name": "x"'),
    ),
    Case("unknown-type", 422, "invalid_request", post_run({"type": "bogus", "prompt": "x"})),
    Case(
        "unknown-field",
        422,
        "invalid_request",
        post_run({"type": "command", "command": ["echo"], "bogus": 1}),
    ),
    Case("not-an-object", 422, "invalid_request", post_run(["command"])),
    Case("no-prompt", 422, "invalid_request", post_run({"type": "start_session"})),
    Case(
        "blank-prompt", 422, "invalid_request", post_run({"type": "start_session", "prompt": " "})
    ),
    Case(
        "resume-without-session",
        422,
        "invalid_request",
        post_run({"type": "resume_session", "prompt": "more"}),
    ),
    Case("command-without-command", 422, "invalid_request", post_run({"type": "command"})),
    Case(
        "command-empty-argv", 422, "invalid_request", post_run({"type": "command", "command": []})
    ),
    Case(
        "session-with-command",
        422,
        "invalid_request",
        post_run({"type": "start_session", "prompt": "x", "command": ["echo"]}),
    ),
    Case(
        "bad-max-attempts",
        422,
        "invalid_request",
        post_run({"type": "command", "command": ["echo"], "max_attempts": 0}),
    ),
    Case(
        "unknown-agent",
        422,
        "unknown_agent",
        post_run({"type": "start_session", "prompt": "x", "agent_name": "nobody"}),
    ),
    Case(
        "oversized-prompt",
        413,
        "payload_too_large",
        post_run({"type": "start_session", "prompt": "é" * (MAX_PROMPT // 2 + 1)}),
    ),
    Case(
        "declared-body-over-limit",
        413,
        "payload_too_large",
        post_run({"type": "command", "command": ["echo", "x" * MAX_BODY]}),
    ),
    Case("streamed-body-over-limit", 413, "payload_too_large", streamed_body_over_the_limit),
    Case(
        "batch-with-one-bad-run",
        422,
        "unknown_agent",
        raw_post(
            "/runs:batch",
            b'{"runs": [{"type": "command", "command": ["echo"]},'
            b' {"type": "start_session", "prompt": "x", "agent_name": "nobody"}]}',
        ),
    ),
    Case(
        "unknown-parent-session",
        404,
        "parent_not_found",
        post_run({"type": "start_session", "prompt": "x", "parent_session": "nobody"}),
    ),
    Case(
        "callback-without-parent",
        422,
        "invalid_request",
        post_run({"type": "start_session", "prompt": "x", "callback": "async_callback"}),
    ),
    Case(
        "unknown-callback-mode",
        422,
        "invalid_request",
        post_run({"type": "start_session", "prompt": "x", "callback": "later"}),
    ),
    Case("empty-batch", 422, "invalid_request", raw_post("/runs:batch", b'{"runs": []}')),
    Case("get-unknown-run", 404, "run_not_found", get(f"/runs/{UNKNOWN_RUN}")),
    Case("cancel-unknown-run", 404, "run_not_found", post(f"/runs/{UNKNOWN_RUN}/cancel")),
    Case("logs-of-unknown-run", 404, "run_not_found", get(f"/runs/{UNKNOWN_RUN}/logs")),
    Case(
        "follow-unknown-run",
        404,
        "run_not_found",
        get(f"/runs/{UNKNOWN_RUN}/logs", follow="true"),
    ),
    Case("page-before-unknown-run", 404, "run_not_found", get("/runs", before=UNKNOWN_RUN)),
    Case("unknown-session", 404, "session_not_found", get("/sessions/nope/result")),
    Case("completion-by-non-holder", 409, "lease_lost", completion_from_another_runner),
    Case("completion-wrong-attempt", 409, "lease_lost", completion_with_a_wrong_attempt),
    Case("completion-of-pending-run", 409, "lease_lost", completion_of_a_pending_run),
    Case("started-by-non-holder", 409, "lease_lost", started_by_another_runner),
    Case("logs-from-non-holder", 409, "lease_lost", logs_from_another_runner),
    Case("completed-run-reported-failed", 409, "illegal_transition", completed_run_reported_failed),
    Case("cancel-completed-run", 409, "illegal_transition", post("/runs/{s.done}/cancel")),
    Case("completed-route-given-failed", 422, "invalid_request", completed_route_given_failed),
    Case("failed-route-given-completed", 422, "invalid_request", failed_route_given_completed),
    Case("unknown-report-status", 422, "invalid_request", unknown_report_status),
    Case("poll-unknown-runner", 404, "runner_not_found", poll_by_unknown_runner),
    Case("heartbeat-unknown-runner", 404, "runner_not_found", heartbeat_of_unknown_runner),
    Case("register-without-name", 422, "invalid_request", register_without_name),
    Case("unknown-route", 404, "route_not_found", get("/nowhere")),
    Case("unknown-route-under-runs", 404, "route_not_found", get("/runs/{s.done}/nowhere")),
    Case("wrong-method", 405, "method_not_allowed", post("/runs/{s.done}")),
    Case("bad-status-filter", 422, "invalid_request", get("/runs", status="pending,bogus")),
    Case("bad-limit", 422, "invalid_request", get("/runs", limit="0")),
    Case(
        "bad-poll-timeout", 422, "invalid_request", get("/runner/runs", runner_id="x", timeout="-1")
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_refused_and_nothing_changes(case: Case, settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        s = await seed(api)
        before = api.snapshot()
        listed_before = (await api.client.get("/runs")).json()

        response = await case.send(api, s)

        assert response.status_code == case.status, response.text
        assert response.headers["content-type"] == "application/json"
        assert error_code(response) == case.code, response.text
        assert api.snapshot() == before
        assert (await api.client.get("/runs")).json() == listed_before


async def test_a_streamed_body_under_the_limit_is_accepted(settings: CoordinatorSettings) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"type": "command", '
        yield b'"command": ["echo", "hi"]}'

    async with running_api(settings) as api:
        response = await api.client.post("/runs", content=chunks(), headers=JSON)
        assert response.status_code == 201, response.text


async def test_a_report_for_a_stale_attempt_is_refused(settings: CoordinatorSettings) -> None:
    """The runner's first attempt was taken back (it stopped), then it claimed the run again:
    reports for attempt 1 no longer count."""
    async with running_api(settings) as api:
        run_id = await api.create_command()
        runner_id = await api.register("runner-a")
        assert (await api.claim_one(runner_id))["attempts"] == 1
        await api.started(run_id, runner_id, 1)
        stopped = await api.client.post("/runner/deregister", json={"runner_id": runner_id})
        assert stopped.status_code == 200, stopped.text
        assert (await api.run(run_id))["status"] == "pending"
        await api.register("runner-a", runner_id=runner_id)
        assert (await api.claim_one(runner_id))["attempts"] == 2

        before = api.snapshot()
        for response in (
            await api.complete(run_id, runner_id, 1, exit_code=0),
            await api.fail(run_id, runner_id, 1, exit_code=1),
            await api.runner_post(run_id, "started", runner_id, 1),
            await api.runner_post(run_id, "session", runner_id, 1, session_id="s"),
        ):
            assert response.status_code == 409, response.text
            assert error_code(response) == "lease_lost"
        assert api.snapshot() == before
        run = await api.run(run_id)
        assert (run["status"], run["attempts"], run["runner_id"]) == ("claimed", 2, runner_id)

        # The current attempt still reports normally.
        await api.started(run_id, runner_id, 2)
        assert (await api.complete(run_id, runner_id, 2, exit_code=0)).status_code == 200
        assert (await api.run(run_id))["status"] == "completed"


async def test_a_report_for_the_attempt_before_a_rate_limit_is_refused(
    settings: CoordinatorSettings,
) -> None:
    """A rate-limited attempt is given back; the next claim is a new lease all the same."""
    async with running_api(settings) as api:
        run_id = await api.create_command(max_attempts=1)
        runner_id = await api.register("runner-a")
        assert (await api.claim_one(runner_id))["attempts"] == 1
        await api.started(run_id, runner_id, 1)
        limited = await api.fail(run_id, runner_id, 1, status="pending", error="rate limited")
        assert limited.status_code == 200, limited.text
        assert limited.json()["status"] == "pending"
        again = await api.claim_one(runner_id)  # max_attempts 1: the rate limit did not count
        assert again["attempts"] == 2

        before = api.snapshot()
        response = await api.complete(run_id, runner_id, 1, exit_code=0)
        assert response.status_code == 409, response.text
        assert error_code(response) == "lease_lost"
        assert api.snapshot() == before
        await api.started(run_id, runner_id, 2)
        assert (await api.complete(run_id, runner_id, 2, exit_code=0)).status_code == 200
        assert (await api.run(run_id))["status"] == "completed"


# What POST /runs may be sent: (body, headers, query). Each is answered alike by the
# shortcut that serves it (api_clients.serve_create_run) and by the route it stands for.
POSTS: list[tuple[bytes, dict[str, str], dict[str, str]]] = [
    (b'{"type": "command", "command": ["echo", "hi"]}', JSON, {}),
    (b'{"type": "command", "command": ["echo", "hi"]}', {}, {}),  # no content-type: bytes
    (b'{"type": "command", "command": ["echo"]}', {"content-type": "application/x+json"}, {}),
    (b'{"type": "command", "command": ["echo"]}', {"content-type": "text/plain"}, {}),
    (b'{"type": "command", ', JSON, {}),
    (b"\xff\xfe", JSON, {}),
    (b"", JSON, {}),
    (b'["command"]', JSON, {}),
    (b'{"type": "command", "command": ["echo"], "bogus": 1}', JSON, {}),
    (b'{"type": "start_session", "prompt": "' + b"x" * (MAX_PROMPT + 1) + b'"}', JSON, {}),
    (b'{"type": "command", "command": ["echo", "' + b"x" * MAX_BODY + b'"]}', JSON, {}),
    (b'{"type": "command", "command": ["echo", "\\u0000"]}', JSON, {}),
    (b'{"type": "command", "command": ["echo"], "max_attempts": 1e400}', JSON, {}),
    (b'{"type": "command", "command": ["echo"]}', JSON, {"x": "\x00"}),
]


async def test_post_runs_is_answered_by_its_shortcut_as_by_its_route(
    settings: CoordinatorSettings,
) -> None:
    async with running_api(settings) as api:
        reader = await api.client.post("/tokens", json={"role": "reader"})
        as_reader = {**JSON, "Authorization": f"Bearer {reader.json()['token']}"}
        requests = [*POSTS, (POSTS[0][0], as_reader, {})]
        answers = []
        for shortcut in (True, False):
            if not shortcut:
                api.app.run_creator = None  # type: ignore[attr-defined]  # the route serves
            answers.append(
                [
                    await api.client.post("/runs", content=body, headers=headers, params=query)
                    for body, headers, query in requests
                ]
            )
        created = (await api.client.get("/runs")).json()["runs"]
    statuses = [r.status_code for r in answers[0]]
    assert statuses == [r.status_code for r in answers[1]]
    assert [error_code(r) if r.status_code >= 400 else "" for r in answers[0]] == [
        error_code(r) if r.status_code >= 400 else "" for r in answers[1]
    ]
    assert statuses[:3] == [201, 422, 201] and 403 in statuses and 413 in statuses
    assert {400, 422} <= set(statuses)
    assert len(created) == 2 * statuses.count(201)  # each path created what it accepted
