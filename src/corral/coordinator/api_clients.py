"""REST routes for clients: runs, logs, sessions, runners."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from corral import __version__
from corral.coordinator.auth import Access, check, principal_of, require
from corral.coordinator.schemas import (
    CreateRun,
    CreateRuns,
    iso,
    log_json,
    refusal,
    run_json,
    runner_json,
    session_json,
)
from corral.coordinator.service import Coordinator
from corral.errors import CorralError, InvalidRequest, MalformedJson, PayloadTooLarge
from corral.runs import Run, RunStatus
from corral.wire import Int64, WireModel, check_parameters

router = APIRouter()
READ, WRITE, ADMIN = require(Access.READ), require(Access.WRITE), require(Access.ADMIN)
RUNS = require(Access.RUNS)


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


# A request sent again with its key (its answer was lost) gets the runs it created, not
# new ones (``store.run_requests``).
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="the caller's key for this request (1 to 255 printable ASCII "
        "characters, kept a day): sent again, it gets the runs it created, as they are now",
    ),
]


@router.post("/runs", status_code=201, tags=["runs"], dependencies=[RUNS])
async def create_run(
    body: CreateRun, request: Request, idempotency_key: IdempotencyKey = None
) -> dict[str, Any]:
    """Queue a run; answers at once with its id."""
    coordinator = _coordinator(request)
    (run,) = await coordinator.create_runs([body], principal_of(request), idempotency_key)
    return {"run_id": run.id, "status": run.status}


def creates_a_run(scope: Scope) -> bool:
    """Is this ``POST /runs`` (served by ``serve_create_run``)?"""
    if scope.get("method") != "POST":  # (a WebSocket or the lifespan has none)
        return False
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path == root + "/runs"


async def serve_create_run(scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /runs`` as plain ASGI: the coordinator's app hands it over before FastAPI's
    routing (``app.CoordinatorApp``), behind the same ``Guard`` and body limit, as the
    request most often made: FastAPI's routing, dependency solving and exception
    middleware cost ~0.13 ms of the coordinator's CPU a request (of ~0.7). It checks and
    answers what the route above declares (access, parameters, the body as FastAPI reads
    it); that route stays for the OpenAPI document, for apps without the shortcut and for
    the tests that walk every route."""
    request = Request(scope, receive)
    try:
        check(principal_of(request), Access.RUNS)
        check_parameters(request.query_params.multi_items())
        try:
            raw = await request.body()
        except HTTPException as exc:  # the body limit's (BodyLimit: as FastAPI's routes need)
            raise PayloadTooLarge(str(exc.detail)) from None
        data = _json_body(raw, request.headers.get("content-type"))
        try:
            body = CreateRun.model_validate(data)
        except ValidationError as exc:
            raise refusal(exc.errors()) from None
        key = request.headers.get("idempotency-key")
        response = JSONResponse(await create_run(body, request, key), 201)
    except CorralError as exc:
        response = JSONResponse(exc.to_dict(), exc.http_status)
    await response(scope, receive, send)


