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

import re
from pathlib import Path

from corral.errors import InvalidRequest
from corral.workspaces import baseline, bootstrap, worktrees
from corral.workspaces.cmd import WorkspaceError
from corral.workspaces.names import BRANCH_PREFIX
from corral.workspaces.repo import GitRepo


def commit_all(repo: GitRepo, worktree: Path, message: str) -> str | None:
    if not message.strip():
        raise InvalidRequest("a commit needs a message")
    wt = Path(worktree).resolve()
    branch_ref = _task_branch_at(repo, wt)
    repo.run(wt, "add", "-A")
    copied = bootstrap.recorded(repo.private_dir(wt))
    if copied:
        added = repo.run(
            wt, "diff", "--cached", "--name-only", "-z", "--no-renames", "--diff-filter=A"
        ).stdout.split("\0")
        unstage = sorted(copied.intersection(added))
        if unstage:
            repo.run(
                wt,
                "reset",
                "-q",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin="".join(f":(literal){name}\0" for name in unstage),
            )
    baseline.check_staged(repo, wt)
    # A merge under way (a conflict handed back to the agent) is committed even when the
    # resolution leaves the tree as it was: the merge commit is what records the target.
    merging = repo.run(wt, "rev-parse", "-q", "--verify", "MERGE_HEAD", ok=(0, 1)).returncode == 0
    if not merging and repo.run(wt, "diff", "--cached", "--quiet", ok=(0, 1)).returncode == 0:
        return _earlier_commit(repo, wt, branch_ref, message)
    repo.run(wt, *repo.identity_args(wt), "commit", "-q", "--no-verify", "-m", message)
    return repo.out(wt, "rev-parse", "HEAD")


def _task_branch_at(repo: GitRepo, worktree: Path) -> str:
    """The task branch checked out in ``worktree``, a valid worktree (else refused)."""
    checked_out = worktrees.checkout_at(repo, worktree)
    if not checked_out or not checked_out.startswith("refs/heads/" + BRANCH_PREFIX):
        raise WorkspaceError(
            f"{worktree} is not a task worktree on a {BRANCH_PREFIX}<key> branch",
            code="not_a_task_worktree",
        )
    return checked_out


def _normalize(message: str) -> str:
    """A commit message as ``git commit -m`` stores it (cleanup mode ``whitespace``)."""
    lines = [line.rstrip() for line in message.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def _earlier_commit(repo: GitRepo, wt: Path, branch_ref: str, message: str) -> str | None:
    """HEAD, if it is a commit made on the task branch with ``message``; else None."""
    head = repo.out(wt, "rev-parse", "HEAD")
    if _normalize(repo.out(wt, "log", "-1", "--format=%B", head)) != _normalize(message):
        return None
    reflog = repo.run(wt, "log", "-g", "--format=%H %gs", branch_ref, "--", ok=(0, 128))
    for line in reflog.stdout.splitlines():
        sha, _, subject = line.partition(" ")
        if sha == head:
            return head if subject.startswith("commit") else None
    return None
