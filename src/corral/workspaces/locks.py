"""Lock files a killed git left behind, told apart from the ones a live git holds.

git takes a lock on a file by creating ``<file>.lock`` and renames or deletes it when done;
a git killed in between (kill -9 of ``corral tasks run``) leaves it, and every later git
that needs the file fails ("Unable to create '…/HEAD.lock': File exists"). corral removes
such a lock only where it owns the operation that takes it, and only when nothing suggests
that a live git holds it. A lock is debris when all three hold:

1. corral holds the lock serializing the operations that take it — the target branch's
   merge lock for the integration worktree's locks and ``refs/heads/<target>.lock``; the
   task's claim for its worktree's locks and ``refs/heads/corral/<key>.lock`` — so no
   corral process is in the middle of one;
2. no live git process has its working directory where a git taking that lock would run
   (``Scope``; read from ``/proc``; a git whose directory cannot be read counts as live);
3. the lock file is at least ``DEBRIS_AGE_S`` old (``UNSEEN_AGE_S`` where ``/proc`` cannot
   be read): a git that rule 2 cannot see (another mount namespace, another host on a
   shared disk, one run with ``--git-dir`` from elsewhere) holds a ref lock for
   milliseconds, longer only while a ``reference-transaction`` hook runs.

A lock that fails 2 or 3 is waited for, up to ``WAIT_S``; then it is left alone and the
git command that needs it fails with git's own message (the task retries later).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("corral.workspaces")

DEBRIS_AGE_S = 2.0
UNSEEN_AGE_S = 60.0
WAIT_S = 10.0
POLL_S = 0.05
PROC = Path("/proc")


@dataclass(frozen=True)
class Scope:
    """Where a git that may hold the locks runs: in ``inside``, unless in a deeper root
    of ``outside`` (corral's task worktrees, whose gits never take the merge's locks)."""

    inside: tuple[Path, ...]
    outside: tuple[Path, ...] = ()

    def covers(self, cwd: Path) -> bool:
        deepest: tuple[int, bool] = (-1, False)
        for roots, counts in ((self.inside, True), (self.outside, False)):
            for root in roots:
                if (cwd == root or root in cwd.parents) and len(root.parts) > deepest[0]:
                    deepest = (len(root.parts), counts)
        return deepest[1]


def clear_debris(locks: Iterable[Path], scope: Scope) -> list[Path]:
    """Remove the lock files among ``locks`` that are debris (see above); those removed."""
    pending = [lock for lock in locks if lock.exists()]
    removed: list[Path] = []
    deadline = time.monotonic() + WAIT_S
    while pending:
        live = _live_git(scope)
        oldest = UNSEEN_AGE_S if live is None else DEBRIS_AGE_S
        for lock in list(pending):
            age = _age(lock)
            if age is None:
                pending.remove(lock)  # its git finished meanwhile
            elif not live and age >= oldest:
                lock.unlink(missing_ok=True)
                log.warning("removed %s, left by a git that was killed", lock)
                removed.append(lock)
                pending.remove(lock)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return removed


def ref_lock(common_dir: Path, ref: str) -> Path:
    """The lock file git takes to update the loose ref ``ref`` (``refs/heads/…``)."""
    return common_dir / f"{ref}.lock"


def locks_in(git_dir: Path) -> list[Path]:
    """The lock files directly in a git directory (``HEAD.lock``, ``index.lock`` …)."""
    return sorted(git_dir.glob("*.lock"))


def linked_git_dir(worktree: Path) -> Path | None:
    """The private git directory of the linked worktree at ``worktree``, read without
    running git; None unless its ``.git`` file and the directory point at each other."""
    try:
        text = (worktree / ".git").read_text()
        # Relative paths (worktree.useRelativePaths) are relative to the file's directory.
        private = (worktree / text.removeprefix("gitdir:").strip()).resolve()
        back = private / (private / "gitdir").read_text().strip()
    except (OSError, ValueError):
        return None
    if not text.startswith("gitdir:") or back.resolve() != (worktree / ".git").resolve():
        return None
    return private


def _age(path: Path) -> float | None:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None


def _live_git(scope: Scope) -> bool | None:
    """Is a git process running in ``scope``? None when processes cannot be seen."""
    if not PROC.is_dir():
        return None
    return any(cwd is None or scope.covers(cwd) for cwd in _git_cwds())


def _git_cwds() -> Iterator[Path | None]:
    """The working directory of every live git process (None: cannot be read)."""
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue  # gone meanwhile
        if name != "git" and not name.startswith("git-"):
            continue
        try:
            yield Path(os.readlink(entry / "cwd")).resolve()
        except FileNotFoundError:
            continue
        except OSError:
            yield None
