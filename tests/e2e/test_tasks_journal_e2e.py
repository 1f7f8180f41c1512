"""An agent's result on disk outlives the run it came from: a task whose run was given up
(its runner lost once too often: kill after kill) does not run its finished agent again in
its next run, while a task the store started over (retry, conflict handed back) does."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tasks_helpers import TaskRepo, kill_when_journaled, task, write

RUN_TIMEOUT_S = 90.0


@pytest.fixture
def tr(tmp_path: Path) -> TaskRepo:
    return TaskRepo(tmp_path)


def test_a_journaled_result_survives_its_run_being_given_up(tr: TaskRepo) -> None:
    lingers = "Lingers [fake:hang_after] " + write("out.txt", "x\n")
    plan = tr.write_plan({"tasks": [task("t", prompt=lingers)]})
    assert tr.corral("plan", str(plan)).code == 0
    kill_when_journaled(tr, "t")
    # As if the run had been killed as often as a run may be: the next tasks run gives it
    # up (no attempts left) and the task goes on in a new run.
    with sqlite3.connect(tr.db_path) as db:
        db.execute("UPDATE runs SET attempts = max_attempts WHERE task_id IS NOT NULL")

    result = tr.corral("run", "--workers", "1", "--retry-backoff", "0.2", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, str(result)
    t = tr.tasks()["t"]
    assert t["status"] == "completed" and t["attempts"] == 2, t
    assert tr.show("out.txt") == "x\n"
    starts = [e for e in tr.ledger_events() if e["event"] == "start"]
    assert len(starts) == 1, starts  # the agent did not run again
