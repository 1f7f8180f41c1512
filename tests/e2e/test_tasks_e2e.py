"""Task graphs end to end: real git repositories, the real ``corral tasks`` CLI (with its
embedded coordinator and local runner) as a subprocess, and the fake Claude as the agent.

* a 20-task plan (a diamond, a chain, independent tasks and a join) runs to completion:
  every change on main, every dependent built on its blockers' merges, the user's
  checkout untouched, no worktree left behind;
* two tasks changing the same line: one merges, the other ends ``merge_conflict`` with
  its commit kept on its branch, and main stays clean;
* ``kill -9`` of a plan run at each step of an attempt, then a second run: the plan
  completes, no agent that finished runs again, every change is merged exactly once;
* failing tasks exhaust their attempts, block their dependents, and come back on retry;
* bad plan files are refused with one line naming the problem, and write nothing.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from pathlib import Path

import pytest
from tasks_helpers import TaskRepo, file_directive, task, wait_for, write

RUN_TIMEOUT_S = 90.0
CONFLICT_MARKERS = re.compile(r"^(<<<<<<<|=======|>>>>>>>)( |$)", re.MULTILINE)


@pytest.fixture
def tr(tmp_path: Path) -> TaskRepo:
    return TaskRepo(tmp_path)


def merge_subjects(tr: TaskRepo, key: str) -> list[str]:
    return [s for s in tr.subjects() if s.startswith(f"corral: merge {key} ")]


def assert_clean_worktrees(tr: TaskRepo) -> None:
    """No task worktree left, and no worktree in the middle of a merge."""
    worktrees = tr.repo / ".corral" / "worktrees"
    left = sorted(p.name for p in worktrees.iterdir()) if worktrees.exists() else []
    assert left == [], f"worktrees left behind: {left}"
    listing = tr.git("worktree", "list", "--porcelain")
    paths = [
        line.removeprefix("worktree ")
        for line in listing.splitlines()
        if line.startswith("worktree ")
    ]
    for path in paths:
        assert not tr.git_ok("-C", path, "rev-parse", "-q", "--verify", "MERGE_HEAD"), path


def assert_checkout_untouched(tr: TaskRepo, before: dict[str, bytes]) -> None:
    assert tr.git("symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert tr.checkout_snapshot() == before


# ---- a whole plan ----------------------------------------------------------------------------


def test_a_plan_of_twenty_tasks_runs_to_completion(tr: TaskRepo) -> None:
    chain = [f"e{i}" for i in range(1, 11)]
    independent = [f"i{i}" for i in range(1, 6)]
    plan_tasks = [
        task("a"),
        task("b", "a"),
        task("c", "a"),
        task("d", "b", "c"),
        *(task(key, *chain[i - 1 : i]) for i, key in enumerate(chain)),
        *(task(key, priority=-1) for key in independent),
        task("join", "d", chain[-1], independent[-1]),
    ]
    assert len(plan_tasks) == 20
    plan = tr.write_plan({"target_branch": "main", "tasks": plan_tasks})
    before = tr.checkout_snapshot()

    imported = tr.corral("plan", str(plan))
    assert imported.code == 0, str(imported)
    assert "20 added" in imported.out
    again = tr.corral("plan", str(plan))
    assert again.code == 0 and "20 unchanged" in again.out, str(again)

    result = tr.corral("run", "--workers", "4", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, str(result)

    tasks = tr.tasks()
    assert {k: t["status"] for k, t in tasks.items()} == {t["id"]: "completed" for t in plan_tasks}
    retried = {k: (t["attempts"], t["last_error"]) for k, t in tasks.items() if t["attempts"] != 1}
    assert retried == {}, retried
    for key in tasks:
        assert tr.show(f"files/{key}.txt") == f"made by {key}\n"
        assert len(merge_subjects(tr, key)) == 1
        assert tr.subjects().count(f"corral: {key} Task {key}") == 1
    # Every dependent was built on top of its blockers' merges.
    edges = [(blocker, t["id"]) for t in plan_tasks for blocker in t.get("after", [])]
    assert len(edges) == 4 + 9 + 3
    for blocker, dependent in edges:
        merged = tasks[blocker]["merge_commit"]
        assert merged and tasks[dependent]["merge_commit"]
        assert tr.is_ancestor(merged, tasks[dependent]["commit"]), (blocker, dependent)
        assert tr.is_ancestor(merged, tasks[dependent]["merge_commit"]), (blocker, dependent)
    assert tr.git("rev-parse", "main").strip() in {t["merge_commit"] for t in tasks.values()}

    assert_checkout_untouched(tr, before)
    assert_clean_worktrees(tr)
    # Every agent ran once, in its own worktree.
    finished = tr.finished_per_prompt()
    assert sorted(finished.values()) == [1] * 20
    cwds = {Path(e["cwd"]).resolve() for e in tr.ledger_events() if e["event"] == "start"}
    worktrees = tr.repo.resolve() / ".corral" / "worktrees"
    assert cwds == {worktrees / t["id"] for t in plan_tasks}


# ---- conflicts -------------------------------------------------------------------------------


def test_two_tasks_changing_the_same_line_one_merges_one_conflicts(tr: TaskRepo) -> None:
    versions = {
        "x": "line one\nline two, as x has it\nline three\n",
        "y": "line one\nline two, as y wants it\nline three\n",
    }
    plan = tr.write_plan(
        {
            "tasks": [
                task("x", prompt="Edit shared.txt " + write("shared.txt", versions["x"])),
                task("y", prompt="Edit shared.txt " + write("shared.txt", versions["y"])),
                task("after-x", "x"),
                task("after-y", "y"),
            ]
        }
    )
    before = tr.checkout_snapshot()
    assert tr.corral("plan", str(plan)).code == 0

    # Both must branch from the same main: no merge happens until both wait to merge.
    with tr.merge_lock_held():
        proc = tr.start("run", "--workers", "2")
        try:
            wait_for(
                lambda: all("merging" in tr.db_steps().get(k, {}) for k in ("x", "y")),
                what="x and y waiting to merge",
            )
        except BaseException:
            tr.kill_group(proc)
            raise
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        tr.kill_group(proc)
    assert code != 0, tr.background_log()
    assert "merge_conflict" in tr.background_log()

    tasks = tr.tasks()
    outcome = {k: tasks[k]["status"] for k in ("x", "y")}
    assert sorted(outcome.values()) == ["completed", "merge_conflict"], outcome
    winner = next(k for k, s in outcome.items() if s == "completed")
    loser = next(k for k, s in outcome.items() if s == "merge_conflict")
    assert tasks[f"after-{winner}"]["status"] == "completed"
    assert tasks[f"after-{loser}"]["status"] == "blocked_by_failure"
    assert "shared.txt" in (tasks[loser]["conflict"] or "")

    # main has the winner's version, and no conflict markers anywhere.
    assert tr.show("shared.txt") == versions[winner]
    for path in tr.tree_files():
        assert not CONFLICT_MARKERS.search(tr.show(path)), path
    # Nothing lost: the loser's branch still has its commit, with its version.
    branch = f"corral/{loser}"
    assert tr.git("log", "-1", "--format=%s", branch).strip() == f"corral: {loser} Task {loser}"
    assert tr.git("rev-parse", branch).strip() == tasks[loser]["commit"]
    assert tr.show("shared.txt", ref=branch) == versions[loser]
    assert not tr.is_ancestor(tasks[loser]["commit"], "main")
    listing = tr.git("worktree", "list", "--porcelain")
    for line in listing.splitlines():
        if line.startswith("worktree "):
            path = line.removeprefix("worktree ")
            assert not tr.git_ok("-C", path, "rev-parse", "-q", "--verify", "MERGE_HEAD"), path
    assert_checkout_untouched(tr, before)


# ---- kill -9 at each step ----------------------------------------------------------------------

VICTIM_CONTENT = "the victim's change\n"


@pytest.mark.parametrize("step", ["worktree", "agent", "committed", "merging"])
def test_kill_9_at_each_step_then_the_plan_completes_once(tr: TaskRepo, step: str) -> None:
    """The victim ``t`` is caught at ``step`` (made to wait there: a sleeping agent, a git
    filter blocking ``git add`` or a merge's checkout, the merge lock held), the whole
    ``tasks run`` process group is SIGKILLed, and a second ``tasks run`` finishes the plan."""
    tr.install_gated_filter()
    sleep = "[fake:sleep=2]" if step == "worktree" else ""
    victim_prompt = f"Victim. {sleep}" + write("t.slow", VICTIM_CONTENT)
    plan = tr.write_plan({"tasks": [task("t", prompt=victim_prompt), task("u", "t"), task("w")]})
    before = tr.checkout_snapshot()
    assert tr.corral("plan", str(plan)).code == 0

    waits = {
        # The agent is running: its worktree step is recorded, its result is not.
        "worktree": lambda s: "worktree" in s and "agent" not in s and tr.started("Victim."),
        # The agent's result is recorded; git add is stuck in the clean filter.
        "agent": lambda s: "agent" in s and tr.waiting_at_gate("clean"),
        # Committed; the merge waits for the lock the test holds.
        "committed": lambda s: "committed" in s and "merging" in s,
        # The merge is under way: git is writing t.slow in the integration worktree.
        "merging": lambda s: "merging" in s and tr.waiting_at_gate("smudge"),
    }
    with contextlib.ExitStack() as held:
        if step == "committed":
            held.enter_context(tr.merge_lock_held())
        gate = {"agent": "clean", "merging": "smudge"}.get(step)
        if gate:
            tr.close_gate(gate)
            held.callback(tr.open_gate, gate)
        # One worker: no other agent may be finishing at the moment of the kill (an agent
        # that exited but whose result the runner has not journaled yet would run again).
        proc = tr.start("run", "--workers", "1", "--retry-backoff", "0.2")
        held.callback(tr.kill_group, proc)  # first thing on the way out
        caught = wait_for(
            lambda: (s := tr.db_steps().get("t")) and waits[step](s) and s,
            timeout=30,
            what=f"task t at step {step}",
        )
        assert caught["status"] in ("in_progress", "merging"), caught
    finished_before = tr.finished_per_prompt()[victim_prompt]
    assert finished_before == (0 if step == "worktree" else 1)
    assert "t.slow" not in tr.tree_files()

    result = tr.corral("run", "--workers", "2", "--retry-backoff", "0.2", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"{result}\n{tr.tasks()}"

    tasks = tr.tasks()
    assert {k: t["status"] for k, t in tasks.items()} == dict.fromkeys("tuw", "completed")
    assert tasks["t"]["attempts"] == 1  # the killed attempt was continued, not failed
    # No agent that finished ran again: at most one finish per prompt.
    finished = tr.finished_per_prompt()
    assert max(finished.values()) == 1, finished
    assert finished[victim_prompt] == 1
    starts = Counter(e["prompt"] for e in tr.ledger_events() if e["event"] == "start")
    assert starts[victim_prompt] == (2 if step == "worktree" else 1)
    # Each change is on main, merged exactly once.
    assert tr.show("t.slow") == VICTIM_CONTENT
    for key in "uw":
        assert tr.show(f"files/{key}.txt") == f"made by {key}\n"
    subjects = tr.subjects()
    for key in "tuw":
        assert len(merge_subjects(tr, key)) == 1, subjects
        assert subjects.count(f"corral: {key} Task {key}") == 1, subjects
    assert tr.is_ancestor(tasks["t"]["merge_commit"], tasks["u"]["commit"])
    assert_checkout_untouched(tr, before)
    assert_clean_worktrees(tr)


# ---- failures and retries --------------------------------------------------------------------


def test_failed_tasks_block_their_dependents_until_retried(tr: TaskRepo) -> None:
    plan = tr.write_plan(
        {
            "tasks": [
                task("hard", prompt="Always fails [fake:fail]", max_attempts=2),
                task("after-hard", "hard"),
                task(
                    "flaky",
                    prompt="Fails once [fake:fail_once] " + file_directive("flaky"),
                    max_attempts=1,
                ),
                task("after-flaky", "flaky"),
                task("fine"),
                task("idle", prompt="Changes nothing", max_attempts=2),
            ]
        }
    )
    assert tr.corral("plan", str(plan)).code == 0

    first = tr.corral("run", "--workers", "3", "--retry-backoff", "0.1", timeout=RUN_TIMEOUT_S)
    assert first.code != 0, str(first)
    tasks = tr.tasks()
    assert {k: t["status"] for k, t in tasks.items()} == {
        "hard": "failed",
        "after-hard": "blocked_by_failure",
        "flaky": "failed",
        "after-flaky": "blocked_by_failure",
        "fine": "completed",
        "idle": "failed",
    }
    assert tasks["hard"]["attempts"] == 2 and tasks["flaky"]["attempts"] == 1
    assert tasks["hard"]["last_error"] and tasks["flaky"]["last_error"]
    assert tasks["after-hard"]["attempts"] == 0
    starts = Counter(e["prompt"] for e in tr.ledger_events() if e["event"] == "start")
    assert starts["Always fails [fake:fail]"] == 2
    # A task whose agent changed nothing fails (on_no_changes: fail), its agent run again
    # by its second attempt.
    assert tasks["idle"]["attempts"] == 2
    assert tasks["idle"]["last_error"] == "the agent made no changes"
    assert starts["Changes nothing"] == 2
    assert "files/flaky.txt" not in tr.tree_files()

    retried = tr.corral("retry", "flaky")
    assert retried.code == 0 and retried.out.strip() == "flaky ready", str(retried)
    tasks = tr.tasks()
    assert tasks["flaky"]["status"] == "ready" and tasks["flaky"]["attempts"] == 0
    assert tasks["after-flaky"]["status"] == "blocked"
    assert tasks["after-hard"]["status"] == "blocked_by_failure"

    second = tr.corral("run", "--workers", "3", "--retry-backoff", "0.1", timeout=RUN_TIMEOUT_S)
    assert second.code != 0, str(second)  # hard is still failed
    tasks = tr.tasks()
    assert tasks["flaky"]["status"] == "completed"
    assert tasks["after-flaky"]["status"] == "completed"
    assert tasks["hard"]["status"] == "failed" and tasks["hard"]["attempts"] == 2
    assert tasks["after-hard"]["status"] == "blocked_by_failure"
    for key in ("flaky", "after-flaky", "fine"):
        assert tr.show(f"files/{key}.txt") == f"made by {key}\n"
    # hard was not run again by the second plan run.
    starts = Counter(e["prompt"] for e in tr.ledger_events() if e["event"] == "start")
    assert starts["Always fails [fake:fail]"] == 2


# ---- bad plan files --------------------------------------------------------------------------

BAD_PLANS = {
    "cycle": (
        "tasks:\n"
        "  - {id: a, title: A, after: [c]}\n"
        "  - {id: b, title: B, after: [a]}\n"
        "  - {id: c, title: C, after: [b]}\n",
        # each waits for the next: a for c, c for b, b for a (from any of them)
        r"dependency cycle .*: (a -> c -> b -> a|c -> b -> a -> c|b -> a -> c -> b)",
    ),
    "unknown-dependency": (
        "tasks:\n  - {id: a, title: A}\n  - {id: b, title: B, after: [nope]}\n",
        r"task 'b' depends on unknown task 'nope'",
    ),
    "duplicate-id": (
        "tasks:\n  - {id: a, title: A}\n  - {id: a, title: Again}\n",
        r"duplicate task id 'a'",
    ),
    "bad-yaml": (
        "tasks:\n  - id: a\n    title: [unclosed\n",
        r"invalid YAML at line \d+",
    ),
}


@pytest.mark.parametrize("problem", list(BAD_PLANS))
def test_a_bad_plan_is_refused_with_one_line_and_writes_nothing(tr: TaskRepo, problem: str) -> None:
    text, message = BAD_PLANS[problem]
    path = tr.root / "bad.yaml"
    path.write_text(text)
    result = tr.corral("plan", str(path))
    assert result.code != 0, str(result)
    lines = result.out.strip().splitlines()
    assert len(lines) == 1, str(result)
    assert lines[0].startswith("error: ") and str(path) in lines[0], lines[0]
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in result.out
    assert tr.status()["tasks"] == []
