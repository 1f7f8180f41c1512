"""Merging a task branch into its target, in the integration worktree, under the branch's lock.

One merge, holding ``flock(<common>/corral-merge-<target>.lock)`` throughout:

1. If the task's tip is already in the target: ``already_merged``, nothing done.
2. Clear the lock files a killed merge left (``locks``: the integration worktree's, the
   target ref's); force-clean the integration worktree (abort a leftover merge,
   ``reset --hard``, ``clean -ffdx``) and detach it at the target's tip.
3. ``git merge --no-ff`` (strategy ``merge``) or ``--ff`` (strategy ``ff``) of the task's tip.
4. Conflict: note the paths and the conflict hunks, ``merge --abort``, clean up, return
   ``conflict``; the target does not move. Clean: ``git update-ref refs/heads/<target>
   <new> <old>`` (run in the integration worktree); if the branch moved meanwhile
   (someone outside corral committed to it), start again from its new tip, a few times.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from corral.errors import InvalidRequest
from corral.workspaces import locks, worktrees
from corral.workspaces.cmd import GitError
from corral.workspaces.names import (
    WORKTREES_DIR,
    integration_worktree,
    sanitize_branch,
    task_branch,
)
from corral.workspaces.repo import GitRepo

Strategy = Literal["merge", "ff"]
MergeStatus = Literal["merged", "already_merged", "conflict"]
STRATEGIES: tuple[Strategy, ...] = ("merge", "ff")
DETAIL_CAP = 4096  # characters of conflict description kept
CAS_ATTEMPTS = 5


@dataclass(frozen=True)
class MergeResult:
    """``commit``: the target's new tip (merged) or its current tip (already_merged)."""

    status: MergeStatus
    commit: str | None
    conflicted_paths: list[str] = field(default_factory=list)
    conflict_detail: str = ""


def lock_path(common_dir: Path, branch: str) -> Path:
    return common_dir / f"corral-merge-{sanitize_branch(branch)}.lock"


