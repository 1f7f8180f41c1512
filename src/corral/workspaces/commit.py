"""Committing a task worktree's changes, once, even when the step is repeated after a crash.

``git add -A``, then the files bootstrap copied in are unstaged again (a ``.env`` the
user's ``.gitignore`` misses must not reach the target branch), then the deletions are
checked against the worktree's baseline (see ``baseline``), then ``git commit``.

With nothing to commit, the answer is the branch's tip if that is a commit *made on the
branch* with exactly this message — the crash came after the commit, before anyone
recorded it — and None otherwise. The branch's reflog tells a commit made on the branch
(``commit: …``) from the one it was created at (``branch: Created from …``), whose message
may well be the same; without a reflog (``core.logAllRefUpdates=false``) the answer is
None, and ``branch_has_changes`` still says whether there is something to merge.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import InvalidRequest
from corral.workspaces import baseline, bootstrap

if TYPE_CHECKING:
    from corral.workspaces.git import Workspace

FALLBACK_IDENTITY = {"name": "corral", "email": "corral@localhost"}


def commit_all(ws: Workspace, worktree: Path, message: str) -> str | None:
    if not message.strip():
        raise InvalidRequest("a commit needs a message")
    wt = Path(worktree).resolve()
    branch_ref = ws._task_branch_at(wt)
    ws._git(wt, "add", "-A")
    copied = bootstrap.recorded(ws._private_dir(wt))
    if copied:
        added = ws._git(
            wt, "diff", "--cached", "--name-only", "-z", "--no-renames", "--diff-filter=A"
        ).stdout.split("\0")
        unstage = sorted(copied.intersection(added))
        if unstage:
            ws._git(
                wt,
                "reset",
                "-q",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin="".join(f":(literal){name}\0" for name in unstage),
            )
    baseline.check_staged(ws, wt)
    # A merge under way (a conflict handed back to the agent) is committed even when the
    # resolution leaves the tree as it was: the merge commit is what records the target.
    merging = ws._git(wt, "rev-parse", "-q", "--verify", "MERGE_HEAD", ok=(0, 1)).returncode == 0
    if not merging and ws._git(wt, "diff", "--cached", "--quiet", ok=(0, 1)).returncode == 0:
        return _earlier_commit(ws, wt, branch_ref, message)
    ws._git(wt, *identity_args(ws, wt), "commit", "-q", "--no-verify", "-m", message)
    return ws._out(wt, "rev-parse", "HEAD")


def identity_args(ws: Workspace, cwd: Path) -> list[str]:
    """``-c user.<item>=…`` for each identity item the repository's config lacks."""
    proc = ws._git(cwd, "config", "--get-regexp", r"^user\.(name|email)$", ok=(0, 1))
    configured = {line.split(" ", 1)[0] for line in proc.stdout.splitlines()}
    args = []
    for item, fallback in FALLBACK_IDENTITY.items():
        env = item.upper()
        from_env = os.environ.get(f"GIT_AUTHOR_{env}") and os.environ.get(f"GIT_COMMITTER_{env}")
        if f"user.{item}" not in configured and not from_env:
            args += ["-c", f"user.{item}={fallback}"]
    return args


def _normalize(message: str) -> str:
    """A commit message as ``git commit -m`` stores it (cleanup mode ``whitespace``)."""
    lines = [line.rstrip() for line in message.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def _earlier_commit(ws: Workspace, wt: Path, branch_ref: str, message: str) -> str | None:
    """HEAD, if it is a commit made on the task branch with ``message``; else None."""
    head = ws._out(wt, "rev-parse", "HEAD")
    if _normalize(ws._out(wt, "log", "-1", "--format=%B", head)) != _normalize(message):
        return None
    reflog = ws._git(wt, "log", "-g", "--format=%H %gs", branch_ref, "--", ok=(0, 128))
    for line in reflog.stdout.splitlines():
        sha, _, subject = line.partition(" ")
        if sha == head:
            return head if subject.startswith("commit") else None
    return None
