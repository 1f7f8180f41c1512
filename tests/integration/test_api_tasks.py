"""The task-graph REST API on SQLite and PostgreSQL: importing tasks in any order, and
graphs it must refuse (unknown blockers, cycles, duplicates) with a 4xx, a stable code and
nothing stored. No graph, however it is ordered or tangled, gets a 500.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from api_fixtures import Api, error_code, running_api, wait_until

from corral.coordinator.claims import ClaimBoard
from corral.coordinator.settings import CoordinatorSettings
from corral.ids import RunId

pytestmark = pytest.mark.anyio

GRAPH_CODES = {"unknown_dependency", "dependency_cycle", "duplicate_task"}


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url)


def task(key: str, *after: str) -> dict[str, Any]:
    return {"id": key, "title": f"task {key}", "after": list(after)}


async def project(api: Api) -> str:
    response = await api.client.post("/projects", json={"repo_path": "/r", "target_branch": "main"})
    assert response.status_code == 200, response.text
    pid: str = response.json()["project_id"]
    return pid


async def add(api: Api, pid: str, *tasks: dict[str, Any]) -> Any:
    return await api.client.post(f"/projects/{pid}/tasks", json={"tasks": list(tasks)})


async def stored(api: Api, pid: str) -> dict[str, dict[str, Any]]:
    response = await api.client.get(f"/projects/{pid}/tasks")
    assert response.status_code == 200, response.text
    return {t["id"]: t for t in response.json()["tasks"]}


async def test_a_task_may_come_before_its_blockers(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        pid = await project(api)
        response = await add(api, pid, task("b", "a"), task("c", "b", "a"), task("a"))
        assert response.status_code == 200, response.text
        assert response.json()["created"] == ["b", "c", "a"]
        tasks = await stored(api, pid)
        assert {k: t["status"] for k, t in tasks.items()} == {
            "a": "ready",
            "b": "blocked",
            "c": "blocked",
        }
        assert tasks["c"]["after"] == ["a", "b"]
        again = await add(api, pid, task("b", "a"), task("c", "b", "a"), task("a"))
        assert again.status_code == 200 and again.json()["unchanged"] == ["b", "c", "a"]


@pytest.mark.parametrize(
    ("tasks", "code"),
    [
        ([task("b", "a"), task("c", "nope"), task("a")], "unknown_dependency"),
        ([task("a", "c"), task("b", "a"), task("c", "b")], "dependency_cycle"),
        ([task("a", "a")], "dependency_cycle"),
        ([task("a"), task("b", "a"), task("a")], "duplicate_task"),
    ],
    ids=["unknown", "cycle", "self", "duplicate"],
)
async def test_a_bad_graph_is_a_422_with_a_stable_code(
    settings: CoordinatorSettings, tasks: list[dict[str, Any]], code: str
) -> None:
    async with running_api(settings) as api:
        pid = await project(api)
        assert (await add(api, pid, task("old"))).status_code == 200
        response = await add(api, pid, *tasks)
        assert response.status_code == 422, response.text
        assert error_code(response) == code
        assert list(await stored(api, pid)) == ["old"]


async def test_changing_a_stored_tasks_blockers_is_refused(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        pid = await project(api)
        assert (await add(api, pid, task("a"), task("b"))).status_code == 200
        response = await add(api, pid, task("b", "a"))
        assert response.status_code == 422 and error_code(response) == "dependencies_changed"


async def test_no_graph_gets_a_500(settings: CoordinatorSettings) -> None:
    """Random graphs in random order: some valid, some with unknown blockers, cycles or
    duplicates, some naming tasks stored by an earlier import. Each is stored whole or
    refused whole with one of the graph codes."""
    rng = random.Random(8)
    async with running_api(settings) as api:
        pid = await project(api)
        known: set[str] = set()
        for round_ in range(40):
            keys = [f"r{round_}t{i}" for i in range(rng.randint(1, 8))]
            pool = keys + sorted(known) + ["ghost"] * (rng.random() < 0.1)
            batch = [task(k, *rng.sample(pool, rng.randint(0, min(3, len(pool))))) for k in keys]
            if rng.random() < 0.1:
                batch.append(dict(rng.choice(batch)))
            rng.shuffle(batch)
            response = await add(api, pid, *batch)
            assert response.status_code in (200, 422), response.text
            if response.status_code == 422:
                assert error_code(response) in GRAPH_CODES
                assert set(await stored(api, pid)) == known
            else:
                known.update(keys)
                tasks = await stored(api, pid)
                assert set(tasks) == known
                for t in batch:
                    assert tasks[t["id"]]["after"] == sorted(set(t["after"]))


async def test_a_task_finished_over_http_wakes_a_poll_for_its_dependent(
    settings: CoordinatorSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST /runner/runs/{id}/completed`` wakes waiting polls for the runs it scheduled,
    as the socket's finished event does. The reconciler never runs here (``running_api``
    leaves it off): only the report's wake-up can hand the dependent's run to the poll."""
    looks: list[list[RunId] | None] = []  # what each poll's look at the claim board found
    reserve = ClaimBoard.reserve

    async def looked(board: ClaimBoard, *args: Any) -> list[RunId] | None:
        looks.append(found := await reserve(board, *args))
        return found

    monkeypatch.setattr(ClaimBoard, "reserve", looked)
    async with running_api(settings) as api:
        pid = await project(api)
        assert (await add(api, pid, task("a"), task("b", "a"))).status_code == 200
        started = await api.client.post(f"/projects/{pid}/start", json={"workers": 1})
        tasks = await stored(api, pid)
        assert started.json()["scheduled"] == [tasks["a"]["task_id"]], started.text
        runner = await api.register("runner-a")
        blocker = await api.claim_one(runner)
        waiting = asyncio.create_task(api.poll(runner, timeout=30.0))
        await wait_until(lambda: [] in looks, what="the poll to find nothing and wait")

        await api.started(blocker["run_id"], runner)
        done = await api.complete(blocker["run_id"], runner, task={"outcome": "merged"})
        assert done.status_code == 200, done.text

        answer = await waiting  # 204 after 30 s if nothing woke it
        assert answer.status_code == 200, answer.text
        [run] = answer.json()["runs"]
        assert run["task_id"] == tasks["b"]["task_id"]
        assert (await stored(api, pid))["b"]["status"] == "claimed"


