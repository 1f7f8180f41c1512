"""The typed client reads a plan's task as the API writes it (``api_tasks.task_json``)."""

from __future__ import annotations

from corral.client.models import Task


def test_a_kept_worktree_is_read_as_its_path() -> None:
    """A task whose worktree was kept dirty (after a kill, for the user to look at) names it
    by path: the model said bool, and every ``tasks run`` watching such a plan died in
    pydantic's validation (found by the kill-at-random test, seed 161884596)."""
    path = "/tmp/repo/.corral/worktrees/a3"
    task = Task.model_validate(
        {"id": "a3", "task_id": "tsk_1", "title": "A3", "status": "ready", "worktree_kept": path}
    )
    assert task.worktree_kept == path
