"""REST routes for task graphs: projects, their tasks, and plan runs."""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from corral.agents.profiles import resolve
from corral.coordinator.auth import Access, require
from corral.coordinator.notifier import RUNS_AVAILABLE
from corral.coordinator.schemas import iso
from corral.coordinator.service import Coordinator
from corral.errors import IllegalTransition
from corral.runs import AgentSpec, Run
from corral.tasks.model import Project, Task, TaskSpec, TaskStatus
from corral.wire import WireModel
from corral.workspaces.names import BRANCH_PREFIX, check_branch, check_key

router = APIRouter(tags=["tasks"])
READ, WRITE = require(Access.READ), require(Access.WRITE)


class ProjectBody(WireModel):
    repo_path: str = Field(min_length=1, max_length=4096)
    target_branch: str = Field(description="checked as a plan file's (invalid_branch)")
    merge: str | None = Field(None, pattern="^(merge|ff)$")
    on_no_changes: str | None = Field(None, pattern="^(fail|complete)$")
    setup_command: list[str] | None = None
    budget_usd: float | None = Field(None, ge=0)
    retry_backoff_s: float | None = Field(None, ge=0)
    resolve_conflicts: bool | None = None


class TaskBody(WireModel):
    id: str = Field(description="checked as a plan file's (invalid_task_id)")
    title: str = Field(min_length=1, max_length=500)
    prompt: str | None = None
    after: list[str] = Field(default_factory=list)
    priority: int = Field(0, ge=-1000, le=1000)
    labels: list[str] = Field(default_factory=list)
    agent: str | None = None
    max_attempts: int = Field(3, ge=1, le=100)
    budget_usd: float | None = Field(None, ge=0)


class TasksBody(WireModel):
    tasks: list[TaskBody] = Field(min_length=1, max_length=20000)
    digest: str | None = None


class StartBody(WireModel):
    workers: int = Field(ge=1, le=256)


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


def _scheduled(coordinator: Coordinator, runs: list[Run]) -> None:
    if runs:
        coordinator.notifier.notify(RUNS_AVAILABLE)


def project_json(project: Project, tasks: list[Task] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "project_id": project.id,
        "repo_path": project.repo_path,
        "target_branch": project.target_branch,
        "merge": project.merge_strategy,
        "on_no_changes": project.on_no_changes,
        "setup_command": list(project.setup_command) if project.setup_command else None,
        "workers": project.workers,
        "paused": project.paused,
        "pause_reason": project.pause_reason,
        "budget_usd": project.budget_usd,
        "budget_reached": project.budget_reached,
        "cost_usd": project.cost_usd,
        "plan_digest": project.plan_digest,
        "resolve_conflicts": project.resolve_conflicts,
    }
    if tasks is not None:
        counts: dict[str, int] = {}
        for task in tasks:
            counts[task.status] = counts.get(task.status, 0) + 1
        body["counts"] = counts
    return body


def task_json(task: Task) -> dict[str, Any]:
    return {
        "id": task.key,
        "task_id": task.id,
        "title": task.title,
        "prompt": task.prompt,
        "status": task.status,
        "after": list(task.blocked_by),
        "priority": task.priority,
        "labels": list(task.labels),
        "agent": task.agent_name,
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "cost_usd": task.cost_usd,
        "budget_usd": task.budget_usd,
        "run_id": task.run_id,
        "steps": task.steps,
        "last_error": task.last_error,
        "conflict": task.conflict,
        "session_id": task.session_id,
        "branch": BRANCH_PREFIX + task.key,
        "commit": task.commit_sha,
        "merge_commit": task.merge_sha,
        "worktree_kept": task.worktree_kept,
        "interrupted": task.interrupted,
        "created_at": iso(task.created_at),
        "started_at": iso(task.started_at),
        "finished_at": iso(task.finished_at),
    }


@router.post("/projects", dependencies=[WRITE])
async def ensure_project(body: ProjectBody, request: Request) -> dict[str, Any]:
    """The project of a repository and target branch (created on first use)."""
    check_branch(body.target_branch, "target_branch: ")
    coordinator = _coordinator(request)
    project = await coordinator.in_thread(
        coordinator.store.projects.ensure,
        body.repo_path,
        body.target_branch,
        coordinator.clock.now(),
        merge_strategy=body.merge,
        on_no_changes=body.on_no_changes,
        setup_command=body.setup_command,
        budget_usd=body.budget_usd,
        retry_backoff_s=body.retry_backoff_s,
        resolve_conflicts=body.resolve_conflicts,
    )
    return project_json(project)


