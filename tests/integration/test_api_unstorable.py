"""Values JSON can carry but no store or answer can hold again — a lone surrogate, NUL, an
integer beyond 64 bits, NaN — are refused at the edge with 422 ``invalid_request`` on every
endpoint, in any field however nested, in path and query parameters too; nothing changes,
and every read endpoint still answers afterwards (on SQLite and PostgreSQL).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import dataclass
from typing import Any

import pytest
from api_fixtures import Api, error_code, running_api
from pydantic import BaseModel

from corral.coordinator.settings import CoordinatorSettings
from corral.wire import WireModel

pytestmark = pytest.mark.anyio

SURROGATE = "\ud800"
NUL = "a\x00b"
HUGE = 2**64
RUNNER_NAME = "runner-a"


@dataclass
class Seed:
    runner: str
    done: str
    running: str


async def seed(api: Api) -> Seed:
    done = await api.create_command("echo", "done", priority=10)
    running = await api.create_command("sleep", "100")
    runner = await api.register(RUNNER_NAME)
    assert (await api.claim_one(runner))["run_id"] == done
    await api.started(done, runner)
    await api.log(done, runner, 1, "done")
    assert (await api.complete(done, runner, 1, exit_code=0)).status_code == 200
    assert (await api.claim_one(runner))["run_id"] == running
    await api.started(running, runner)
    return Seed(runner, done, running)


def command(**extra: Any) -> dict[str, Any]:
    return {"type": "command", "command": ["echo"], **extra}


def line(**extra: Any) -> dict[str, Any]:
    return {"line_no": 1, "stream": "stdout", "text": "x", "ts": 1.0, **extra}


# (id, method, path, JSON body or None); ``{running}`` and ``{runner}`` are filled in.
CASES: list[tuple[str, str, str, Any]] = [
    ("run-command-surrogate", "POST", "/runs", command(command=["echo", SURROGATE])),
    ("run-prompt-surrogate", "POST", "/runs", {"type": "start_session", "prompt": SURROGATE}),
    ("run-session-name-nul", "POST", "/runs", command(session_name=NUL)),
    ("run-label-nul", "POST", "/runs", command(labels=[NUL])),
    ("run-env-key-surrogate", "POST", "/runs", command(env={SURROGATE: "x"})),
    ("run-env-value-nul", "POST", "/runs", command(env={"A": NUL})),
    ("run-project-dir-nul", "POST", "/runs", command(project_dir=NUL)),
    ("run-timeout-huge-int", "POST", "/runs", command(timeout_s=10**400)),
    ("batch-second-run-nul", "POST", "/runs:batch", {"runs": [command(), command(prompt=NUL)]}),
    ("register-name-surrogate", "POST", "/runner/register", {"name": SURROGATE}),
    ("register-hostname-nul", "POST", "/runner/register", {"name": "r", "hostname": NUL}),
    ("register-held-huge-attempt", "POST", "/runner/register",
     {"name": "r", "held": [{"run_id": "run_000000000000", "attempt": HUGE}]}),
    ("seed-register-hostname-control", "POST", "/runner/register",
     {"hostname": "a\x10", "executor_profile": "5", "project_dir": "", "tags": None}),
    ("seed-register-hostname-surrogate", "POST", "/runner/register",
     {"hostname": SURROGATE, "executor_profile": "5", "project_dir": "", "tags": None}),
    ("heartbeat-runner-id-nul", "POST", "/runner/heartbeat", {"runner_id": NUL}),
    ("started-huge-attempt", "POST", "/runner/runs/{running}/started",
     {"runner_id": "{runner}", "attempt": HUGE}),
    ("started-negative-huge-attempt", "POST", "/runner/runs/{running}/started",
     {"runner_id": "{runner}", "attempt": -HUGE}),
    ("log-text-surrogate", "POST", "/runner/runs/{running}/logs",
     {"runner_id": "{runner}", "attempt": 1, "lines": [line(text=SURROGATE)]}),
    ("log-text-nul", "POST", "/runner/runs/{running}/logs",
     {"runner_id": "{runner}", "attempt": 1, "lines": [line(text=NUL)]}),
    ("log-line-no-huge", "POST", "/runner/runs/{running}/logs",
     {"runner_id": "{runner}", "attempt": 1, "lines": [line(line_no=HUGE)]}),
    ("log-line-no-over-32-bits", "POST", "/runner/runs/{running}/logs",
     {"runner_id": "{runner}", "attempt": 1, "lines": [line(line_no=2**31)]}),
    ("log-ts-nan", "POST", "/runner/runs/{running}/logs",
     {"runner_id": "{runner}", "attempt": 1, "lines": [line(ts=float("nan"))]}),
    ("completed-error-surrogate", "POST", "/runner/runs/{running}/completed",
     {"runner_id": "{runner}", "attempt": 1, "error": SURROGATE}),
    ("completed-exit-code-huge", "POST", "/runner/runs/{running}/completed",
     {"runner_id": "{runner}", "attempt": 1, "exit_code": HUGE}),
    ("completed-usage-nested-nul", "POST", "/runner/runs/{running}/completed",
     {"runner_id": "{runner}", "attempt": 1, "usage": {"a": [{"b": NUL}]}}),
    ("completed-usage-nested-huge", "POST", "/runner/runs/{running}/completed",
     {"runner_id": "{runner}", "attempt": 1, "usage": {"tokens": HUGE}}),
    ("completed-cost-infinite", "POST", "/runner/runs/{running}/completed",
     {"runner_id": "{runner}", "attempt": 1, "cost_usd": float("inf")}),
    ("failed-result-surrogate", "POST", "/runner/runs/{running}/failed",
     {"runner_id": "{runner}", "attempt": 1, "result": "ok" + SURROGATE}),
    ("session-id-nul", "POST", "/runner/runs/{running}/session",
     {"runner_id": "{runner}", "attempt": 1, "session_id": NUL}),
    ("events-finished-surrogate", "POST", "/runner/events",
     {"runner_id": "{runner}", "events": [{"type": "finished", "run_id": "{running}",
                                           "attempt": 1, "status": "failed",
                                           "error": SURROGATE}]}),
    ("events-log-huge-attempt", "POST", "/runner/events",
     {"runner_id": "{runner}", "events": [{"type": "logs", "run_id": "{running}",
                                           "attempt": HUGE, "lines": [line()]}]}),
    ("events-task-step-nul", "POST", "/runner/events",
     {"runner_id": "{runner}", "events": [{"type": "task_step", "run_id": "{running}",
                                           "attempt": 1, "step": "agent",
                                           "data": {NUL: 1}}]}),
    ("project-repo-nul", "POST", "/projects", {"repo_path": NUL, "target_branch": "main"}),
    ("drain-grace-nan", "POST", "/runners/{runner}/drain", {"grace_s": float("nan")}),
    ("get-run-nul", "GET", "/runs/run_%00", None),
    ("cancel-run-nul", "POST", "/runs/run_%00/cancel", None),
    ("list-runs-runner-nul", "GET", "/runs?runner_id=%00", None),
    ("list-runs-before-nul", "GET", "/runs?before=%00", None),
    ("logs-after-huge", "GET", f"/runs/{{running}}/logs?after={HUGE}", None),
    ("session-nul", "GET", "/sessions/a%00b", None),
    ("poll-runner-nul", "GET", "/runner/runs?runner_id=%00&timeout=0", None),
    ("project-nul", "GET", "/projects/p%00", None),
]  # fmt: skip


def fill(value: Any, s: Seed) -> Any:
    if isinstance(value, str):
        return value.replace("{running}", s.running).replace("{runner}", s.runner)
    if isinstance(value, list):
        return [fill(v, s) for v in value]
    if isinstance(value, dict):
        return {fill(k, s): fill(v, s) for k, v in value.items()}
    return value


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url, poll_timeout_s=1.0)


async def assert_reads_answer(api: Api, s: Seed) -> None:
    """Every read endpoint still answers 200 with what was there before."""
    for path in (
        "/runs",
        f"/runs/{s.done}",
        f"/runs/{s.running}",
        f"/runs/{s.done}/logs",
        "/runners",
        "/stats",
        "/projects",
    ):
        response = await api.client.get(path)
        assert response.status_code == 200, (path, response.text)


@pytest.mark.parametrize(
    ("method", "path", "body"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_unstorable_values_are_refused(
    method: str, path: str, body: Any, settings: CoordinatorSettings
) -> None:
    async with running_api(settings) as api:
        s = await seed(api)
        before = api.snapshot()
        # ``json.dumps`` writes lone surrogates as \\ud800 escapes, as a hostile client would;
        # NaN and Infinity as the literals Python's JSON reader accepts.
        content = None if body is None else json.dumps(fill(body, s)).encode()
        response = await api.client.request(
            method,
            fill(path, s),
            content=content,
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 422, response.text
        assert error_code(response) == "invalid_request"
        assert api.snapshot() == before
        await assert_reads_answer(api, s)


async def test_the_values_next_to_the_limits_are_kept(settings: CoordinatorSettings) -> None:
    """What is refused is only what cannot be stored: astral characters, tabs, the 64-bit
    extremes all round-trip."""
    text = "🐍 tab\there é \U0010ffff"
    async with running_api(settings) as api:
        s = await seed(api)
        run_id = await api.create_command("echo", text, env={text: text}, labels=[text])
        run = await api.run(run_id)
        assert (run["command"], run["labels"]) == (["echo", text], [text])
        await api.log(s.running, s.runner, 1, text, first_line=5)
        done = await api.complete(
            s.running, s.runner, 1, exit_code=2**31 - 1, usage={"n": -(2**63), "t": text}
        )
        assert done.status_code == 200, done.text
        run = await api.run(s.running)
        assert (run["exit_code"], run["usage"]) == (2**31 - 1, {"n": -(2**63), "t": text})
        logs = (await api.client.get(f"/runs/{s.running}/logs")).json()["lines"]
        assert [entry["text"] for entry in logs] == [text]
        await assert_reads_answer(api, s)


async def test_a_row_stored_before_the_checks_still_reads(settings: CoordinatorSettings) -> None:
    """A database written before values were checked may hold a lone surrogate in a JSON
    column (as an escape): listings still answer, with U+FFFD in its place."""
    async with running_api(settings) as api:
        s = await seed(api)
        with api.coordinator.store.db.transaction() as tx:
            tx.execute(
                "UPDATE runs SET command = ?, labels = ?, usage = ? WHERE id = ?",
                ('["echo","\\ud800","\\ud83d\\udc0d"]', '["\\udfff"]', '{"\\ud800":1}', s.done),
            )
        await assert_reads_answer(api, s)
        run = await api.run(s.done)
        assert run["command"] == ["echo", "\ufffd", "🐍"]
        assert (run["labels"], run["usage"]) == (["\ufffd"], {"\ufffd": 1})


def test_every_request_model_checks_its_values() -> None:
    """New request bodies inherit the one check: every pydantic model of the coordinator
    (but the error answers') is a ``WireModel``."""
    answers = {"ErrorBody", "ErrorDetail", "AoTokenRefusal"}
    package = importlib.import_module("corral.coordinator")
    models = []
    for info in pkgutil.iter_modules(package.__path__, "corral.coordinator."):
        module = importlib.import_module(info.name)
        models += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, BaseModel)
            and value.__module__ == info.name
            and value.__name__ not in answers
        ]
    assert len(models) > 20
    assert [m.__name__ for m in models if not issubclass(m, WireModel)] == []
