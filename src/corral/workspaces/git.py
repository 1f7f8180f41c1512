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

Every git call goes through ``Workspace._git``, which checks the exit status and raises
``GitError`` (command, directory, stderr) on anything unexpected. Needs git >= 2.36.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.errors import InvalidRequest
from corral.workspaces import baseline, bootstrap, locks
from corral.workspaces.cmd import GitError, WorkspaceError, run_git
from corral.workspaces.commit import commit_all
from corral.workspaces.merge import MergeResult, Strategy, merge_branch
from corral.workspaces.names import (
    BRANCH_PREFIX,
    EXCLUDE_LINE,
    INTEGRATION_DIR,
    WORKTREES_DIR,
    check_key,
    sanitize_branch,
)
from corral.workspaces.reattach import reattach

READY_MARK = "corral-ready"


@dataclass(frozen=True)
class _Registered:
    branch: str | None  # the full ref checked out, None when detached
    prunable: bool


class Workspace:
    """Task worktrees, commits and merges in the git repository whose top level is ``repo``."""

    def __init__(self, repo: Path) -> None:
        self.repo = Path(repo).resolve()
        self._common_dir: Path | None = None

    # -- naming ------------------------------------------------------------------------

    def branch_name(self, key: str) -> str:
        check_key(key)
        return BRANCH_PREFIX + key

    def worktree_path(self, key: str) -> Path:
        check_key(key)
        return self.repo / WORKTREES_DIR / key

    def integration_path(self, target_branch: str) -> Path:
        return self.repo / INTEGRATION_DIR / sanitize_branch(target_branch)

    @property
    def git_common_dir(self) -> Path:
        if self._common_dir is None:
            out = self._out(self.repo, "rev-parse", "--git-common-dir")
            self._common_dir = (self.repo / out).resolve()
        return self._common_dir

    # -- reading -----------------------------------------------------------------------

    def current_branch(self) -> str:
        """The branch checked out in the user's checkout (``GitError`` when detached)."""
        proc = self._git(self.repo, "symbolic-ref", "-q", "--short", "HEAD", ok=(0, 1))
        if proc.returncode != 0:
            raise GitError(f"{self.repo} has a detached HEAD, not a branch", code="detached_head")
        return proc.stdout.strip()

    def head(self, ref: str) -> str:
        """The commit ``ref`` names (``GitError`` with code ``ref_not_found`` if none)."""
        if ref.startswith("-"):
            raise InvalidRequest(f"{ref!r} is not a git ref")
        proc = self._git(self.repo, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", ok=(0, 1))
        if proc.returncode != 0:
            raise GitError(f"{ref!r} names no commit in {self.repo}", code="ref_not_found")
        return proc.stdout.strip()

    def is_ancestor(self, commit: str, of: str) -> bool:
        proc = self._git(self.repo, "merge-base", "--is-ancestor", commit, of, ok=(0, 1))
        return proc.returncode == 0

    def branch_has_changes(self, key: str, target_branch: str) -> bool:
        """Does ``corral/<key>`` hold commits that ``target_branch`` does not?"""
        task = self.head(f"refs/heads/{self.branch_name(key)}")
        target = self.head(f"refs/heads/{self._checked_branch(target_branch)}")
        return int(self._out(self.repo, "rev-list", "--count", f"{target}..{task}")) > 0

    # -- worktrees ---------------------------------------------------------------------

    def ensure_excluded(self) -> None:
        """Make git ignore ``.corral/`` via ``info/exclude`` (idempotent, concurrency-safe)."""
        info = self.git_common_dir / "info"
        info.mkdir(exist_ok=True)
        with open(info / "exclude", "a+", encoding="utf-8", errors="surrogateescape") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read()
            if any(
                line.strip() in (EXCLUDE_LINE, "/" + EXCLUDE_LINE) for line in text.splitlines()
            ):
                return
            f.write(("" if not text or text.endswith("\n") else "\n") + EXCLUDE_LINE + "\n")

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
        path, branch = self.worktree_path(key), self.branch_name(key)
        ref = f"refs/heads/{branch}"
        self.ensure_excluded()
        # The attempt preparing the worktree owns it (the task's claim): lock files there
        # and on its branch were left by the git of an attempt killed mid-step (kill -9
        # during `git add` or `git commit`), and would fail every later commit of the task.
        locks.clear_debris(
            [locks.ref_lock(self.git_common_dir, ref)],
            locks.Scope((path, self.repo, self.git_common_dir), (self.repo / WORKTREES_DIR,)),
        )
        checked_out = self._checkout_at(path)
        # `git worktree add` killed while checking files out: the files not yet written
        # would be committed as deletions. No agent ran here (the mark is written before
        # any does), so there is nothing to keep: it is built again.
        if checked_out is not None and self._drop_if_unfinished(path):
            checked_out = None
        if checked_out is None:
            self._discard_broken(path, ref)
            if self._ref_exists(ref):
                self._git(self.repo, "worktree", "add", str(path), branch)
            else:
                base = self.head(f"refs/heads/{self._checked_branch(target_branch)}")
                self._git(self.repo, "worktree", "add", "-b", branch, str(path), base)
            self._mark_finished(path)
        elif checked_out == "":
            reattach(self, path, key, recorded_commit)
        elif checked_out != ref:
            raise WorkspaceError(
                f"{path} is a worktree on {checked_out}, not {branch}; corral leaves it alone. "
                f"To give it back to the task: git -C {path} switch {branch}",
                code="worktree_mismatch",
            )
        private = self._private_dir(path)
        locks.clear_debris(locks.locks_in(private), locks.Scope((path,)))
        bootstrap.copy_included(self.repo, path, private, include_file)
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
        path, branch = self.worktree_path(key), self.branch_name(key)
        ref = f"refs/heads/{branch}"
        checked_out = self._checkout_at(path)
        if checked_out is None:
            if path.exists() or path.is_symlink():
                return False  # not a worktree git knows: nothing says its contents are spare
            self._forget_stale(path, ref)
        elif checked_out != ref:
            return False
        else:
            copied = bootstrap.recorded(self._private_dir(path))
            untracked_copies = []
            for status, name in self._status(path):
                if status != "??" or name not in copied:
                    return False
                untracked_copies.append(name)
            for name in untracked_copies:
                (path / name).unlink(missing_ok=True)
            self._git(self.repo, "worktree", "remove", str(path))
        if delete_branch_if_merged_into is not None and self._ref_exists(ref):
            tip = self.head(ref)
            target = self.head(f"refs/heads/{self._checked_branch(delete_branch_if_merged_into)}")
            if self.is_ancestor(tip, target):
                self._git(self.repo, "update-ref", "-d", ref, tip)
        return True

    def record_baseline(self, worktree: Path) -> None:
        """Note the files missing from ``worktree`` as its agent starts (see ``baseline``)."""
        baseline.record(self, Path(worktree).resolve())

    # -- commits -----------------------------------------------------------------------

    def commit_all(self, worktree: Path, message: str) -> str | None:
        """Commit every change in a task worktree; the commit's sha, or None if no changes.

        Files bootstrap copied in are never committed. Re-run after a crash that followed
        the commit, it returns the commit already made with this message (see ``commit``).
        """
        return commit_all(self, worktree, message)

    def merge(
        self, key: str, target_branch: str, *, strategy: Strategy, message: str
    ) -> MergeResult:
        """Merge ``corral/<key>`` into ``target_branch`` (see ``corral.workspaces.merge``)."""
        return merge_branch(self, key, target_branch, strategy=strategy, message=message)

    # -- helpers -----------------------------------------------------------------------

    def _git(
        self, cwd: Path, *args: str, ok: Iterable[int] = (0,), stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if args[:1] == ("worktree",):
            # Two `git worktree` commands at once are not safe: one reading the worktrees
            # while another is half made dies ("failed to read .git/worktrees/<id>/commondir").
            with open(self.git_common_dir / "corral-worktrees.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                return run_git(cwd, *args, ok=ok, stdin=stdin)
        return run_git(cwd, *args, ok=ok, stdin=stdin)

    def _out(self, cwd: Path, *args: str) -> str:
        return self._git(cwd, *args).stdout.strip()

    def _checked_branch(self, branch: str) -> str:
        proc = self._git(self.repo, "check-ref-format", f"refs/heads/{branch}", ok=(0, 1))
        if proc.returncode != 0 or branch.startswith("-"):
            raise InvalidRequest(f"{branch!r} is not a valid branch name")
        return branch

    def _ref_exists(self, ref: str) -> bool:
        proc = self._git(self.repo, "rev-parse", "-q", "--verify", ref, ok=(0, 1))
        return proc.returncode == 0

    def _registered(self) -> dict[Path, _Registered]:
        self._drop_unborn_registrations()
        out = self._git(self.repo, "worktree", "list", "--porcelain", "-z").stdout
        found = {}
        for record in out.split("\0\0"):
            fields = [f for f in record.split("\0") if f]
            if not fields or not fields[0].startswith("worktree "):
                continue
            branch = next(
                (f.removeprefix("branch ") for f in fields if f.startswith("branch ")), None
            )
            prunable = any(f.split(" ", 1)[0] == "prunable" for f in fields)
            found[Path(fields[0].removeprefix("worktree ")).resolve()] = _Registered(
                branch, prunable
            )
        return found

    def _drop_unborn_registrations(self) -> None:
        """Remove what a `git worktree add` killed before it wrote ``commondir`` left.

        Its ``<common>/worktrees/<id>`` holds git's ``locked`` ("initializing") and an empty
        or missing ``commondir``/``gitdir``/``HEAD``: every ``git worktree`` command then
        fails ("failed to read …/commondir"). Its ``locked`` is judged like a lock file
        (``locks``: no live git in the repository, old enough) before the directory goes.
        """
        admin = self.git_common_dir / "worktrees"
        unborn = [
            entry
            for entry in (admin.iterdir() if admin.is_dir() else ())
            if (entry / "locked").is_file()
            and not all(_nonempty(entry / name) for name in ("commondir", "gitdir", "HEAD"))
        ]
        if not unborn:
            return
        scope = locks.Scope((self.repo, self.git_common_dir), (self.repo / WORKTREES_DIR,))
        for cleared in locks.clear_debris([entry / "locked" for entry in unborn], scope):
            shutil.rmtree(cleared.parent, ignore_errors=True)

    def _user_worktrees(self) -> list[Path]:
        """Every worktree of the repository but corral's own."""
        mine = self.repo / ".corral"
        return [w for w in self._registered() if w != mine and mine not in w.parents]

    def _checkout_at(self, path: Path) -> str | None:
        """The ref checked out in the valid worktree at ``path`` ('' if detached), else None."""
        entry = self._registered().get(path.resolve())
        if entry is None or entry.prunable or path.is_symlink() or not path.is_dir():
            return None
        proc = self._git(path, "rev-parse", "--show-toplevel", ok=(0, 128))
        if proc.returncode != 0 or Path(proc.stdout.strip()).resolve() != path.resolve():
            return None  # its .git is missing or dangling: git would act on another repository
        return entry.branch or ""

    def _discard_broken(self, path: Path, branch_ref: str | None = None) -> None:
        """Remove what is at ``path`` (not a valid worktree) and forget stale registrations."""
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        self._forget_stale(path, branch_ref)

    def _forget_stale(self, path: Path, branch_ref: str | None) -> None:
        """Drop the registrations, whose directory is gone, of ``path`` or ``branch_ref``.

        ``git worktree remove`` on each rather than ``git worktree prune``: pruning is
        repository-wide and would also forget the user's own worktrees whose directories
        are missing for now (an unmounted disk).
        """
        for where, entry in self._registered().items():
            # A registration git left locked ("initializing": `worktree add` was killed)
            # is not prunable for git, but its directory is gone all the same.
            gone = entry.prunable or not (where.is_dir() or where.is_symlink())
            if gone and (where == path.resolve() or entry.branch == branch_ref):
                self._git(self.repo, "worktree", "remove", "--force", "--force", str(where))

    def _finished(self, worktree: Path) -> bool:
        """Is the worktree known to be fully checked out?

        ``git worktree add`` writes ``locked`` ("initializing") in the worktree's private
        directory before checking files out and removes it once done (or once its checkout
        failed, before it deletes what it made); corral writes its mark right after. No mark
        and no ``locked``: complete if the index matches ``HEAD`` (git wrote the index last;
        the kill came before the mark, or corral predates the mark), else not.
        """
        private = self._private_dir(worktree)
        if (private / READY_MARK).exists():
            return True
        if (private / "locked").exists():
            return False
        index = self._git(worktree, "diff-index", "--cached", "--quiet", "HEAD", ok=range(256))
        if index.returncode != 0:  # differs, or no HEAD at all
            return False
        (private / READY_MARK).touch()
        return True

    def _mark_finished(self, worktree: Path) -> None:
        (self._private_dir(worktree) / READY_MARK).touch()

    def _drop_if_unfinished(self, worktree: Path) -> bool:
        """Remove the (valid) worktree if its checkout is not known complete; True if so."""
        if self._finished(worktree):
            return False
        self._git(self.repo, "worktree", "remove", "--force", "--force", str(worktree))
        return True

    def _private_dir(self, worktree: Path) -> Path:
        return Path(self._out(worktree, "rev-parse", "--absolute-git-dir"))

    def _task_branch_at(self, worktree: Path) -> str:
        checked_out = self._checkout_at(worktree)
        if not checked_out or not checked_out.startswith("refs/heads/" + BRANCH_PREFIX):
            raise WorkspaceError(
                f"{worktree} is not a task worktree on a {BRANCH_PREFIX}<key> branch",
                code="not_a_task_worktree",
            )
        return checked_out

    def _status(self, worktree: Path) -> list[tuple[str, str]]:
        out = self._git(
            worktree,
            "status",
            "--porcelain",
            "-z",
            "--untracked-files=all",
            "--ignore-submodules=none",
        ).stdout
        entries, fields = [], iter(out.split("\0"))
        for field in fields:
            if field:
                entries.append((field[:2], field[3:]))
                if field[0] in "RC":
                    next(fields, None)  # the rename's source path
        return entries


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False
