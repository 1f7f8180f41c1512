"""One attempt of a task: worktree, agent, commit, merge — each step recorded as it ends.

    worktree   .corral/worktrees/<key> on branch corral/<key>, from the target branch
    agent      the task's agent runs in the worktree (skipped if a step record says it
               already finished: an agent that finished is never run again)
    committed  git add -A; commit "corral: <key> <title>" (none: the run made no changes)
    merging    merged into the target branch in the integration worktree, serialized

Each finished step is reported to the coordinator ("task_step") before the next starts,
and the agent's result is also written to a local journal first, so a kill -9 right after
the agent exits still does not run it again. A new attempt after a crash reads both and
continues from the last finished step; commit and merge are idempotent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from corral.agents.base import OutputObserver
from corral.assignment import Assignment
from corral.errors import CorralError
from corral.runner.attempt import Attempt
from corral.runner.environment import ALWAYS, allowed
from corral.runs import RunReport, RunStatus, RunType
from corral.workspaces import resolve
from corral.workspaces.workspace import Workspace

log = logging.getLogger("corral.runner")


# Worktree removals still going on after their attempts ended (kept referenced).
_CLEANUPS: set[asyncio.Task[None]] = set()


class TaskAttempt(Attempt):
    _mark = 0.0  # when the last step ended (monotonic)
    _journal: _Journal | None = None
    _cleanup: tuple[Workspace, str, str, Path] | None = None

    async def _work(self) -> RunReport:
        task: dict[str, Any] = self.run.task or {}
        if not task:
            return RunReport(RunStatus.FAILED, error="task run without its task")
        try:
            return await self._steps(task)
        except CorralError as exc:  # git or setup failed: the attempt fails, nothing is lost
            log.warning("task %s: %s", task.get("key"), exc)
            if kept := exc.details.get("worktree"):  # refused: kept for the user to inspect
                self._step("cleanup", {"worktree_kept": kept})
            return RunReport(RunStatus.FAILED, error=exc.message, task={"outcome": "error"})

    async def _steps(self, task: dict[str, Any]) -> RunReport:
        self._mark = time.monotonic()
        key, target = task["key"], task["target_branch"]
        workspace = Workspace(Path(task["repo_path"]))
        steps: dict[str, Any] = dict(task.get("steps") or {})
        journal = _Journal(Path(task["repo_path"]) / ".corral" / "journal" / f"{key}.json")
        self._journal = None if task.get("conflict") else journal
        if not steps:  # a fresh attempt, or the task started over (retry, conflict handed
            journal.clear_unless(self.run.id)  # back): a result of an earlier run is stale
        if "agent" not in steps and (saved := journal.read()):
            # The agent finished but its step never got through (killed in between; its
            # run perhaps given up since, the task going on in a new run).
            steps["agent"] = saved

        recorded = (steps.get("committed") or {}).get("commit")
        worktree = await asyncio.to_thread(
            workspace.prepare_worktree,
            key,
            target,
            setup_command=task.get("setup_command"),
            # What a command run would see: not the agent's API key (the executor's own).
            setup_env=allowed(self.base_env, (*ALWAYS, *self.settings.pass_env)),
            recorded_commit=recorded,
        )
        self._step("worktree", {"path": str(worktree)})

        agent = steps.get("agent")
        if agent is not None and "agent" not in (task.get("steps") or {}):
            # Read back from the journal: report it now, so that its cost counts (on this
            # run) even if a later step fails.
            self._step("agent", agent)
        conflicted: list[str] = []
        if agent is None:
            await asyncio.to_thread(workspace.record_baseline, worktree)
        if agent is None and task.get("conflict"):
            conflicted = await asyncio.to_thread(resolve.merge_target_into, worktree, target)
        if agent is None:
            report = await self._supervise(self._agent_run(task, worktree, conflicted))
            if report.status is not RunStatus.COMPLETED:
                return replace(report, task=report.task or {"outcome": "agent_failed"})
            if left := resolve.unresolved(worktree, conflicted):
                return replace(
                    report,
                    status=RunStatus.FAILED,
                    task={"outcome": "error"},
                    error=f"the agent left conflict markers in {', '.join(left)}",
                )
            agent = self._agent_record(report)
            journal.write(self.run.id, agent)
            self._step("agent", agent)
        # The agent's cost is counted with the run it ran in, once.
        cost = agent.get("cost_usd") if agent.get("run_id") == self.run.id else None
        done = RunReport(
            RunStatus.COMPLETED,
            session_id=agent.get("session_id"),
            result=agent.get("result"),
            cost_usd=cost,
        )

        message = f"corral: {key} {task['title']}"
        commit = await asyncio.to_thread(workspace.commit_all, worktree, message)
        if commit is None and recorded:
            # Made before a kill (and its reflog gone with a deleted branch, so commit_all
            # cannot tell): still the task's commit while its branch holds it.
            branch = f"refs/heads/{workspace.branch_name(key)}"
            if await asyncio.to_thread(workspace.is_ancestor, recorded, branch):
                commit = recorded
        if commit is None and not await asyncio.to_thread(
            workspace.branch_has_changes, key, target
        ):
            journal.clear()
            return replace(done, task={"outcome": "no_changes"})
        self._step("committed", {"commit": commit})

        self._step("merging", {})
        merged = await asyncio.to_thread(
            workspace.merge,
            key,
            target,
            strategy=task.get("merge_strategy", "merge"),
            message=f"corral: merge {key} {task['title']}",
        )
        if merged.status == "conflict":
            return replace(
                done,
                status=RunStatus.FAILED,
                error=f"merge conflict in {', '.join(merged.conflicted_paths)}",
                task={
                    "outcome": "merge_conflict",
                    "commit": commit,
                    "conflict": merged.conflict_detail,
                },
            )
        merge_seconds, merged_at = time.monotonic() - self._mark, time.time()
        journal.clear()
        self._cleanup = (workspace, key, target, worktree)
        return replace(
            done,
            task={
                "outcome": merged.status,
                "commit": commit,
                "merge_commit": merged.commit,
                "merge_seconds": merge_seconds,
                "merged_at": merged_at,
            },
        )

    def after_report(self) -> None:
        """Remove the merged task's worktree once the task is reported: its dependents
        need not wait for it. A dirty one is kept, and said so."""
        if self._cleanup is not None:
            task = asyncio.create_task(self._remove_worktree(*self._cleanup))
            _CLEANUPS.add(task)
            task.add_done_callback(_CLEANUPS.discard)

    async def _remove_worktree(
        self, workspace: Workspace, key: str, target: str, worktree: Path
    ) -> None:
        try:
            removed = await asyncio.to_thread(
                workspace.remove_worktree_if_clean, key, delete_branch_if_merged_into=target
            )
        except CorralError as exc:
            log.warning("task %s: could not remove its worktree: %s", key, exc)
            removed = False
        if not removed:
            self._step("cleanup", {"worktree_kept": str(worktree)})

    def _agent_record(self, report: RunReport) -> dict[str, Any]:
        return {
            "run_id": self.run.id,
            "session_id": report.session_id,
            "result": report.result,
            "cost_usd": report.cost_usd,
            "num_turns": report.num_turns,
        }

    def on_result(self, observer: OutputObserver) -> None:
        """Journal a successful result the moment it is printed, before the agent exits:
        a kill -9 from here on does not make the agent run again."""
        report = observer.outcome(0, None)
        if self._journal is not None and report.status is RunStatus.COMPLETED:
            self._journal.write(self.run.id, self._agent_record(report))

    def _agent_run(self, task: dict[str, Any], worktree: Path, conflicted: list[str]) -> Assignment:
        prompt = task["prompt"]
        if task.get("conflict"):
            target = task["target_branch"]
            prompt += (
                f"\n\nAn earlier attempt of this task could not be merged into {target}:\n"
                f"{task['conflict']}\n"
                f"{target} has now been merged into this worktree"
                + (
                    f"; resolve the conflict markers in {', '.join(conflicted)}"
                    if conflicted
                    else ""
                )
                + ", keeping both the task's change and what is already on "
                f"{target}."
            )
        return replace(
            self.run, type=RunType.START_SESSION, prompt=prompt, project_dir=str(worktree)
        )

    def _step(self, step: str, data: dict[str, Any]) -> None:
        """Report a finished step, with how long it took and when it ended."""
        now = time.monotonic()
        timing = {"seconds": round(now - self._mark, 6), "at": time.time()}
        self._mark = now
        self._post({"type": "task_step", "step": step, "data": {**data, **timing}})


class _Journal:
    """The agent's result on local disk, written (and synced) before it is reported."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def read(self) -> dict[str, Any] | None:
        agent = self._load().get("agent")
        return agent if isinstance(agent, dict) else None

    def clear_unless(self, run_id: str) -> None:
        if self.path.exists() and self._load().get("run_id") != run_id:
            self.clear()

    def write(self, run_id: str, agent: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"run_id": run_id, "agent": agent}, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
