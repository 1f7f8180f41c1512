"""What a task worktree looked like when its agent started, so a commit never deletes files
the agent did not delete.

A worktree whose checkout never finished (a kill inside ``git worktree add``) lacks files
its branch has; ``git add -A`` would record each as deleted, and the merge would delete
them from the target branch. ``prepare_worktree`` rebuilds such worktrees; this is the
second line of defence. Before the agent first runs on a commit, the files of ``HEAD``
missing from the disk are recorded (``corral-baseline`` in the worktree's private git
directory, kept across a kill so a rerun of the agent keeps the first record). A commit
that deletes any of them is refused: the agent cannot have deleted a file that was not
there when it started.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from corral.workspaces.cmd import WorkspaceError
from corral.workspaces.repo import GitRepo

BASELINE_FILE = "corral-baseline"
SHOWN = 10  # paths named in the error


def record(repo: GitRepo, worktree: Path) -> None:
    """Note the files of ``HEAD`` missing from ``worktree``, unless already noted for it."""
    path = repo.private_dir(worktree) / BASELINE_FILE
    head = repo.out(worktree, "rev-parse", "HEAD")
    if _read(path).get("head") == head:
        return  # the agent already started on this commit (and was killed): keep the first
    tracked = repo.run(worktree, "ls-tree", "-r", "-z", "--name-only", "HEAD").stdout.split("\0")
    missing = [name for name in tracked if name and not os.path.lexists(worktree / name)]
    scratch = path.with_name(BASELINE_FILE + ".tmp")
    scratch.write_text(json.dumps({"head": head, "missing": missing}))
    scratch.replace(path)


def check_staged(repo: GitRepo, worktree: Path) -> None:
    """Refuse (``unexpected_deletions``) an index deleting a file missing at the baseline."""
    noted = _read(repo.private_dir(worktree) / BASELINE_FILE)
    missing = set(noted.get("missing") or [])
    if not missing:
        return
    deleted = repo.run(
        worktree,
        "diff",
        "--cached",
        "--name-only",
        "-z",
        "--no-renames",
        "--diff-filter=D",
        str(noted["head"]),
    ).stdout.split("\0")
    untouched = sorted(missing.intersection(deleted))
    if not untouched:
        return
    named = ", ".join(untouched[:SHOWN]) + (" …" if len(untouched) > SHOWN else "")
    raise WorkspaceError(
        f"refusing to commit {worktree}: it would delete {len(untouched)} file(s) that were "
        f"already missing before the agent started, so the agent did not delete them "
        f"({named}); the worktree is kept for inspection. To start the task again from a "
        f"fresh worktree: git worktree remove --force {worktree}, then corral tasks retry "
        f"{worktree.name}",
        code="unexpected_deletions",
        worktree=str(worktree),
        paths=untouched,
    )


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
