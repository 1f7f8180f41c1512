"""What ``corral tasks`` tells a user, end to end (the real CLI, its output not a terminal):

* ``tasks plan`` takes tasks listed before their blockers;
* ``tasks run`` prints plain progress lines as things happen, and its summary on a line
  of its own;
* after a run, the closing message gives the one command that brings the user's checkout
  up to date, and that command does;
* ``tasks status`` shows the whole first line of a task's error;
* without the agent's program, ``tasks run`` stops at once (no retries, no attempt used
  up) and names ``--claude-bin`` / ``CORRAL_CLAUDE_BIN``.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from tasks_helpers import COMMAND_TIMEOUT_S, TaskRepo, task, wait_for, write

from corral.cli.plan_progress import first_line

RUN_TIMEOUT_S = 90.0


@pytest.fixture
def tr(tmp_path: Path) -> TaskRepo:
    return TaskRepo(tmp_path)


def test_a_plan_may_list_a_task_before_its_blockers(tr: TaskRepo) -> None:
    plan = tr.write_plan({"tasks": [task("b", "a"), task("c", "b", "a"), task("a")]})
    imported = tr.corral("plan", str(plan))
    assert imported.code == 0, str(imported)
    assert "3 added" in imported.out
    tasks = tr.tasks()
    assert {k: t["status"] for k, t in tasks.items()} == {
        "b": "blocked",
        "c": "blocked",
        "a": "ready",
    }
    assert tasks["c"]["after"] == ["a", "b"]
    graph = tr.corral("graph", "--json")
    assert graph.code == 0, str(graph)
    nodes = {n["id"]: n for n in json.loads(graph.out)["tasks"]}
    assert sorted(nodes["a"]["children"]) == ["b", "c"]
    assert (nodes["c"]["after"], nodes["c"]["status"]) == (["a", "b"], "blocked")


def test_piped_progress_comes_as_it_happens_and_the_summary_on_its_own_line(
    tr: TaskRepo,
) -> None:
    first = f"First. [fake:wait_while={tr.gates / 'agent'}] " + write("first.txt", "1\n")
    plan = tr.write_plan({"tasks": [task("first", prompt=first), task("second", "first")]})
    assert tr.corral("plan", str(plan)).code == 0
    tr.close_gate("agent")
    proc = tr.start("run", "--workers", "1")
    try:
        # Printed while the first agent is still held: progress is not saved for the end.
        wait_for(lambda: "plan: 2 tasks" in tr.background_log(), what="the first progress line")
        assert proc.poll() is None
        tr.open_gate("agent")
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        tr.open_gate("agent")
        tr.kill_group(proc)
    out = tr.background_log()
    assert code == 0, out
    lines = out.splitlines()
    assert not any(box in out for box in "┏┃┗━"), out  # no table redrawn into the log
    progress = [m[1] for line in lines if (m := re.match(r"^ *\d+\.\ds  (.*)$", line))]
    assert progress[0].startswith("plan: 2 tasks"), progress
    done = [p for p in progress if p.endswith("($0.01)")]
    assert done == ["first: completed ($0.01)", "second: completed ($0.01)"], progress
    summary = [line for line in lines if line.startswith("completed ")]
    assert len(summary) == 1 and summary[0].startswith("completed 2/2, failed 0"), out


def test_the_closing_message_gives_the_command_that_updates_the_checkout(tr: TaskRepo) -> None:
    plan = tr.write_plan({"tasks": [task("a"), task("b", "a")]})
    assert tr.corral("plan", str(plan)).code == 0
    (tr.repo / "notes.txt").write_text("my own work, not committed\n")  # kept
    result = tr.corral("run", "--workers", "2", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, str(result)
    assert "`git status` shows the merged changes undone" in result.out, str(result)
    # Until then the checkout shows the merged files as staged deletions.
    assert tr.git("status", "--porcelain", "--untracked-files=no").split() == [
        "D",
        "files/a.txt",
        "D",
        "files/b.txt",
    ]
    command = next(line.strip() for line in result.out.splitlines() if line.startswith("    git "))
    argv = shlex.split(command)
    assert argv[:4] == ["git", "read-tree", "-m", "-u"] and argv[5] == "main", command
    subprocess.run(argv, cwd=tr.repo, env=tr.env, check=True, timeout=COMMAND_TIMEOUT_S)
    assert tr.git("status", "--porcelain") == "?? notes.txt\n"
    assert (tr.repo / "files" / "b.txt").read_text() == "made by b\n"
    assert (tr.repo / "notes.txt").read_text() == "my own work, not committed\n"


def test_status_shows_the_whole_first_line_of_an_error(tr: TaskRepo) -> None:
    tr.install_broken_filter()  # the agent finishes, then `git add` fails
    plan = tr.write_plan(
        {"tasks": [task("broken", prompt="Bad. " + write("x.bad", "x\n"), max_attempts=1)]}
    )
    assert tr.corral("plan", str(plan)).code == 0
    assert tr.corral("run", "--workers", "1", timeout=RUN_TIMEOUT_S).code == 1
    error = first_line(tr.tasks()["broken"]["last_error"])
    assert len(error) > 100, error

    tr.env["COLUMNS"] = "80"  # the table wraps the error rather than cutting it
    shown = tr.corral("status")
    assert shown.code == 0, str(shown)
    cells = " ".join(
        line.split("│")[-2].strip() for line in shown.out.splitlines() if line.count("│") > 2
    )
    assert "".join(error.split()) in "".join(cells.split()), shown.out  # wrapped, all there


def test_without_claude_the_run_stops_at_once_and_names_the_flag(tr: TaskRepo) -> None:
    plan = tr.write_plan({"tasks": [task("a"), task("b"), task("c", "a")]})
    assert tr.corral("plan", str(plan)).code == 0
    assert shutil.which("claude", path=tr.env["PATH"]) is None
    # No --claude-bin, and no claude on PATH.
    result = tr.corral("run", "--workers", "1", timeout=RUN_TIMEOUT_S, fake_claude=False)
    out = result.out
    assert result.code == 1, out
    assert "no such program: 'claude'" in out, out
    assert "--claude-bin" in out and "CORRAL_CLAUDE_BIN" in out, out
    # Not retried, and no attempt used up: one run tried, the tasks wait as they were.
    tasks = tr.tasks()
    assert {k: (t["status"], t["attempts"]) for k, t in tasks.items()} == {
        "a": ("ready", 0),
        "b": ("ready", 0),
        "c": ("blocked", 0),
    }
    with tr.store() as store:
        assert len([r for r in store.runs.list(limit=100) if r.task_id]) == 1

    again = tr.corral("run", "--workers", "1", timeout=RUN_TIMEOUT_S)  # with the fake Claude
    assert again.code == 0, str(again)
    assert {t["status"] for t in tr.tasks().values()} == {"completed"}