async def test_a_tasks_cancel_sent_again_changes_nothing_and_cancels_its_run(
    settings: CoordinatorSettings,
) -> None:
    """A task's cancel is the task's, then its run's. Sent again — the first cut off between
    the two, its answer lost — it answers the task as it is and cancels the run."""
    async with running_api(settings) as api:
        pid = await project(api)
        assert (await add(api, pid, task("a"), task("b", "a"))).status_code == 200
        await api.client.post(f"/projects/{pid}/start", json={"workers": 1})
        runner = await api.register("runner-a")
        run = await api.claim_one(runner)
        store, now = api.coordinator.store, api.coordinator.clock.now()
        first = await asyncio.to_thread(store.tasks.cancel, pid, "a", now)  # cut off here
        assert (await api.run(run["run_id"]))["cancel_requested"] is False
        again = await api.client.post(f"/projects/{pid}/tasks/a/cancel")
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "cancelled"
        assert again.json()["finished_at"] == (await stored(api, pid))["a"]["finished_at"]
        assert first.finished_at == now  # the first cancel's time, kept
        assert (await api.run(run["run_id"]))["cancel_requested"] is True
        assert (await stored(api, pid))["b"]["status"] == "blocked_by_failure"
        twice = await api.client.post(f"/projects/{pid}/tasks/a/cancel")
        assert twice.status_code == 200 and twice.json() == again.json()
