"""The runner HTTP protocol of seed 001: register, long-poll, report, heartbeat."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from corral.coordinator import compat_ao, seed_wire
from corral.coordinator.auth import Access, principal_of, require
from corral.coordinator.compat_ao_schemas import (
    AoCompleted,
    AoRegister,
    CompletedBody,
    RegisterBody,
)
from corral.coordinator.schemas import (
    AgentTokenBody,
    EventsBody,
    LeaseRef,
    LogsBody,
    LogsEvent,
    ReportBody,
    RunnerHeartbeat,
    RunnerRef,
    SessionEvent,
    SessionSeenBody,
    StartedEvent,
    iso,
    run_assignment_json,
    runner_json,
)
from corral.coordinator.service import Coordinator
from corral.errors import CoordinatorLeaving, InvalidRequest
from corral.ids import RunId, RunnerId
from corral.runners import Held, RunnerSync
from corral.runs import RunStatus

# An agent token lives while its attempt holds the run, and never longer than this.
AGENT_TOKEN_TTL_S = 24 * 3600.0

router = APIRouter(
    prefix="/runner", tags=["runner protocol"], dependencies=[require(Access.RUNNER)]
)


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


def _staying(request: Request) -> Coordinator:
    """The coordinator, unless it is stopping: then a runner's call is answered
    ``coordinator_leaving`` (503), and the runner takes it to another coordinator at once,
    keeping its runs — as the WebSocket runner told by its close reason."""
    coordinator = _coordinator(request)
    if coordinator.leaving:
        raise CoordinatorLeaving("this coordinator is stopping: call another")
    return coordinator


async def _as_runner(request: Request, runner_id: str, *, staying: bool = False) -> Coordinator:
    """The coordinator, once the caller is known to be the runner it names: a runner's id
    belongs to the token it registered with (``runner_not_yours`` for any other).
    ``staying``: refused while the coordinator stops (corral's runner protocol: its runner
    moves on; the seed's per-run reports are still taken, its runner may not retry them)."""
    coordinator = _staying(request) if staying else _coordinator(request)
    await coordinator.check_runner(principal_of(request), runner_id)
    return coordinator


@contextlib.asynccontextmanager
async def hangup(
    request: Request, leaving: asyncio.Event | None = None
) -> AsyncIterator[asyncio.Future[None]]:
    """Done when the client of a long-poll hangs up (a runner draining or restarting), or
    once ``leaving`` is set (the coordinator stops), so the wait ends at once instead of
    holding the request to its timeout."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def either() -> None:
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(disconnected())]
        if leaving is not None:
            waits.append(asyncio.ensure_future(leaving.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    watcher = asyncio.ensure_future(either())
    try:
        yield watcher
    finally:
        watcher.cancel()


def _nothing_came(coordinator: Coordinator) -> Response:
    """A long-poll's empty answer (204), or ``coordinator_leaving`` if it ended because
    the coordinator stops."""
    if coordinator.leaving:
        raise CoordinatorLeaving("this coordinator is stopping: call another")
    return Response(status_code=204)


def _sync_json(sync: RunnerSync) -> dict[str, Any]:
    return {"abandon": sync.abandon}


@router.post("/register", response_model=None)
async def register(body: RegisterBody, request: Request) -> dict[str, Any] | Response:
    """corral's runner, or (its body tells) the seed system's (``compat_ao``)."""
    if isinstance(body, AoRegister):
        return await compat_ao.register(body, request)
    coordinator = _staying(request)
    runner, sync = await coordinator.register(body, principal_of(request))
    settings = coordinator.settings
    return {
        **runner_json(runner),
        **_sync_json(sync),
        "heartbeat_interval_s": settings.heartbeat_interval_s,
        "lost_after_s": settings.lost_after_s,
        "poll_timeout_s": settings.poll_timeout_s,
    }


@router.get("/runs", response_model=None, responses={204: {"description": "no run came"}})
async def poll_runs(
    request: Request,
    runner_id: str,
    max_runs: Annotated[int | None, Query(ge=0, le=1024)] = None,
    timeout: Annotated[float | None, Query(ge=0, le=300)] = None,
) -> dict[str, Any] | Response:
    """Long-poll: claim up to ``max_runs`` runs (``{"runs": [...]}``), waiting up to the
    poll timeout; 204 if none. Without ``max_runs``, the seed's form: ``{"run": {...}}``."""
    coordinator = await _as_runner(request, runner_id, staying=max_runs is not None)
    wait = coordinator.settings.poll_timeout_s if timeout is None else timeout
    if max_runs is None:
        async with hangup(request) as gone:
            runner = await coordinator.in_thread(coordinator.store.runners.get, runner_id)
            if compat_ao.speaks_ao(runner):
                return await compat_ao.poll(request, runner, wait, gone)
            run = await seed_wire.poll_one(coordinator, RunnerId(runner_id), wait, gone)
            return seed_wire.seed_poll_answer(run)
    # corral's runner: a poll ends when the coordinator stops (it claims nothing then)
    async with hangup(request, coordinator.left) as gone:
        runs = await coordinator.poll(RunnerId(runner_id), max_runs, wait, gone)
    if not runs:
        return _nothing_came(coordinator)
    return {"runs": [run_assignment_json(r) for r in runs]}


@router.get("/control", response_model=None, responses={204: {"description": "no order came"}})
async def control(
    request: Request,
    runner_id: str,
    timeout: Annotated[float | None, Query(ge=0, le=300)] = None,
    after: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any] | Response:
    """Long-poll for the runner's commands (``cancel_run`` of a run it holds), numbered as
    on the WebSocket link: ``{"commands": [{"idx": …, "body": {…}}]}``, those after
    ``after``; 204 if none came. ``after``: the last one the runner has handled, which this
    call acknowledges (it is not sent again)."""
    coordinator = await _as_runner(request, runner_id, staying=True)
    wait = coordinator.settings.poll_timeout_s if timeout is None else timeout
    async with hangup(request, coordinator.left) as gone:
        commands = await coordinator.control(RunnerId(runner_id), after, wait, gone)
    if not commands:
        return _nothing_came(coordinator)
    return {"commands": [{"idx": c.idx, "body": c.body} for c in commands]}


@router.post("/heartbeat")
async def heartbeat(body: RunnerHeartbeat, request: Request) -> dict[str, Any]:
    held = None if body.held is None else [Held(RunId(h.run_id), h.attempt) for h in body.held]
    coordinator = await _as_runner(request, body.runner_id, staying=True)
    return _sync_json(await coordinator.heartbeat(body.runner_id, held))


@router.post("/deregister")
async def deregister(body: RunnerRef, request: Request) -> dict[str, Any]:
    coordinator = await _as_runner(request, body.runner_id)
    return runner_json(await coordinator.deregister(body.runner_id))


@router.post("/runs/{run_id}/started")
async def started(run_id: str, body: LeaseRef, request: Request) -> dict[str, Any]:
    attempt = await _attempt(run_id, body, request)
    event = StartedEvent(type="started", run_id=run_id, attempt=attempt)
    await _coordinator(request).apply_event(body.runner_id, event)
    return {"ok": True}


@router.post("/runs/{run_id}/session")
async def session_seen(run_id: str, body: SessionSeenBody, request: Request) -> dict[str, Any]:
    attempt = await _attempt(run_id, body, request)
    event = SessionEvent(type="session", run_id=run_id, attempt=attempt, session_id=body.session_id)
    await _coordinator(request).apply_event(body.runner_id, event)
    return {"ok": True}


@router.post("/runs/{run_id}/agent-token")
async def agent_token(run_id: str, body: AgentTokenBody, request: Request) -> dict[str, Any]:
    """A token for the agent of this attempt of the run (``corral.coordinator.scope``): it
    acts for the run's session only, and only while the attempt holds the run."""
    coordinator = await _as_runner(request, body.runner_id)
    token, secret = await coordinator.in_thread(
        coordinator.store.tokens.mint_for_run,
        run_id,
        body.runner_id,
        body.attempt,
        coordinator.clock.now(),
        AGENT_TOKEN_TTL_S,
    )
    return {"token": secret, "token_id": token.id, "expires_at": iso(token.expires_at)}


@router.post("/runs/{run_id}/logs")
async def logs(run_id: str, body: LogsBody, request: Request) -> dict[str, Any]:
    attempt = await _attempt(run_id, body, request)
    event = LogsEvent(type="logs", run_id=run_id, attempt=attempt, lines=body.lines)
    await _coordinator(request).apply_event(body.runner_id, event)
    return {"ok": True, "lines": len(body.lines)}


@router.post("/runs/{run_id}/completed")
async def completed(run_id: str, body: CompletedBody, request: Request) -> dict[str, Any]:
    if isinstance(body, AoCompleted):
        return await compat_ao.completed(run_id, body, request)
    if body.status not in (None, "completed"):
        raise InvalidRequest(f"/completed cannot report status {body.status!r}; use /failed")
    return await _report(run_id, body, RunStatus.COMPLETED, request)


@router.post("/runs/{run_id}/failed")
async def failed(run_id: str, body: ReportBody, request: Request) -> dict[str, Any]:
    """Failed, timed out, cancelled — or ``status: pending`` to give the attempt back."""
    if body.status == "completed":
        raise InvalidRequest("/failed cannot report status 'completed'; use /completed")
    return await _report(run_id, body, RunStatus(body.status or "failed"), request)


@router.post("/events")
async def events(body: EventsBody, request: Request) -> dict[str, Any]:
    """Apply a batch of reports in order; each gets its own answer, so one refused
    report (a lost lease) does not hold back the others."""
    coordinator = await _as_runner(request, body.runner_id, staying=True)
    outcomes = await coordinator.apply_events(body.runner_id, body.events)
    return {
        "results": [
            {"ok": True} if error is None else {"ok": False, **error.to_dict()}
            for error in outcomes
        ]
    }


async def _report(
    run_id: str, body: ReportBody, status: RunStatus, request: Request
) -> dict[str, Any]:
    coordinator = _coordinator(request)
    attempt = await _attempt(run_id, body, request)
    if body.attempt is None and status is RunStatus.COMPLETED:
        await seed_wire.start_if_claimed(coordinator, run_id, body.runner_id)
    run = await coordinator.apply_event(body.runner_id, body.finished(run_id, attempt, status))
    assert run is not None  # a final report returns the run it finished
    return {"ok": True, "status": run.status}


async def _attempt(run_id: str, body: LeaseRef, request: Request) -> int:
    """The attempt a report is about, once the caller is known to be the runner it names
    (every report on a run goes through here first)."""
    coordinator = await _as_runner(request, body.runner_id)
    return await seed_wire.lease_attempt(coordinator, run_id, body.runner_id, body.attempt)
