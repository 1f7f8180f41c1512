"""``corral.AsyncClient`` against the app in process (SQLite and PostgreSQL): typed
answers, and every refusal raised with the API's stable code, nothing stored changed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from api_fixtures import TOKEN, running_api

from corral import AsyncClient
from corral.actors.lifecycle import ActorState, CrashPolicy
from corral.actors.model import NewActor
from corral.client import NewTask, Run
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import CorralError, InvalidRequest, NotFound, Unauthorized, UnknownAgent
from corral.runs import RunStatus
from corral.tasks.model import TaskStatus

pytestmark = pytest.mark.anyio


def _client(api_app: object, token: str = TOKEN) -> AsyncClient:
    return AsyncClient(
        "http://localhost",
        token=token,
        transport=httpx.ASGITransport(app=api_app),  # type: ignore[arg-type]
    )


async def test_runs_sessions_and_runners_come_back_typed(db_url: str) -> None:
    async with running_api(CoordinatorSettings(db_url=db_url)) as api, _client(api.app) as corral:
        created = await corral.run_command(["echo", "hi"], labels=["gpu"], priority=5)
        assert created.status is RunStatus.PENDING
        run = await corral.get_run(created.run_id)
        assert isinstance(run, Run)
        assert (run.type, run.command, run.labels, run.priority) == (
            "command",
            ["echo", "hi"],
            ["gpu"],
            5,
        )
        assert run.created_at is not None and run.created_at.tzinfo is not None
        assert not run.finished

        started = await corral.start_session("Summarise", session_name="demo")
        page = await corral.list_runs(limit=1)
        assert [r.run_id for r in page.runs] == [started.run_id]  # newest first
        assert page.next == started.run_id
        rest = await corral.list_runs(before=page.next)
        assert [r.run_id for r in rest.runs] == [created.run_id]
        pending = await corral.list_runs(status=["pending", "running"])
        assert {r.run_id for r in pending.runs} == {created.run_id, started.run_id}

        cancelled = await corral.cancel_run(created.run_id)
        assert cancelled.status is RunStatus.CANCELLED and cancelled.finished
        assert await corral.list_runners() == []
        profiles = await corral.agent_profiles()
        assert [a.name for a in profiles.agents] == ["claude"]
        stats = await corral.stats()
        assert stats.runs["cancelled"] == 1 and stats.runs["pending"] == 1
        logs = await corral.logs(created.run_id)
        assert (logs.lines, logs.next_after) == ([], 0)
        # to_json() is the coordinator's own JSON: times and statuses as it wrote them
        assert cancelled.to_json() == (await api.client.get(f"/runs/{created.run_id}")).json()


async def test_refusals_raise_the_api_error_with_its_code(db_url: str) -> None:
    async with running_api(CoordinatorSettings(db_url=db_url)) as api:
        before = api.snapshot()
        async with _client(api.app) as corral:
            with pytest.raises(NotFound) as missing:
                await corral.get_run("run_000000000000")
            assert missing.value.code == "run_not_found"
            with pytest.raises(NotFound) as no_session:
                await corral.session_result("nobody")
            assert no_session.value.code == "session_not_found"
            with pytest.raises(UnknownAgent) as agent:
                await corral.start_session("hi", agent_name="no-such-agent")
            assert agent.value.code == "unknown_agent"
            with pytest.raises(InvalidRequest) as invalid:
                await corral.create_run("command", command=["true"], max_attempts=0)
            assert invalid.value.code == "invalid_request"
            with pytest.raises(CorralError) as no_resume:
                await corral.resume_session("never-started", "again")
            assert no_resume.value.code == "session_not_found"
        async with _client(api.app, token="crl_wrong") as stranger:
            with pytest.raises(Unauthorized) as refused:
                await stranger.list_runs()
            assert refused.value.code in ("unauthorized", "invalid_token")
        assert api.snapshot() == before  # nothing stored changed


async def test_plans_and_tokens(db_url: str, tmp_path: Path) -> None:
    async with running_api(CoordinatorSettings(db_url=db_url)) as api, _client(api.app) as corral:
        project = await corral.ensure_project(str(tmp_path), "main", budget_usd=5.0)
        assert (project.repo_path, project.target_branch, project.budget_usd) == (
            str(tmp_path),
            "main",
            5.0,
        )
        tasks = [
            NewTask(id="schema", title="Schema"),
            {"id": "api", "title": "API", "after": ["schema"]},
        ]
        added = await corral.add_tasks(project.project_id, tasks)
        assert (sorted(added.created), added.updated) == (["api", "schema"], [])
        again = await corral.add_tasks(project.project_id, tasks)
        assert sorted(again.unchanged) == ["api", "schema"]
        status = await corral.plan_status(project.project_id)
        by_id = {t.id: t for t in status.tasks}
        assert by_id["api"].after == ["schema"]
        assert by_id["schema"].status is TaskStatus.READY
        with pytest.raises(InvalidRequest) as cycle:
            await corral.add_tasks(
                project.project_id, [{"id": "x", "title": "X", "after": ["nope"]}]
            )
        assert cycle.value.code == "unknown_dependency"
        with pytest.raises(NotFound):
            await corral.get_task(project.project_id, "missing")

        created = await corral.create_token("reader", name="ci")
        assert created.role == "reader" and created.token.startswith("crl_")
        assert [t.name for t in await corral.list_tokens()] == ["ci"]
        async with _client(api.app, token=created.token) as reader:
            assert (await reader.get_project(project.project_id)).project_id == project.project_id
            with pytest.raises(CorralError) as forbidden:
                await reader.run_command(["true"])
            assert forbidden.value.code == "forbidden"
        revoked = await corral.revoke_token(created.token_id)
        assert revoked.revoked_at is not None
        with pytest.raises(NotFound) as unknown:
            await corral.revoke_token("tok_missing")
        assert unknown.value.code == "token_not_found"


async def test_actors_are_listed_typed(db_url: str) -> None:
    async with running_api(CoordinatorSettings(db_url=db_url)) as api, _client(api.app) as corral:
        actor, created = await api.coordinator.actors.create(NewActor("agent", key="issue-7"))
        assert created
        page = await corral.list_actors(name="agent")
        (listed,) = page.actors
        assert (listed.actor_id, listed.name, listed.key) == (actor.id, "agent", "issue-7")
        assert isinstance(listed.state, ActorState) and listed.crash_policy is CrashPolicy.SLEEP
        assert await corral.get_actor(actor.id) == listed
        others = [s for s in ActorState if s is not listed.state]
        assert (await corral.list_actors(state=others)).actors == []
        assert (await corral.list_actors(state=[listed.state])).actors == [listed]
        with pytest.raises(InvalidRequest) as bad_state:
            await corral.list_actors(state="dancing")
        assert bad_state.value.code == "invalid_request"
        with pytest.raises(NotFound) as missing:
            await corral.get_actor("act_nope")
        assert missing.value.code == "actor_not_found"
