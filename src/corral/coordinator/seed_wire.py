"""The seed's own runner wire (seed 001), beside corral's: one run per poll, reports
without an attempt, heartbeats without ``held``.

A seed runner asks ``GET /runner/runs?runner_id=…`` and gets ``{"run": {...}}`` or 204;
it reports ``{runner_id}`` / ``{runner_id, error}``. Everything here translates into the
coordinator's own operations:

- the attempt of a report is the lease the runner holds (a runner that does not hold the
  run is refused, as with corral's own runner);
- a seed runner never says which runs it holds, but it reports ``started`` for every run
  it receives as soon as it has spawned it. A run it claimed and never started, long after
  the claim, was never received (the poll's answer was lost: the client hung up, the
  coordinator was killed between the claim's commit and the answer). Its next poll gives
  such runs back, so no run is swallowed by a lost answer. "Long after" is the runner-lost
  threshold: a runner that cannot start a run in that time would not be heard from either.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import Response

from corral.coordinator.schemas import FinishedEvent, StartedEvent, run_assignment_json
from corral.coordinator.service import Coordinator
from corral.errors import CorralError, LeaseLost
from corral.ids import RunnerId
from corral.runs import Run, RunStatus


async def lease_attempt(
    coordinator: Coordinator, run_id: str, runner_id: str, attempt: int | None
) -> int:
    """The attempt a report is about: the one given, else the lease ``runner_id`` holds."""
    if attempt is not None:
        return attempt
    run = await coordinator.in_thread(coordinator.store.runs.get, run_id)
    if run.runner_id != runner_id:
        raise LeaseLost(
            f"run {run_id} is not held by runner {runner_id} (holder: {run.runner_id})",
            run_id=run_id,
        )
    return run.attempts


async def start_if_claimed(coordinator: Coordinator, run_id: str, runner_id: str) -> None:
    """A seed runner's ``started`` may have been lost (it does not retry it): its final
    report on a run still ``claimed`` starts the run first, on the same lease."""
    run = await coordinator.in_thread(coordinator.store.runs.get, run_id)
    if run.status is RunStatus.CLAIMED and run.runner_id == runner_id:
        event = StartedEvent(type="started", run_id=run_id, attempt=run.attempts)
        await coordinator.apply_event(runner_id, event)


async def give_back(coordinator: Coordinator, runs: list[Run], why: str) -> None:
    """Claims the runner never received go back to the queue, the attempt not counted."""
    for run in runs:
        assert run.runner_id is not None
        report = FinishedEvent(
            type="finished", run_id=run.id, attempt=run.attempts, status="pending", error=why
        )
        # It may have moved on meanwhile (started, cancelled, lost): nothing to give back.
        with contextlib.suppress(CorralError):
            await coordinator.apply_event(run.runner_id, report)


async def give_back_unstarted(coordinator: Coordinator, runner_id: RunnerId) -> None:
    claimed = await coordinator.in_thread(
        coordinator.store.runs.list, statuses=[RunStatus.CLAIMED], runner_id=runner_id
    )
    # Spawning a process and reporting it started takes a seed runner well under a second.
    cutoff = coordinator.clock.now() - coordinator.settings.lost_after_s
    stale = [r for r in claimed if (r.claimed_at or 0) < cutoff]
    await give_back(coordinator, stale, "claimed but never started: the poll's answer was lost")


async def poll_one(
    coordinator: Coordinator, runner_id: RunnerId, timeout_s: float, gone: asyncio.Future[None]
) -> Run | None:
    """Claim one run for a seed runner, waiting up to ``timeout_s``; None when none came."""
    await give_back_unstarted(coordinator, runner_id)
    runs = await coordinator.poll(runner_id, 1, timeout_s, gone)
    if runs and gone.done():
        # The runner hung up while its run was being claimed: nobody will read the answer.
        await give_back(coordinator, runs, "the runner hung up before the claim was answered")
        return None
    return runs[0] if runs else None


def seed_poll_answer(run: Run | None) -> dict[str, Any] | Response:
    """The seed's poll answer: ``{"run": {...}}`` or 204."""
    if run is None:
        return Response(status_code=204)
    return {"run": run_assignment_json(run)}
