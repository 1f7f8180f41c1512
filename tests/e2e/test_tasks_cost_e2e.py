"""An agent's cost counts whatever happens after it, end to end: the real ``corral tasks
run`` with the fake Claude, where the step after the agent (``git add``) fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from tasks_helpers import TaskRepo, file_directive, kill_when_journaled, task, write

RUN_TIMEOUT_S = 90.0


@pytest.fixture
def tr(tmp_path: Path) -> TaskRepo:
    return TaskRepo(tmp_path)


def test_a_cost_counts_for_the_budget_when_git_fails_after_the_agent(tr: TaskRepo) -> None:
    tr.install_broken_filter()  # the agent finishes, then `git add` fails
    spender = "Spends [fake:cost=0.5] " + write("out.bad", "x\n")
    plan = tr.write_plan(
        {
            "tasks": [
                task("spender", prompt=spender, priority=10, max_attempts=1),
                task("later", prompt="Later. " + file_directive("later")),
            ]
        }
    )
    assert tr.corral("plan", str(plan)).code == 0

    result = tr.corral("run", "--workers", "1", "--budget", "0.4", timeout=RUN_TIMEOUT_S)
    assert result.code != 0, str(result)
    assert "budget" in result.out, str(result)
    state = tr.status()
    tasks = {t["id"]: t for t in state["tasks"]}
    assert tasks["spender"]["status"] == "failed", tasks["spender"]
    assert tasks["spender"]["cost_usd"] == pytest.approx(0.5)
    assert state["project"]["cost_usd"] == pytest.approx(0.5)
    # The budget saw the cost: nothing more was claimed.
    assert tasks["later"]["status"] == "ready" and tasks["later"]["attempts"] == 0
    assert not tr.started("Later.")
    with tr.store() as store:
        run = store.runs.get(tasks["spender"]["run_id"])
        assert run.cost_usd == pytest.approx(0.5)
        assert run.session_id and store.sessions.get(run.session_id).cost_usd == pytest.approx(0.5)


def test_a_journaled_agents_cost_counts_when_the_rerun_fails_in_git(tr: TaskRepo) -> None:
    """Killed after the agent printed its result (journaled) but before its step was
    reported: the rerun reads the journal instead of running the agent again, then fails
    in git; the agent's cost still counts."""
    tr.install_broken_filter()
    lingers = "Lingers [fake:hang_after] [fake:cost=0.3] " + write("out.bad", "x\n")
    plan = tr.write_plan({"tasks": [task("t", prompt=lingers, max_attempts=1)]})
    assert tr.corral("plan", str(plan)).code == 0
    kill_when_journaled(tr, "t")

    result = tr.corral("run", "--workers", "1", timeout=RUN_TIMEOUT_S)
    assert result.code == 1, str(result)
    t = tr.tasks()["t"]
    assert t["status"] == "failed" and "external filter" in (t["last_error"] or ""), t
    assert tr.finished_per_prompt()[lingers] == 1  # not run again
    assert t["cost_usd"] == pytest.approx(0.3)
    assert tr.status()["project"]["cost_usd"] == pytest.approx(0.3)