@contextmanager
def merge_lock(common_dir: Path, branch: str) -> Iterator[None]:
    """Exclusive, blocking: one merge into ``branch`` at a time, across threads and processes.

    ``flock`` locks belong to the open file, so two threads of one process exclude each
    other too; the kernel releases the lock if the process dies.
    """
    fd = os.open(lock_path(common_dir, branch), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def merge_branch(
    repo: GitRepo, key: str, target_branch: str, *, strategy: Strategy, message: str
) -> MergeResult:
    task_ref = f"refs/heads/{task_branch(key)}"
    if strategy not in STRATEGIES:
        raise InvalidRequest(f"merge strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    target = repo.checked_branch(target_branch)
    target_ref = f"refs/heads/{target}"
    worktrees.ensure_excluded(repo)
    with merge_lock(repo.common_dir, target):
        _clear_debris(repo, target_ref)
        for _ in range(CAS_ATTEMPTS):
            task_tip, old = repo.head(task_ref), repo.head(target_ref)
            if repo.is_ancestor(task_tip, old):
                return MergeResult("already_merged", old)
            wt = _integration_worktree(repo, target, old)
            repo.run(wt, "checkout", "-q", "--detach", "--force", old)
            result = _merge_in(repo, wt, task_tip, strategy, message)
            if result is not None:
                return result
            new = repo.out(wt, "rev-parse", "HEAD")
            # Run in the (detached) integration worktree, not the user's checkout: there git
            # would also lock the user's HEAD when it points at the target, and a kill
            # would leave that lock in their repository.
            swap = repo.run(
                wt,
                "update-ref",
                "-m",
                f"corral: merge {task_ref.removeprefix('refs/heads/')}",
                target_ref,
                new,
                old,
                ok=range(256),
            )
            if swap.returncode == 0:
                return MergeResult("merged", new)
            if repo.head(target_ref) == old:
                raise GitError(
                    f"cannot move {target_ref} to {new}: {swap.stderr.strip()}",
                    returncode=swap.returncode,
                    stderr=swap.stderr.strip(),
                )
            # The target moved under us: merge again from its new tip.
        raise GitError(
            f"{target_ref} kept moving while merging {task_ref}; gave up after "
            f"{CAS_ATTEMPTS} attempts",
            code="merge_contended",
        )


def _integration_worktree(repo: GitRepo, target: str, at: str) -> Path:
    """The target's integration worktree, valid and clean (created at ``at`` if need be)."""
    path = integration_worktree(repo.top, target)
    # Killed inside `git worktree add`, it may not even have a HEAD yet (git writes a null
    # one first): every later reset would fail. It holds nothing to keep: build it again.
    if worktrees.checkout_at(repo, path) is None or worktrees.drop_if_unfinished(repo, path):
        worktrees.discard_broken(repo, path)
        repo.run(repo.top, "worktree", "add", "--detach", str(path), at)
        worktrees.mark_finished(repo, path)
        return path
    _clean(repo, path)
    return path


def _clear_debris(repo: GitRepo, target_ref: str) -> None:
    """Under the target's merge lock: the lock files a killed merge left (see ``locks``)."""
    common = repo.common_dir
    found = [locks.ref_lock(common, target_ref), common / "packed-refs.lock"]
    private = locks.linked_git_dir(
        integration_worktree(repo.top, target_ref.removeprefix("refs/heads/"))
    )
    if private is not None:
        found += locks.locks_in(private)
    if any(lock.exists() for lock in found):  # rare: spare the common case the git calls
        corral_worktrees = repo.top / WORKTREES_DIR
        scope = locks.Scope(
            (repo.top, common, *worktrees.user_worktrees(repo)), (corral_worktrees,)
        )
        locks.clear_debris(found, scope)


def _clean(repo: GitRepo, path: Path) -> None:
    """Force the integration worktree back to a clean state, whatever was left in it."""
    private = repo.private_dir(path)
    if repo.run(path, "rev-parse", "-q", "--verify", "MERGE_HEAD", ok=(0, 1)).returncode == 0:
        repo.run(path, "merge", "--abort", ok=range(256))  # reset --hard below finishes the job
    for state in ("rebase-merge", "rebase-apply"):
        shutil.rmtree(private / state, ignore_errors=True)
    repo.run(path, "reset", "-q", "--hard")
    repo.run(path, "clean", "-q", "-ffdx")


def _merge_in(
    repo: GitRepo, wt: Path, task_tip: str, strategy: Strategy, message: str
) -> MergeResult | None:
    """Merge ``task_tip`` into the detached ``wt``; None if clean, a conflict result if not."""
    mode = "--no-ff" if strategy == "merge" else "--ff"
    proc = repo.run(
        wt,
        *repo.identity_args(wt),
        "merge",
        mode,
        "--no-edit",
        "--no-verify",
        "-m",
        message,
        task_tip,
        ok=range(256),
    )
    if proc.returncode == 0:
        return None
    unmerged = repo.run(wt, "diff", "--name-only", "-z", "--diff-filter=U").stdout
    paths = [p for p in unmerged.split("\0") if p]
    if not paths:
        _clean(repo, wt)
        raise GitError(
            f"`git merge {mode} {task_tip}` failed without a conflict: "
            f"{(proc.stderr or proc.stdout).strip()}",
            returncode=proc.returncode,
            stderr=proc.stderr.strip(),
        )
    notes = [line for line in proc.stdout.splitlines() if line.startswith("CONFLICT")]
    hunks = repo.run(wt, "diff", "--no-color", "--no-ext-diff").stdout
    detail = "\n".join(notes) + ("\n\n" if notes else "") + hunks
    if len(detail) > DETAIL_CAP:
        detail = detail[:DETAIL_CAP].rsplit("\n", 1)[0] + "\n… (truncated)"
    repo.run(wt, "merge", "--abort")
    _clean(repo, wt)
    return MergeResult("conflict", None, paths, detail)
