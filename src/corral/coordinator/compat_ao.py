"""Wire compatibility with the seed system's own runner (claude-agent-orchestrator's
``agent-runner``): its registration, poll answers, reports and the session calls its
executors make, translated into corral's operations. Nothing here keeps state of its own
(but for when a stop order was last sent): runs, leases and sessions are corral's.

How that system's words map onto corral's:

- runner identity (hostname, project_dir, executor_profile, executor command) → one
  corral runner whose name is derived from it: the same identity registers as the same
  runner (its old runs given back first); a live one with that identity is refused (409);
- session id → ``ses_<hex>`` of the run that started the session, for every run of that
  session (a resume too), so the runner finds its live executor process by it; corral's
  own session id is the agent's, told by ``bind``;
- ``completed`` → completed with the result of the ``result`` event the executor posted
  (the report carries none); ``stopped`` → cancelled when a client asked, else the
  attempt is given back; a stop order → ``{"stop_sessions": [...]}``; a stopped or lost
  runner → ``{"deregistered": true}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from corral.coordinator import seed_wire
from corral.coordinator.auth import GRANTS, Access, principal_of, require
from corral.coordinator.compat_ao_schemas import (
    AoBind,
    AoCompleted,
    AoEvent,
    AoMetadata,
    AoRegister,
    AoSessionStatus,
    AoStopped,
    AoTokenRefusal,
    AoTokenRequest,
)
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic
from corral.coordinator.schemas import (
    FinalStatus,
    FinishedEvent,
    RegisterRunner,
    SessionEvent,
    run_assignment_json,
)
from corral.coordinator.service import Coordinator
from corral.errors import InvalidRequest, LeaseLost, NotFound
from corral.ids import RunId, RunnerId
from corral.runners import Runner, RunnerState
from corral.runs import Run, RunStatus, RunType

# Its runner and the executors it starts call all of these: a runner (or admin) token.
router = APIRouter(
    tags=["seed system's runner (claude-agent-orchestrator)"],
    dependencies=[require(Access.RUNNER)],
)

# Its runner authenticates as it does with Auth0: client credentials posted to
# ``https://{AUTH0_DOMAIN}/oauth/token``. Point that domain at the coordinator and make the
# client secret a corral runner token: the access token handed back is that same token.
token_router = APIRouter(tags=["seed system's runner (claude-agent-orchestrator)"])
TOKEN_LIFETIME_S = 3600  # the runner asks again this often (it refreshes a minute early)

TRANSPORT = "ao"  # runners.transport of a runner registered with that system's body
VERSION = "claude-agent-orchestrator"
PROFILE_LABEL = "ao-profile:"
SESSION_PREFIX = "ses_"
# A stop order the runner may not have received is sent again after this long.
STOP_RESEND_S = 5.0


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


async def _as_runner(request: Request, runner_id: str) -> Coordinator:
    """The coordinator, once the caller is known to be the runner it names (its token)."""
    coordinator = _coordinator(request)
    await coordinator.check_runner(principal_of(request), runner_id)
    return coordinator


def speaks_ao(runner: Runner) -> bool:
    return runner.transport == TRANSPORT


@token_router.post(
    "/oauth/token",
    response_model=None,
    responses={401: {"model": AoTokenRefusal, "description": "not a live runner token"}},
)
async def oauth_token(body: AoTokenRequest, request: Request) -> dict[str, Any] | JSONResponse:
    auth = _coordinator(request).auth
    secret = body.client_secret
    principal = auth.admin(secret) or await anyio.to_thread.run_sync(auth.lookup, secret)
    if principal is None or principal.role not in GRANTS[Access.RUNNER]:
        refusal = {"error": "access_denied", "error_description": "not a live runner token"}
        return JSONResponse(refusal, status_code=401)
    return {"access_token": secret, "token_type": "Bearer", "expires_in": TOKEN_LIFETIME_S}


# ---- registration -------------------------------------------------------------------------


def runner_name(body: AoRegister) -> str:
    command = str((body.executor or {}).get("command", ""))
    identity = "\0".join((body.hostname, body.project_dir, body.executor_profile, command))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return f"{body.hostname[:120]}/{body.executor_profile[:50]}/{digest}"


async def register(body: AoRegister, request: Request) -> dict[str, Any] | JSONResponse:
    coordinator = _coordinator(request)
    settings = coordinator.settings
    name = runner_name(body)
    known = [
        r for r in await coordinator.in_thread(coordinator.store.runners.list) if r.name == name
    ]
    runner_id = None
    if known:
        old = known[0]
        await coordinator.check_runner(principal_of(request), old.id)  # another token's: 403
        live = old.state in (RunnerState.ACTIVE, RunnerState.DRAINING)
        if live and old.last_heartbeat_at >= coordinator.clock.now() - settings.lost_after_s:
            return _duplicate(old, body)
        # A new process of the same runner: what the old one held is given back first.
        if old.state is not RunnerState.STOPPED:
            await coordinator.deregister(old.id)
        runner_id = old.id
    labels = [*(body.tags or []), f"{PROFILE_LABEL}{body.executor_profile}"]
    runner, _ = await coordinator.register(
        RegisterRunner(
            name=name,
            hostname=body.hostname,
            labels=labels,
            # That runner takes one run per poll, as many as it is given.
            slots=1024,
            version=VERSION,
            runner_id=runner_id,
        ),
        principal_of(request),
        transport=TRANSPORT,
    )
    return {
        "runner_id": runner.id,
        "poll_endpoint": "/runner/runs",
        "poll_timeout_seconds": max(1, round(settings.poll_timeout_s)),
        "heartbeat_interval_seconds": max(1, round(settings.heartbeat_interval_s)),
    }


def _duplicate(old: Runner, body: AoRegister) -> JSONResponse:
    detail = {
        "error": "duplicate_runner",
        "message": f"a runner with this identity is already online as {old.id}",
        "runner_id": old.id,
        "hostname": body.hostname,
        "project_dir": body.project_dir,
        "executor_profile": body.executor_profile,
    }
    # That system's runner reads ``detail``; corral's clients (and the API document) read
    # the one error body every other refusal has.
    error = {"code": "duplicate_runner", "message": detail["message"]}
    return JSONResponse({"error": error, "detail": detail}, status_code=409)


@router.delete("/runners/{runner_id}", tags=["runners"])
async def deregister(
    runner_id: str,
    request: Request,
    self_initiated: Annotated[bool, Query(alias="self")] = False,
) -> dict[str, Any]:
    """The runner leaving (``?self=true``) or being sent away: its runs are given back;
    a runner still polling is told ``{"deregistered": true}``."""
    await (await _as_runner(request, runner_id)).deregister(runner_id)
    by = "self" if self_initiated else "external"
    return {"ok": True, "message": "Runner deregistered", "initiated_by": by}


# ---- the poll -----------------------------------------------------------------------------


async def poll(
    request: Request, runner: Runner, timeout_s: float, gone: asyncio.Future[None]
) -> dict[str, Any] | Response:
    """Stop orders first, then one run; 204 after ``timeout_s`` with neither."""
    coordinator = _coordinator(request)
    if runner.state in (RunnerState.STOPPED, RunnerState.LOST):
        return {"deregistered": True}
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        woken = [
            coordinator.notifier.event(RUNS_AVAILABLE),
            coordinator.notifier.event(runner_topic(runner.id)),
        ]
        if stops := await _stops_due(request, runner.id):
            return {"stop_sessions": stops}
        run = await seed_wire.poll_one(coordinator, runner.id, 0, gone)
        if run is not None:
            return {"run": await _ao_run(coordinator, run)}
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0 or gone.done():
            return Response(status_code=204)
        waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(e.wait()) for e in woken}
        await asyncio.wait({*waiters, gone}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()


async def _stops_due(request: Request, runner_id: RunnerId) -> list[str]:
    """Sessions of started runs a client asked to cancel (the runner's stored cancel_run
    commands: ``CommandStore.cancels_to_stop``), each sent once (and again after
    ``STOP_RESEND_S``, in case that answer was lost: this wire acknowledges nothing)."""
    coordinator = _coordinator(request)
    sent: dict[str, dict[tuple[RunId, int], float]] | None = getattr(
        request.app.state, "ao_stops_sent", None
    )
    if sent is None:
        sent = request.app.state.ao_stops_sent = {}
    now = coordinator.clock.now()
    before = sent.get(runner_id, {})
    wanted: dict[tuple[RunId, int], float] = {}
    due: list[str] = []
    cancels = await coordinator.in_thread(coordinator.store.commands.cancels_to_stop, runner_id)
    for run_id in cancels:
        run = await coordinator.in_thread(coordinator.store.runs.get, run_id)
        if run.status is not RunStatus.RUNNING:
            continue  # not started yet: the runner has no process to stop
        key = (run.id, run.attempts)
        last = before.get(key)
        if last is not None and now - last < STOP_RESEND_S:
            wanted[key] = last
            continue
        wanted[key] = now
        due.append(await ao_session_id(coordinator, run))
    sent[runner_id] = wanted
    return due


async def _ao_run(coordinator: Coordinator, run: Run) -> dict[str, Any]:
    blueprint = (
        {"name": run.agent.name, "system_prompt": run.agent.system_prompt} if run.agent else None
    )
    return {
        **run_assignment_json(run),
        "session_id": await ao_session_id(coordinator, run),
        "parameters": {"prompt": run.prompt} if run.prompt is not None else {},
        "parent_session_id": None,
        "scope": None,
        "resolved_agent_blueprint": blueprint,
    }


# ---- reports ------------------------------------------------------------------------------


async def completed(run_id: str, body: AoCompleted, request: Request) -> dict[str, Any]:
    """The result is the one its executor posted as a ``result`` event."""
    coordinator = await _as_runner(request, body.runner_id)
    attempt = await seed_wire.lease_attempt(coordinator, run_id, body.runner_id, None)
    await seed_wire.start_if_claimed(coordinator, run_id, body.runner_id)
    run = await coordinator.in_thread(coordinator.store.runs.get, run_id)
    report = FinishedEvent(
        type="finished", run_id=run_id, attempt=attempt, status="completed", result=run.result
    )
    await coordinator.apply_event(body.runner_id, report)
    return {"ok": True}


@router.post("/runner/runs/{run_id}/stopped", tags=["runner protocol"])
async def stopped(run_id: str, body: AoStopped, request: Request) -> dict[str, Any]:
    """Cancelled when a client asked; otherwise the runner stopped it on its own (it is
    shutting down) and the attempt is given back, for another runner to take."""
    coordinator = await _as_runner(request, body.runner_id)
    attempt = await seed_wire.lease_attempt(coordinator, run_id, body.runner_id, None)
    run = await coordinator.in_thread(coordinator.store.runs.get, run_id)
    status: FinalStatus
    if run.cancel_requested or run.status is RunStatus.CANCELLED:
        status, error = "cancelled", f"stopped ({body.signal})"
    else:
        status, error = "pending", f"its runner stopped it ({body.signal}) unasked"
    report = FinishedEvent(
        type="finished", run_id=run_id, attempt=attempt, status=status, error=error
    )
    await coordinator.apply_event(body.runner_id, report)
    return {"ok": True}


@router.post("/runner/sessions/{session_id}/status", tags=["runner protocol"])
async def session_status(
    session_id: str, body: AoSessionStatus, request: Request
) -> dict[str, Any]:
    """A persistent executor ended between runs: no run changes; the session stays
    resumable (corral resumes a session with a new process)."""
    coordinator = await _as_runner(request, body.runner_id)
    await coordinator.in_thread(coordinator.store.runners.get, body.runner_id)
    await _resolve(coordinator, session_id)
    return {"ok": True}


# ---- the session calls of its executors -------------------------------------------------------


@router.post("/sessions/{session_id}/bind", tags=["sessions"])
async def bind(session_id: str, body: AoBind, request: Request) -> dict[str, Any]:
    """The executor's own session id is the agent session corral keeps."""
    coordinator = _coordinator(request)
    run = await _run_in_progress(request, session_id)
    assert run.runner_id is not None
    holder = await coordinator.in_thread(coordinator.store.runners.get, run.runner_id)
    if body.hostname and body.hostname != holder.hostname:
        raise LeaseLost(f"session {session_id} runs on {holder.hostname}, not {body.hostname}")
    await _session_seen(coordinator, run, body.executor_session_id)
    return {"ok": True, "session": await _session_json(coordinator, session_id)}


