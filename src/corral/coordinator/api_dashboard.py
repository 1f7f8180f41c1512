"""Routes the web dashboard needs beyond the others: its charts' series, and retrying a
finished run from its page."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from corral.coordinator.auth import Access, require
from corral.coordinator.schemas import CreateRun
from corral.coordinator.service import Coordinator
from corral.dashboard.charts import Window, charts
from corral.errors import Conflict, InvalidRequest
from corral.runs import Run, RunType

router = APIRouter()
READ, WRITE = require(Access.READ), require(Access.WRITE)
# The charts read at most this many of the newest runs (pages of CHART_PAGE): a bounded
# read however many runs are kept (5,000 took about 1 s on SQLite, 20,000 3 s: the
# charts page asks at most every 10 s). An aggregate query in the store would be cheaper.
CHART_RUNS = 5000
CHART_PAGE = 500


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


@router.get("/stats/charts", tags=["meta"], dependencies=[READ])
async def chart_series(
    request: Request,
    minutes: Annotated[int, Query(ge=1, le=1440, description="runs per minute over")] = 60,
    days: Annotated[int, Query(ge=1, le=90, description="durations and costs over")] = 14,
) -> dict[str, Any]:
    """Runs per minute by outcome, durations, cost per day and per agent: the dashboard's
    charts, from the runs created in the window (at most the newest 5,000)."""
    coordinator = _coordinator(request)
    window = Window(now=coordinator.clock.now(), minutes=minutes, days=days)
    runs = await coordinator.in_thread(_recent_runs, coordinator, window.since)
    return {**charts(runs, window), "runs_read": len(runs), "truncated": len(runs) >= CHART_RUNS}


def _recent_runs(coordinator: Coordinator, since: float) -> list[Run]:
    """The runs created since ``since``, newest first, page by page."""
    found: list[Run] = []
    before = None
    while len(found) < CHART_RUNS:
        page = coordinator.store.runs.list(before=before, limit=CHART_PAGE)
        found += [run for run in page if run.created_at >= since]
        if len(page) < CHART_PAGE or page[-1].created_at < since:
            break
        before = page[-1].id
    return found[:CHART_RUNS]


@router.post("/runs/{run_id}/retry", status_code=201, tags=["runs"], dependencies=[WRITE])
async def retry_run(run_id: str, request: Request) -> dict[str, Any]:
    """Run a finished run again, as a new run with the same spec (a task's run is retried
    with its task: ``POST /projects/{id}/tasks/{key}/retry``)."""
    coordinator = _coordinator(request)
    run = await coordinator.in_thread(coordinator.store.runs.get, run_id)
    if not run.status.is_terminal:
        raise Conflict(
            f"{run_id} is {run.status}: only a finished run is retried",
            code="run_not_finished",
            run_id=run_id,
            status=str(run.status),
        )
    if run.type is RunType.TASK:
        raise InvalidRequest(f"{run_id} is a task's run: retry its task")
    (created,) = await coordinator.create_runs([_same_spec(run)])
    return {"run_id": created.id, "status": created.status, "retry_of": run_id}


def _same_spec(run: Run) -> CreateRun:
    resumes = run.type is RunType.RESUME_SESSION
    return CreateRun.model_validate(
        {
            "type": run.type.value,
            "session_name": None if resumes else run.session_name,
            "session_id": run.session_id if resumes else None,
            "agent_name": run.agent_name,
            "prompt": run.prompt,
            "project_dir": run.project_dir,
            "command": list(run.command) or None,
            "labels": list(run.labels),
            "timeout_s": run.timeout_s,
            "idle_timeout_s": run.idle_timeout_s,
            "max_attempts": run.max_attempts,
            "priority": run.priority,
            "env": dict(run.env),
        }
    )
