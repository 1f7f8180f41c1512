"""Task graphs after a kill -9 inside a git command: nothing lost, nothing left stuck.

* killed while ``git worktree add`` is still checking files out (a gated smudge filter
  holds it there): the rerun rebuilds the half-made worktree, and no file of the target
  branch is lost;
* killed with git's lock files left behind (``HEAD.lock``, ``ORIG_HEAD.lock``, a branch's
  ``.lock``) in the integration worktree and the common git directory: the rerun clears
  them and merges;
* a task worktree left on a detached HEAD: the rerun puts it back on its branch.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from tasks_helpers import TaskRepo, wait_for

RUN_TIMEOUT_S = 90.0
BASE_FILES = ["a.txt", "b.slow", "c.txt", "d.txt", "e.txt", "f.txt"]


@pytest.fixture
def tr(tmp_path: Path) -> TaskRepo:
    return TaskRepo(tmp_path)


def write(path: str, content: str) -> str:
    return f"[fake:write={path}:{content.replace(chr(10), chr(92) + 'n')}]"


def task(key: str, *after: str) -> dict[str, object]:
    body: dict[str, object] = {
        "id": key,
        "title": f"Task {key}",
        "prompt": f"Create {key}. " + write(f"files/{key}.txt", f"made by {key}\n"),
    }
    if after:
        body["after"] = list(after)
    return body


def kill_at_gate(tr: TaskRepo, gate: str, what: str) -> None:
    """Start ``tasks run``, wait until git waits at ``gate``, kill -9 its process group."""
    with contextlib.ExitStack() as held:
        tr.close_gate(gate)
        held.callback(tr.open_gate, gate)
        proc = tr.start("run", "--workers", "1", "--retry-backoff", "0.2")
        held.callback(tr.kill_group, proc)  # first thing on the way out, before the gate opens
        wait_for(lambda: tr.waiting_at_gate(gate), what=what)


def test_a_kill_inside_worktree_add_loses_no_file(tr: TaskRepo) -> None:
    """The smudge filter of ``b.slow`` blocks ``git worktree add`` half way through its
    checkout (``a.txt`` written, ``c.txt`` … not yet); the run is killed there. The rerun
    must not commit the missing files as deletions."""
    tr.install_gated_filter()
    for name in BASE_FILES:
        (tr.repo / name).write_text(f"base {name}\n")
    tr.git("add", "-A")
    tr.git("commit", "-q", "-m", "base files")
    base_files = set(tr.tree_files())
    plan = tr.write_plan({"tasks": [task("t"), task("u", "t")]})
    assert tr.corral("plan", str(plan)).code == 0
    before = tr.checkout_snapshot()

    kill_at_gate(tr, "smudge", "git worktree add at b.slow")
    worktree = tr.repo / ".corral" / "worktrees" / "t"
    assert (worktree / "a.txt").exists() and not (worktree / "c.txt").exists()

    result = tr.corral("run", "--workers", "2", "--retry-backoff", "0.2", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"{result}\n{tr.tasks()}"
    assert {k: t["status"] for k, t in tr.tasks().items()} == {"t": "completed", "u": "completed"}
    assert set(tr.tree_files()) == base_files | {"files/t.txt", "files/u.txt"}
    for name in BASE_FILES:
        assert tr.show(name) == f"base {name}\n"
    assert tr.checkout_snapshot() == before


# A reference-transaction hook that holds git inside a ref update (its locks taken) while
# the gate $GATES/reftx exists, for the updates of REF made in a directory matching WHERE.
REFTX_HOOK = """#!/bin/sh
updates=$(cat)
[ "$1" = prepared ] && [ -e "$GATES/reftx" ] || exit 0
case "$PWD" in {where}) ;; *) exit 0 ;; esac
echo "$updates" | grep -q " {ref}$" || exit 0
touch "$GATES/reftx.waiting"
while [ -e "$GATES/reftx" ]; do sleep 0.02; done
"""


@pytest.mark.parametrize(
    ("where", "ref", "debris"),
    [
        ("*", "refs/heads/main", ".git/refs/heads/main.lock"),
        ("*/.corral/integration/*", "HEAD", ".git/worktrees/main/HEAD.lock"),
    ],
    ids=["update-ref", "integration-head"],
)
def test_lock_files_left_by_a_kill_inside_a_ref_update_are_cleared(
    tr: TaskRepo, where: str, ref: str, debris: str
) -> None:
    hook = tr.repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text(REFTX_HOOK.format(where=where, ref=ref))
    hook.chmod(0o755)
    plan = tr.write_plan({"tasks": [task("t"), task("u", "t")]})
    assert tr.corral("plan", str(plan)).code == 0
    before = tr.checkout_snapshot()

    kill_at_gate(tr, "reftx", f"git holding the lock of {ref}")
    assert (tr.repo / debris).exists()

    result = tr.corral("run", "--workers", "2", "--retry-backoff", "0.2", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"{result}\n{tr.tasks()}"
    tasks = tr.tasks()
    assert {k: t["status"] for k, t in tasks.items()} == {"t": "completed", "u": "completed"}
    assert {k: t["attempts"] for k, t in tasks.items()} == {"t": 1, "u": 1}
    for key in "tu":
        assert tr.show(f"files/{key}.txt") == f"made by {key}\n"
    assert not (tr.repo / debris).exists()
    assert tr.checkout_snapshot() == before


@pytest.mark.parametrize("branch_gone", [False, True], ids=["detached", "detached-branch-gone"])
def test_a_task_worktree_left_on_a_detached_head_is_taken_back(
    tr: TaskRepo, branch_gone: bool
) -> None:
    """Killed after its commit (the merge waits for the lock the test holds); the worktree
    is then found detached at that commit, its branch maybe gone."""
    plan = tr.write_plan({"tasks": [task("t"), task("u", "t")]})
    assert tr.corral("plan", str(plan)).code == 0
    with contextlib.ExitStack() as held:
        held.enter_context(tr.merge_lock_held())
        proc = tr.start("run", "--workers", "1", "--retry-backoff", "0.2")
        held.callback(tr.kill_group, proc)
        wait_for(lambda: "merging" in tr.db_steps().get("t", {}), what="task t committed, merging")
    worktree = tr.repo / ".corral" / "worktrees" / "t"
    commit = tr.git("rev-parse", "corral/t").strip()
    tr.git("checkout", "-q", "--detach", cwd=worktree)
    if branch_gone:
        tr.git("update-ref", "-d", "refs/heads/corral/t")

    result = tr.corral("run", "--workers", "2", "--retry-backoff", "0.2", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"{result}\n{tr.tasks()}"
    tasks = tr.tasks()
    assert {k: t["status"] for k, t in tasks.items()} == {"t": "completed", "u": "completed"}
    assert tasks["t"]["commit"] == commit and tasks["t"]["attempts"] == 1
    assert tr.finished_per_prompt()[task("t")["prompt"]] == 1  # type: ignore[index]
    for key in "tu":
        assert tr.show(f"files/{key}.txt") == f"made by {key}\n"
