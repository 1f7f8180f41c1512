"""Putting a task worktree left on a detached HEAD back on its branch.

corral never detaches a task worktree, but a kill can leave one detached (and a user or an
agent can detach it). It is corral's own work, and taken back, when its HEAD is on the
task's history: the tip of ``corral/<key>`` or one of its ancestors, or — the branch being
gone — the task's recorded commit or one of its ancestors. At the tip: HEAD becomes the
branch again (``symbolic-ref``; files and index untouched). At an ancestor: ``git switch``
to the branch, which carries uncommitted edits along (and refuses if they would be lost).
A HEAD off the task's history holds work corral did not make: it is refused, and the error
says what to run to keep that work and give the worktree back.
"""

from __future__ import annotations

from pathlib import Path

from corral.workspaces.cmd import GitError, WorkspaceError
from corral.workspaces.names import task_branch
from corral.workspaces.repo import GitRepo


def reattach(repo: GitRepo, worktree: Path, key: str, recorded_commit: str | None) -> None:
    branch = task_branch(key)
    ref = f"refs/heads/{branch}"
    head = repo.run(worktree, "rev-parse", "-q", "--verify", "HEAD^{commit}", ok=(0, 1))
    sha = head.stdout.strip()
    tip = _task_tip(repo, ref, recorded_commit)
    if not sha or tip is None or not (sha == tip or repo.is_ancestor(sha, tip)):
        raise WorkspaceError(
            f"{worktree} is on a detached HEAD ({sha[:12] or 'no commit'}) that is not on "
            f"{branch}: it holds work corral did not make, and corral leaves it alone. To keep "
            f"that work on a branch and give the worktree back to the task: "
            f"git -C {worktree} branch corral-saved/{key} HEAD && "
            f"git -C {worktree} switch {branch}",
            code="worktree_mismatch",
        )
    if not repo.ref_exists(ref):
        repo.run(repo.top, "update-ref", ref, tip, "")  # "": only if it still does not exist
    if sha == tip:
        repo.run(worktree, "symbolic-ref", "HEAD", ref)
        return
    try:
        repo.run(worktree, "switch", "-q", branch)
    except GitError as exc:
        raise WorkspaceError(
            f"{worktree} is on a detached HEAD behind {branch}, with edits that moving it to "
            f"{branch} would overwrite: {exc.details.get('stderr', '')}. Commit or move them, "
            f"then: git -C {worktree} switch {branch}",
            code="worktree_mismatch",
        ) from exc


def _task_tip(repo: GitRepo, ref: str, recorded_commit: str | None) -> str | None:
    """The task branch's tip, or (the branch gone) the recorded commit if it still exists."""
    if repo.ref_exists(ref):
        return repo.head(ref)
    if recorded_commit:
        try:
            return repo.head(recorded_commit)
        except GitError:
            return None
    return None
