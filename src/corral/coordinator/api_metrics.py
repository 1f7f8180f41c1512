"""``GET /metrics``: the coordinator's figures for Prometheus (see ``metrics``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from corral.coordinator.auth import Access, require
from corral.coordinator.metrics import CONTENT_TYPE
from corral.coordinator.service import Coordinator

router = APIRouter()


@router.get(
    "/metrics",
    tags=["meta"],
    dependencies=[require(Access.READ)],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Runs by state and outcome, runners, runner links, claims, dispatch latency, event
    subscribers and store latency, in Prometheus' text format (a reader token will do)."""
    coordinator: Coordinator = request.app.state.coordinator
    counts = await coordinator.in_thread(coordinator.store.runs.count_by_status)
    runners = await coordinator.in_thread(coordinator.store.runners.list)
    body = coordinator.metrics.scrape(counts, runners, len(coordinator.connections.by_runner))
    return Response(body, media_type=CONTENT_TYPE)