def _json_body(raw: bytes, content_type: str | None) -> Any:
    """A body as FastAPI reads one for a model: parsed as JSON when its Content-Type says
    JSON, else left as bytes (which no model accepts)."""
    if not raw:
        raise InvalidRequest("the request has no body: a JSON object is required")
    media = (content_type or "").partition(";")[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        return raw
    try:
        return json.loads(raw)
    except ValueError:  # not JSON, or not in a Unicode encoding
        raise MalformedJson("request body is not valid JSON") from None


@router.post("/runs:batch", status_code=201, tags=["runs"], dependencies=[RUNS])
async def create_runs(
    body: CreateRuns, request: Request, idempotency_key: IdempotencyKey = None
) -> dict[str, Any]:
    """Queue many runs in one transaction: all are created, or none."""
    coordinator = _coordinator(request)
    runs = await coordinator.create_runs(body.runs, principal_of(request), idempotency_key)
    return {"runs": [{"run_id": r.id, "status": r.status} for r in runs]}


@router.get("/runs", tags=["runs"], dependencies=[READ])
async def list_runs(
    request: Request,
    status: Annotated[str | None, Query(description="comma-separated statuses")] = None,
    runner_id: str | None = None,
    session: Annotated[str | None, Query(description="session id or name")] = None,
    before: Annotated[str | None, Query(description="the 'next' of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    statuses = _parse_statuses(status)
    store = _coordinator(request).store
    runs = await _coordinator(request).in_thread(
        store.runs.list,
        statuses=statuses,
        runner_id=runner_id,
        session=session,
        before=before,
        limit=limit,
    )
    return {
        "runs": [run_json(r) for r in runs],
        "next": runs[-1].id if len(runs) == limit else None,
    }


def _parse_statuses(text: str | None) -> list[RunStatus]:
    if not text:
        return []
    try:
        return [RunStatus(s.strip()) for s in text.split(",") if s.strip()]
    except ValueError:
        raise InvalidRequest(
            f"unknown status in {text!r}; statuses: {', '.join(s.value for s in RunStatus)}"
        ) from None


@router.get("/runs/{run_id}", tags=["runs"], dependencies=[READ])
async def get_run(run_id: str, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    run = await coordinator.in_thread(coordinator.store.runs.get, run_id)
    ends_at = None
    if run.status is RunStatus.LOST:  # waits for its runner's late report, until:
        ends_at = await coordinator.in_thread(
            coordinator.store.runs.grace_ends_at, run_id, coordinator.settings.lost_after_s
        )
    return {**run_json(run), "lost_until": iso(ends_at)}


@router.post("/runs/{run_id}/cancel", tags=["runs"], dependencies=[RUNS])
async def cancel_run(run_id: str, request: Request) -> dict[str, Any]:
    """Cancel a pending run at once, or ask its runner to stop it (SIGTERM, then SIGKILL).
    Sent again, it answers the run as it is (cancelled, or its cancel asked); a run that
    ended otherwise is 409 ``illegal_transition``."""
    return run_json(await _coordinator(request).cancel(run_id, principal_of(request)))


@router.get("/runs/{run_id}/logs", tags=["runs"], response_model=None, dependencies=[READ])
async def run_logs(
    run_id: str,
    request: Request,
    after: Annotated[Int64, Query(ge=0, description="the last log id already read")] = 0,
    follow: bool = False,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> dict[str, Any] | StreamingResponse:
    """The run's output lines; with ``follow=true`` a stream of JSON lines until it ends."""
    coordinator = _coordinator(request)
    if not follow:
        entries = await coordinator.in_thread(coordinator.store.logs.read, run_id, after, limit)
        return {
            "lines": [log_json(e) for e in entries],
            "next_after": entries[-1].id if entries else after,
        }
    await coordinator.in_thread(coordinator.store.runs.get, run_id)  # 404 before streaming starts

    async def stream() -> AsyncIterator[bytes]:
        async for item in coordinator.follow_logs(run_id, after):
            if isinstance(item, Run):
                payload = {"event": "end", "run": run_json(item)}
            else:
                payload = {"event": "line", **log_json(item)}
            yield (json.dumps(payload) + "\n").encode()

    return StreamingResponse(stream(), media_type="application/x-ndjson")


@router.get("/sessions", tags=["sessions"], dependencies=[READ])
async def list_sessions(
    request: Request, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> dict[str, Any]:
    """The most recently updated sessions first: runs, latest result, total cost."""
    coordinator = _coordinator(request)
    found = await coordinator.in_thread(coordinator.store.sessions.list, limit)
    return {"sessions": [session_json(s) for s in found]}


@router.get("/sessions/{session}", tags=["sessions"], dependencies=[READ])
async def get_session(session: str, request: Request) -> dict[str, Any]:
    """A session by id or name (the most recent with that name)."""
    coordinator = _coordinator(request)
    return session_json(await coordinator.in_thread(coordinator.store.sessions.get, session))


@router.get("/sessions/{session}/result", tags=["sessions"], dependencies=[READ])
async def session_result(session: str, request: Request) -> dict[str, Any]:
    """The latest finished result of a session."""
    coordinator = _coordinator(request)
    found = await coordinator.in_thread(coordinator.store.sessions.get, session)
    return {
        "session_id": found.id,
        "result": found.result,
        "is_error": found.is_error,
        "cost_usd": found.cost_usd,
        "last_run_id": found.last_run_id,
    }


@router.get("/runners", tags=["runners"], dependencies=[READ])
async def list_runners(request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    runners = await coordinator.in_thread(coordinator.store.runners.list)
    return {"runners": [runner_json(r) for r in runners]}


class DrainBody(WireModel):
    grace_s: float = Field(120.0, ge=0, le=86400)


@router.post("/runners/{runner_id}/drain", tags=["runners"], dependencies=[ADMIN])
async def drain_runner(
    runner_id: str, request: Request, body: DrainBody | None = None
) -> dict[str, Any]:
    """Take no new work on this runner; it finishes what it has (up to grace_s) and leaves."""
    coordinator = _coordinator(request)
    await coordinator.drain_runner(runner_id, body.grace_s if body else 120.0)
    return runner_json(await coordinator.in_thread(coordinator.store.runners.get, runner_id))


@router.post("/runners/{runner_id}/stop", tags=["runners"], dependencies=[ADMIN])
async def stop_runner(runner_id: str, request: Request) -> dict[str, Any]:
    """Stop a runner now: its runs go back to pending for other runners."""
    coordinator = _coordinator(request)
    await coordinator.stop_runner(runner_id)
    return runner_json(await coordinator.in_thread(coordinator.store.runners.get, runner_id))


@router.get("/agents", tags=["meta"], dependencies=[READ])
async def list_agents(request: Request) -> dict[str, Any]:
    """The agent profiles loaded now (``corral.toml``; SIGHUP reloads them). Only the names
    of their environment variables: their values may be secrets."""
    coordinator = _coordinator(request)
    return {
        "config": str(coordinator.settings.config_path or ""),
        "agents": [
            {
                "name": spec.name,
                "executor": spec.executor,
                "model": spec.model,
                "allowed_tools": list(spec.allowed_tools),
                "max_turns": spec.max_turns,
                "budget_usd": spec.budget_usd,
                "env": sorted(spec.env),
            }
            for spec in coordinator.profiles.values()
        ],
    }


@router.get("/stats", tags=["meta"], dependencies=[READ])
async def stats(request: Request) -> dict[str, Any]:
    """Runs per status and runners per state: the numbers a glance needs; the
    coordinator's version and its database's schema version."""
    coordinator = _coordinator(request)
    counts = await coordinator.in_thread(coordinator.store.runs.count_by_status)
    runners = await coordinator.in_thread(coordinator.store.runners.list)
    by_state: dict[str, int] = {}
    for runner in runners:
        by_state[runner.state] = by_state.get(runner.state, 0) + 1
    schema = await coordinator.in_thread(coordinator.store.schema_version)
    return {
        "runs": counts,
        "runners": by_state,
        "version": __version__,
        "schema_version": schema,
    }


@router.get("/health", tags=["meta"])
async def health() -> dict[str, str]:
    """Whether the coordinator answers: the one route that needs no token."""
    return {"status": "ok"}