@router.get("/projects", dependencies=[READ])
async def list_projects(request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    projects = await coordinator.in_thread(coordinator.store.projects.list)
    return {"projects": [project_json(p) for p in projects]}


@router.get("/projects/{project_id}", dependencies=[READ])
async def get_project(project_id: str, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    project = await coordinator.in_thread(coordinator.store.projects.get, project_id)
    tasks = await coordinator.in_thread(coordinator.store.tasks.list, project_id)
    return project_json(project, tasks)


@router.post("/projects/{project_id}/tasks", dependencies=[WRITE])
async def add_tasks(project_id: str, body: TasksBody, request: Request) -> dict[str, Any]:
    """Add tasks; idempotent (an unchanged plan imported again changes nothing)."""
    for i, task in enumerate(body.tasks, 1):
        check_key(task.id, f"task #{i}: ")  # what a plan file's tasks are checked with
    coordinator = _coordinator(request)
    specs = [
        TaskSpec(
            key=t.id,
            title=t.title,
            prompt=t.prompt or t.title,
            after=tuple(t.after),
            priority=t.priority,
            labels=tuple(t.labels),
            agent=t.agent,
            max_attempts=t.max_attempts,
            budget_usd=t.budget_usd,
        )
        for t in body.tasks
    ]
    agents: dict[str, AgentSpec] = {s.key: resolve(coordinator.profiles, s.agent) for s in specs}
    result = await coordinator.in_thread(
        coordinator.store.tasks.add,
        project_id,
        specs,
        agents,
        coordinator.clock.now(),
        digest=body.digest,
    )
    runs = await coordinator.in_thread(
        coordinator.store.tasks.schedule, project_id, coordinator.clock.now()
    )
    _scheduled(coordinator, runs)
    return {"created": result.created, "updated": result.updated, "unchanged": result.unchanged}


@router.get("/projects/{project_id}/tasks", dependencies=[READ])
async def list_tasks(project_id: str, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    project = await coordinator.in_thread(coordinator.store.projects.get, project_id)
    tasks = await coordinator.in_thread(coordinator.store.tasks.list, project_id)
    return {"project": project_json(project, tasks), "tasks": [task_json(t) for t in tasks]}


@router.get("/projects/{project_id}/tasks/{key}", dependencies=[READ])
async def get_task(project_id: str, key: str, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    return task_json(await coordinator.in_thread(coordinator.store.tasks.get, project_id, key))


@router.post("/projects/{project_id}/start", dependencies=[WRITE])
async def start(project_id: str, body: StartBody, request: Request) -> dict[str, Any]:
    """Work through the plan with up to ``workers`` tasks at once."""
    coordinator = _coordinator(request)
    runs = await coordinator.in_thread(
        coordinator.store.tasks.start, project_id, body.workers, coordinator.clock.now()
    )
    _scheduled(coordinator, runs)
    return {"scheduled": [r.task_id for r in runs]}


@router.post("/projects/{project_id}/stop", dependencies=[WRITE])
async def stop(project_id: str, request: Request) -> dict[str, Any]:
    """Claim no more tasks; those running go on."""
    coordinator = _coordinator(request)
    project = await coordinator.in_thread(
        coordinator.store.tasks.stop, project_id, coordinator.clock.now()
    )
    return project_json(project)


@router.post("/projects/{project_id}/pause", dependencies=[WRITE])
async def pause(project_id: str, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    await coordinator.in_thread(
        coordinator.store.tasks.set_paused,
        project_id,
        True,
        coordinator.clock.now(),
        "paused by the user",
    )
    return {"paused": True}


@router.post("/projects/{project_id}/resume", dependencies=[WRITE])
async def resume(project_id: str, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    runs = await coordinator.in_thread(
        coordinator.store.tasks.set_paused, project_id, False, coordinator.clock.now()
    )
    _scheduled(coordinator, runs)
    return {"paused": False}


@router.post("/projects/{project_id}/tasks/{key}/retry", dependencies=[WRITE])
async def retry(project_id: str, key: str, request: Request) -> dict[str, Any]:
    """A failed, conflicted or cancelled task starts over; its dependents come back."""
    coordinator = _coordinator(request)
    task, runs = await coordinator.in_thread(
        coordinator.store.tasks.retry, project_id, key, coordinator.clock.now()
    )
    _scheduled(coordinator, runs)
    return task_json(task)


@router.post("/projects/{project_id}/tasks/{key}/cancel", dependencies=[WRITE])
async def cancel(project_id: str, key: str, request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    before = await coordinator.in_thread(coordinator.store.tasks.get, project_id, key)
    task = await coordinator.in_thread(
        coordinator.store.tasks.cancel, project_id, key, coordinator.clock.now()
    )
    # Its run too — again when the task's cancel is sent again: the first may have been cut
    # off between the two (a run's cancel sent twice changes nothing).
    if before.run_id and (before.status.is_active or before.status is TaskStatus.CANCELLED):
        with contextlib.suppress(IllegalTransition):  # the run ended meanwhile: nothing to do
            await coordinator.cancel(before.run_id)
    return task_json(task)
