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

    with contextlib.ExitStack() as held:
        tr.close_gate("smudge")
        held.callback(tr.open_gate, "smudge")
        proc = tr.start("run", "--workers", "1", "--retry-backoff", "0.2")
        held.callback(tr.kill_group, proc)
        wait_for(lambda: tr.waiting_at_gate("smudge"), what="git worktree add at b.slow")
    worktree = tr.repo / ".corral" / "worktrees" / "t"
    assert (worktree / "a.txt").exists() and not (worktree / "c.txt").exists()

    result = tr.corral("run", "--workers", "2", "--retry-backoff", "0.2", timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"{result}\n{tr.tasks()}"
    assert {k: t["status"] for k, t in tr.tasks().items()} == {"t": "completed", "u": "completed"}
    assert set(tr.tree_files()) == base_files | {"files/t.txt", "files/u.txt"}
    for name in BASE_FILES:
        assert tr.show(name) == f"base {name}\n"
    assert tr.checkout_snapshot() == before
