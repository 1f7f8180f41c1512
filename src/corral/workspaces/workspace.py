"""Git worktrees for task graphs: one worktree and branch per task, merged back in a side checkout.

Layout, for the user's repository ``repo`` (the top level of their checkout)::

    repo/.corral/worktrees/<key>/            task worktree, on branch ``corral/<key>``
    repo/.corral/integration/<target>/       detached checkout, used only to merge into
                                             <target> ('/' in the branch name becomes '__')
    <common>/info/exclude                    holds ``.corral/`` (added once), so the user's
                                             ``git status`` never shows corral's directories
    <common>/corral-merge-<target>.lock      ``flock`` serializing merges into <target>
    <common>/corral-worktrees.lock           ``flock`` serializing ``git worktree`` commands
    <common>/worktrees/<key>/corral-*        bootstrap records (see ``bootstrap``)
    <common>/worktrees/<key>/corral-ready    written once ``git worktree add`` has finished
    <common>/worktrees/<key>/corral-baseline files missing as the agent started (``baseline``)

``<common>`` is ``git rev-parse --git-common-dir`` (``repo/.git`` for a plain clone).

Invariants:

* The user's checkout is never written to: not its working tree, not its index, not its
  ``.gitignore``. Merging moves only ``refs/heads/<target>``, with a compare-and-swap
  ``git update-ref`` to a commit that contains the old tip — even when the user has
  <target> checked out (their ``HEAD`` then points at the new commit; their files and
  index stay byte-identical).
* Every step can be repeated after a crash at any point and lands where one run would:
  ``prepare_worktree`` reuses the worktree (keeping the agent's edits), rebuilds one that
  ``git worktree add`` never finished checking out, or re-attaches the branch (keeping its
  commits), ``commit_all`` finds the commit it already made, ``merge``
  answers ``already_merged`` when the task's tip is already in the target.
* Merges into one branch are serialized across threads and processes on this host (the
  lock file above is held for the whole merge), and each starts by force-cleaning the
  integration worktree (an interrupted merge, stray files, a stale ``index.lock``).
* Work is never thrown away: a task worktree with changes is kept, a task branch is only
  deleted once merged. The one thing removed without asking is a *broken* directory at a
  task or integration worktree's path (not a worktree git knows, or its metadata is
  gone): git cannot tell what it holds, and corral owns ``.corral/``.
* git never runs in a directory not first checked to be the worktree it should be: in a
  broken worktree directory git would walk up and act on the user's checkout instead.
* corral's own commits and merge commits skip hooks (``--no-verify``); when the
  repository has no identity configured they are made as ``corral <corral@localhost>``.

The layers, each importing only those below it::

    workspace   Workspace: the steps of a task's attempt (this module)
    commit | merge | reattach | baseline | bootstrap
    worktrees   which worktrees git knows, valid or broken, finished or not
    repo        GitRepo: running git, refs, ancestry, a worktree's private directory

Every git call goes through ``GitRepo.run``, which checks the exit status and raises
``GitError`` (command, directory, stderr) on anything unexpected. Needs git >= 2.36.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from corral.workspaces import baseline, bootstrap, locks, worktrees
from corral.workspaces.cmd import WorkspaceError
from corral.workspaces.commit import commit_all
from corral.workspaces.merge import MergeResult, Strategy, merge_branch
from corral.workspaces.names import (
    WORKTREES_DIR,
    integration_worktree,
    task_branch,
    task_worktree,
)
from corral.workspaces.reattach import reattach
from corral.workspaces.repo import GitRepo


class Workspace:
    """Task worktrees, commits and merges in the git repository whose top level is ``repo``."""

    def __init__(self, repo: Path) -> None:
        self.repo = GitRepo(repo)

    # -- naming ------------------------------------------------------------------------

    def branch_name(self, key: str) -> str:
        return task_branch(key)

    def worktree_path(self, key: str) -> Path:
        return task_worktree(self.repo.top, key)

    def integration_path(self, target_branch: str) -> Path:
        return integration_worktree(self.repo.top, target_branch)

    # -- reading -----------------------------------------------------------------------

    def current_branch(self) -> str:
        """The branch checked out in the user's checkout (``GitError`` when detached)."""
        return self.repo.current_branch()

    def head(self, ref: str) -> str:
        """The commit ``ref`` names (``GitError`` with code ``ref_not_found`` if none)."""
        return self.repo.head(ref)

    def is_ancestor(self, commit: str, of: str) -> bool:
        return self.repo.is_ancestor(commit, of)

    def branch_has_changes(self, key: str, target_branch: str) -> bool:
        """Does ``corral/<key>`` hold commits that ``target_branch`` does not?"""
        task = self.repo.head(f"refs/heads/{task_branch(key)}")
        target = self.repo.head(f"refs/heads/{self.repo.checked_branch(target_branch)}")
        return self.repo.commits_between(target, task) > 0

    # -- worktrees ---------------------------------------------------------------------

    def prepare_worktree(
        self,
        key: str,
        target_branch: str,
        *,
        include_file: str = ".worktreeinclude",
        setup_command: Sequence[str] | None = None,
        setup_timeout: float | None = None,
        setup_env: Mapping[str, str] | None = None,
        recorded_commit: str | None = None,
    ) -> Path:
        """The task's worktree, on ``corral/<key>``, bootstrapped; created if need be.

        New: branched from the tip of ``target_branch``. Reused as is when it is already a
        valid worktree of that branch. A broken directory is removed and recreated; an
        existing branch without a worktree is checked out again, never reset. A worktree
        left on a detached HEAD is put back on its branch when the HEAD is corral's work
        (see ``reattach``; ``recorded_commit`` is the task's commit as last recorded).
        """
        repo = self.repo
        path, branch = task_worktree(repo.top, key), task_branch(key)
        ref = f"refs/heads/{branch}"
        worktrees.ensure_excluded(repo)
        # The attempt preparing the worktree owns it (the task's claim): lock files there
        # and on its branch were left by the git of an attempt killed mid-step (kill -9
        # during `git add` or `git commit`), and would fail every later commit of the task.
        locks.clear_debris(
            [locks.ref_lock(repo.common_dir, ref)],
            locks.Scope((path, repo.top, repo.common_dir), (repo.top / WORKTREES_DIR,)),
        )
        checked_out = worktrees.checkout_at(repo, path)
        # `git worktree add` killed while checking files out: the files not yet written
        # would be committed as deletions. No agent ran here (the mark is written before
        # any does), so there is nothing to keep: it is built again.
        if checked_out is not None and worktrees.drop_if_unfinished(repo, path):
            checked_out = None
        if checked_out is None:
            worktrees.discard_broken(repo, path, ref)
            if repo.ref_exists(ref):
                repo.run(repo.top, "worktree", "add", str(path), branch)
            else:
                base = repo.head(f"refs/heads/{repo.checked_branch(target_branch)}")
                repo.run(repo.top, "worktree", "add", "-b", branch, str(path), base)
            worktrees.mark_finished(repo, path)
        elif checked_out == "":
            reattach(repo, path, key, recorded_commit)
        elif checked_out != ref:
            raise WorkspaceError(
                f"{path} is a worktree on {checked_out}, not {branch}; corral leaves it alone. "
                f"To give it back to the task: git -C {path} switch {branch}",
                code="worktree_mismatch",
            )
        private = repo.private_dir(path)
        locks.clear_debris(locks.locks_in(private), locks.Scope((path,)))
        bootstrap.copy_included(repo.top, path, private, include_file)
        if setup_command:
            bootstrap.setup_once(path, private, setup_command, setup_timeout, setup_env)
        return path

    def remove_worktree_if_clean(
        self, key: str, *, delete_branch_if_merged_into: str | None = None
    ) -> bool:
        """Remove the task's worktree unless it holds changes; True if it is gone.

        Untracked files count as changes, except those bootstrap copied in. With
        ``delete_branch_if_merged_into``, ``corral/<key>`` is also deleted once the
        worktree is gone, if (and only if) that branch already contains it.
        """
        repo = self.repo
        path, branch = task_worktree(repo.top, key), task_branch(key)
        ref = f"refs/heads/{branch}"
        checked_out = worktrees.checkout_at(repo, path)
        if checked_out is None:
            if path.exists() or path.is_symlink():
                return False  # not a worktree git knows: nothing says its contents are spare
            worktrees.forget_stale(repo, path, ref)
        elif checked_out != ref:
            return False
        else:
            copied = bootstrap.recorded(repo.private_dir(path))
            untracked_copies = []
            for status, name in repo.status(path):
                if status != "??" or name not in copied:
                    return False
                untracked_copies.append(name)
            for name in untracked_copies:
                (path / name).unlink(missing_ok=True)
            repo.run(repo.top, "worktree", "remove", str(path))
        if delete_branch_if_merged_into is not None and repo.ref_exists(ref):
            tip = repo.head(ref)
            target = repo.head(f"refs/heads/{repo.checked_branch(delete_branch_if_merged_into)}")
            if repo.is_ancestor(tip, target):
                repo.run(repo.top, "update-ref", "-d", ref, tip)
        return True

    def record_baseline(self, worktree: Path) -> None:
        """Note the files missing from ``worktree`` as its agent starts (see ``baseline``)."""
        baseline.record(self.repo, Path(worktree).resolve())

    # -- commits -----------------------------------------------------------------------

    def commit_all(self, worktree: Path, message: str) -> str | None:
        """Commit every change in a task worktree; the commit's sha, or None if no changes.

        Files bootstrap copied in are never committed. Re-run after a crash that followed
        the commit, it returns the commit already made with this message (see ``commit``).
        """
        return commit_all(self.repo, worktree, message)

    def merge(
        self, key: str, target_branch: str, *, strategy: Strategy, message: str
    ) -> MergeResult:
        """Merge ``corral/<key>`` into ``target_branch`` (see ``corral.workspaces.merge``)."""
        return merge_branch(self.repo, key, target_branch, strategy=strategy, message=message)
