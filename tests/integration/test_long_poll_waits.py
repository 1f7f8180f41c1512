"""Waiting long-polls write nothing (the app in process, SQLite and PostgreSQL).

A claim is a write transaction; 2,000 waiting polls each trying one on arrival and on
every wake-up made ``GET /runs`` 2,000 times slower. Now only a poll the claim board
reserved a run for tries a claim: polls that come and wait while no run they could take
is pending make no claim at all, and a new run woken into by many polls is claimed by
one of them, with one claim. ``RunStore.claim`` is wrapped to count its calls (the real
store does the work).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from api_fixtures import error_code, running_api, wait_until

from corral.clock import FakeClock
from corral.coordinator.notifier import RUNS_AVAILABLE, runner_topic
from corral.coordinator.service import CLOCK_SKEW_S
from corral.coordinator.settings import CoordinatorSettings
from corral.ids import RunnerId
from corral.runs import NewRun, RunType
from corral.store.runs import RunStore

pytestmark = pytest.mark.anyio
POLLS = 20


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runner of every claim the coordinator tries."""
    tried: list[str] = []
    claim = RunStore.claim

    def counted(runs: RunStore, runner_id: RunnerId, *args: Any) -> Any:
        tried.append(runner_id)
        return claim(runs, runner_id, *args)

    monkeypatch.setattr(RunStore, "claim", counted)
    return tried


async def test_polls_that_wait_make_no_claim(db_url: str, claims: list[str]) -> None:
    async with running_api(CoordinatorSettings(db_url=db_url)) as api:
        runners = [await api.register(f"runner-{i}", labels=["linux"]) for i in range(POLLS)]
        polls = [asyncio.create_task(api.poll(r, timeout=1.0)) for r in runners]
        for _ in range(5):  # each wakes every waiting poll: none of them can take it
            await api.create_command("true", labels=["gpu"])
        answers = await asyncio.gather(*polls)
        assert [a.status_code for a in answers] == [204] * POLLS
        assert claims == []

        # A run they can take: one poll claims it, with one claim.
        polls = [asyncio.create_task(api.poll(r, timeout=3.0)) for r in runners]
        run_id = await api.create_command("true", labels=["linux"])
        answers = await asyncio.gather(*polls)
        got = [a.json()["runs"] for a in answers if a.status_code == 200]
        assert [[run["run_id"] for run in runs] for runs in got] == [[run_id]]
        assert len(claims) == 1
        assert (await api.run(run_id))["status"] == "claimed"


async def test_a_poll_arriving_after_the_run_claims_it_at_once(
    db_url: str, claims: list[str]
) -> None:
    async with running_api(CoordinatorSettings(db_url=db_url)) as api:
        runner = await api.register("runner-a")
        run_id = await api.create_command("true")
        response = await api.poll(runner, timeout=30.0)
        assert response.status_code == 200
        assert [run["run_id"] for run in response.json()["runs"]] == [run_id]
        assert claims == [runner]


async def test_a_poll_of_an_unknown_or_lost_runner_is_refused_at_once(
    db_url: str, claims: list[str]
) -> None:
    async with running_api(CoordinatorSettings(db_url=db_url)) as api:
        unknown = await api.poll("rnr_000000000000", timeout=30.0)
        assert unknown.status_code == 404
        runner = await api.register("runner-a")
        await api.client.post("/runner/deregister", json={"runner_id": runner})
        stopped = await api.poll(runner, timeout=30.0)
        assert stopped.status_code == 409
        assert stopped.json()["error"]["code"] == "runner_lost"
        assert claims == []


async def test_the_reconciler_wakes_polls_for_runs_another_process_wrote_once(
    db_url: str,
) -> None:
    clock = FakeClock()
    async with running_api(CoordinatorSettings(db_url=db_url), clock=clock) as api:
        coordinator, notifier = api.coordinator, api.coordinator.notifier
        runner = await api.register("runner-a")
        await coordinator.reconcile_once()
        waiting = asyncio.create_task(api.poll(runner, timeout=30.0))

        # Written to the database by someone else (no wake-up from this coordinator).
        other = coordinator.store.runs.create(
            NewRun(type=RunType.COMMAND, command=("true",)), clock.now()
        )
        clock.advance(1.0)
        await coordinator.reconcile_once()
        answer = await asyncio.wait_for(waiting, 10.0)
        assert [run["run_id"] for run in answer.json()["runs"]] == [other.id]

        # A run no runner can take wakes them when it comes, not at every pass after.
        coordinator.store.runs.create(
            NewRun(type=RunType.COMMAND, command=("true",), labels=("gpu",)), clock.now()
        )
        clock.advance(1.0)
        woken = notifier.event(RUNS_AVAILABLE)
        await coordinator.reconcile_once()
        assert woken.is_set()
        clock.advance(CLOCK_SKEW_S + 1.0)
        await coordinator.reconcile_once()  # still within the look back: once more
        woken = notifier.event(RUNS_AVAILABLE)
        clock.advance(1.0)
        await coordinator.reconcile_once()
        assert not woken.is_set()


async def test_a_stopping_coordinator_answers_long_polls_coordinator_leaving(db_url: str) -> None:
    """``leave`` (SIGTERM): the long-polls a runner has waiting here end at once with
    ``coordinator_leaving`` (503), and so do its next calls, so that it takes them to
    another coordinator at once, its runs kept, rather than after the grace cut them."""
    async with running_api(CoordinatorSettings(db_url=db_url)) as api:
        runner = await api.register("runner")
        poll = asyncio.create_task(api.poll(runner, timeout=60.0))
        control = asyncio.create_task(
            api.client.get("/runner/control", params={"runner_id": runner, "timeout": 60.0})
        )
        coordinator = api.coordinator
        await wait_until(
            lambda: (
                coordinator.metrics.polls_waiting._value.get() == 1
                and runner_topic(runner) in coordinator.notifier._events
            ),
            what="the poll and the control call to wait",
        )
        await coordinator.leave()
        answers = await asyncio.wait_for(asyncio.gather(poll, control), 10.0)
        answers += [await api.poll(runner), await api.heartbeat(runner)]
        assert [(a.status_code, error_code(a)) for a in answers] == [
            (503, "coordinator_leaving")
        ] * 4
        registered = await api.client.post("/runner/register", json={"name": "late"})
        assert (registered.status_code, error_code(registered)) == (503, "coordinator_leaving")