@router.post("/sessions/{session_id}/events", tags=["sessions"], status_code=201)
async def add_event(session_id: str, body: AoEvent, request: Request) -> dict[str, Any]:
    """A ``result`` event is the result of the run in progress; the others (messages,
    tool calls) are that system's dashboard feed, not kept."""
    if body.session_id != session_id:
        raise InvalidRequest("the event's session_id must be the one in the path")
    coordinator = _coordinator(request)
    if body.event_type != "result":
        await _resolve(coordinator, session_id)
        return {"ok": True}
    run = await _run_in_progress(request, session_id)
    assert run.runner_id is not None
    text = body.result_text
    if text is None and body.result_data is not None:
        text = json.dumps(body.result_data)
    if text is not None:
        now = coordinator.clock.now()
        record = coordinator.store.runs.record_result
        await coordinator.in_thread(record, run.id, run.runner_id, run.attempts, text, now)
    return {"ok": True}


@router.patch("/sessions/{session_id}/metadata", tags=["sessions"])
async def update_metadata(session_id: str, body: AoMetadata, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    if body.executor_session_id is not None:
        run = await _run_in_progress(request, session_id)
        assert run.runner_id is not None
        await _session_seen(coordinator, run, body.executor_session_id)
    return {"ok": True, "session": await _session_json(coordinator, session_id)}


@router.get("/sessions/{session_id}/affinity", tags=["sessions"])
async def affinity(session_id: str, request: Request) -> dict[str, Any]:
    """Where the session lives, for a resume: its host, directory and agent session."""
    coordinator = _coordinator(request)
    agent_session, _ = await _resolve(coordinator, session_id)
    if agent_session is None:
        raise NotFound(f"session {session_id} has not started yet", code="session_not_found")
    session = await coordinator.in_thread(coordinator.store.sessions.get, agent_session)
    runner = (
        await coordinator.in_thread(coordinator.store.runners.get, session.runner_id)
        if session.runner_id
        else None
    )
    profiles = [x for x in runner.labels if x.startswith(PROFILE_LABEL)] if runner else []
    return {
        "affinity": {
            "hostname": runner.hostname if runner else None,
            "project_dir": session.project_dir,
            "executor_profile": profiles[0].removeprefix(PROFILE_LABEL) if profiles else None,
            "executor_session_id": session.id,
        }
    }


# ---- session ids --------------------------------------------------------------------------


async def ao_session_id(coordinator: Coordinator, run: Run) -> str:
    """``ses_<hex>`` of the run that started the run's session."""
    if run.type is not RunType.RESUME_SESSION or not run.session_id:
        return SESSION_PREFIX + run.id.removeprefix("run_")
    runs = await coordinator.in_thread(
        coordinator.store.runs.list, session=run.session_id, limit=1000
    )
    starts = [r for r in runs if r.type is RunType.START_SESSION]
    first = min(starts, key=lambda r: (r.created_at, r.id)) if starts else run
    return SESSION_PREFIX + first.id.removeprefix("run_")


async def _resolve(coordinator: Coordinator, session_id: str) -> tuple[str | None, Run | None]:
    """The agent session (None before ``bind``) and the run in progress of a session id."""
    if not session_id.startswith(SESSION_PREFIX):
        raise NotFound.of("session", session_id)
    try:
        start = await coordinator.in_thread(
            coordinator.store.runs.get, "run_" + session_id.removeprefix(SESSION_PREFIX)
        )
    except NotFound:
        raise NotFound.of("session", session_id) from None
    if start.status.holds_lease or not start.session_id:
        return start.session_id, start if start.status.holds_lease else None
    held = await coordinator.in_thread(
        coordinator.store.runs.list,
        session=start.session_id,
        statuses=[RunStatus.CLAIMED, RunStatus.RUNNING],
        limit=1,
    )
    return start.session_id, (held[0] if held else None)


async def _run_in_progress(request: Request, session_id: str) -> Run:
    """The session's run in progress, if the caller is the runner that holds it."""
    coordinator = _coordinator(request)
    _, run = await _resolve(coordinator, session_id)
    if run is None:
        raise LeaseLost(f"session {session_id} has no run in progress")
    if run.runner_id is not None:
        await coordinator.check_runner(principal_of(request), run.runner_id)
    return run


async def _session_seen(coordinator: Coordinator, run: Run, agent_session: str) -> None:
    """The executor told its agent session: the run's ``session`` event."""
    assert run.runner_id is not None
    event = SessionEvent(
        type="session", run_id=run.id, attempt=run.attempts, session_id=agent_session
    )
    await coordinator.apply_event(run.runner_id, event)


async def _session_json(coordinator: Coordinator, session_id: str) -> dict[str, Any]:
    agent_session, run = await _resolve(coordinator, session_id)
    return {
        "session_id": session_id,
        "executor_session_id": agent_session,
        "status": "running" if run is not None else "finished",
    }
