"""Pausing a plan, end to end: the real ``corral tasks`` CLI, the fake Claude held at a gate.

* ``tasks pause`` during a live ``tasks run`` stops new claims only: the running agent
  finishes and is merged, then the run exits with status 75 saying the plan is paused;
  the pause lasts (a new ``tasks run`` claims nothing) until ``tasks resume``;
* a task left ``in_progress`` by a killed ``tasks run`` shows as interrupted, and the next
  ``tasks run`` picks it up, paused or not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tasks_helpers import TaskRepo, file_directive, task, wait_for

RUN_TIMEOUT_S = 90.0
EXIT_PAUSED = 75


@pytest.fixture
def tr(tmp_path: Path) -> TaskRepo:
    return TaskRepo(tmp_path)


def gated_plan(tr: TaskRepo) -> Path:
    """``slow`` (claimed first) waits at the gate ``agent``; ``next`` is independent."""
    slow = f"Slow. [fake:wait_while={tr.gates / 'agent'}] " + file_directive("slow")
    return tr.write_plan(
        {
            "tasks": [
                task("slow", prompt=slow, priority=10),
                task("next", prompt="Next. " + file_directive("next")),
            ]
        }
    )


def test_pause_lets_the_running_agent_finish_and_lasts_until_resume(tr: TaskRepo) -> None:
    assert tr.corral("plan", str(gated_plan(tr))).code == 0
    tr.close_gate("agent")
    proc = tr.start("run", "--workers", "1")
    try:
        wait_for(lambda: tr.started("Slow."), what="slow's agent running")
        paused = tr.corral("pause")
        assert paused.code == 0, str(paused)
        tr.open_gate("agent")
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        tr.open_gate("agent")
        tr.kill_group(proc)
    log = tr.background_log()
    assert code == EXIT_PAUSED, log
    assert "paused by the user" in log and "corral tasks resume" in log, log
    tasks = tr.tasks()
    assert tasks["slow"]["status"] == "completed", tasks["slow"]
    assert tr.show("files/slow.txt") == "made by slow\n"
    assert tasks["next"]["status"] == "ready" and tasks["next"]["attempts"] == 0
    assert not tr.started("Next.")

    # The pause lasts: another run claims nothing, and says why.
    again = tr.corral("run", "--workers", "1", timeout=RUN_TIMEOUT_S)
    assert again.code == EXIT_PAUSED, str(again)
    assert "paused" in again.out
    assert tr.status()["project"]["paused"] is True
    assert not tr.started("Next.")

    assert tr.corral("resume").code == 0
    resumed = tr.corral("run", "--workers", "1", timeout=RUN_TIMEOUT_S)
    assert resumed.code == 0, str(resumed)
    assert tr.tasks()["next"]["status"] == "completed"
    assert tr.show("files/next.txt") == "made by next\n"
    assert sorted(tr.finished_per_prompt().values()) == [1, 1]  # each agent finished once


def test_a_task_left_by_a_killed_run_shows_interrupted_and_is_picked_up(tr: TaskRepo) -> None:
    assert tr.corral("plan", str(gated_plan(tr))).code == 0
    tr.close_gate("agent")
    proc = tr.start("run", "--workers", "1")
    try:
        wait_for(lambda: tr.started("Slow."), what="slow's agent running")
    finally:
        tr.kill_group(proc)
    assert tr.tasks()["slow"]["status"] == "in_progress"
    shown = tr.corral("status")
    assert shown.code == 0, str(shown)
    row = next(line for line in shown.out.splitlines() if "slow" in line)
    assert "interrupted" in row, shown.out
    assert tr.tasks()["slow"]["interrupted"] is True

    # Paused meanwhile: the next run still finishes what was under way, claims nothing new.
    assert tr.corral("pause").code == 0
    tr.open_gate("agent")
    result = tr.corral("run", "--workers", "1", timeout=RUN_TIMEOUT_S)
    assert result.code == EXIT_PAUSED, str(result)
    tasks = tr.tasks()
    assert tasks["slow"]["status"] == "completed" and tasks["slow"]["attempts"] == 1
    assert not tasks["slow"]["interrupted"]
    assert tr.show("files/slow.txt") == "made by slow\n"
    assert tasks["next"]["status"] == "ready" and not tr.started("Next.")
    assert "interrupted" not in tr.corral("status").out
