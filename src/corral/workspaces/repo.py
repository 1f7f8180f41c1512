"""The git repository under the workspaces: running git in it, its refs, its ancestry.

``GitRepo`` is the one place corral's git calls go through (``run``): each names the exit
statuses it expects and any other raises ``GitError`` (see ``cmd``), and ``git worktree``
commands are serialized on this host by ``flock(<common>/corral-worktrees.lock)``. It knows
git, not tasks: which worktree is whose, and what a task's branch is called, is decided
above it (``worktrees``, ``commit``, ``merge``, ``workspace``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

from corral.errors import InvalidRequest
from corral.workspaces.cmd import GitError, run_git

FALLBACK_IDENTITY = {"name": "corral", "email": "corral@localhost"}
WORKTREES_LOCK = "corral-worktrees.lock"


class GitRepo:
    """The repository whose top level (the user's checkout) is ``top``."""

    def __init__(self, top: Path) -> None:
        self.top = Path(top).resolve()

    @cached_property
    def common_dir(self) -> Path:
        """``git rev-parse --git-common-dir`` (``top/.git`` for a plain clone)."""
        return (self.top / self.out(self.top, "rev-parse", "--git-common-dir")).resolve()

    # -- running git -------------------------------------------------------------------

    def run(
        self, cwd: Path, *args: str, ok: Iterable[int] = (0,), stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``git -C cwd *args``; ``GitError`` unless its exit status is in ``ok``."""
        if args[:1] == ("worktree",):
            # Two `git worktree` commands at once are not safe: one reading the worktrees
            # while another is half made dies ("failed to read .git/worktrees/<id>/commondir").
            with open(self.common_dir / WORKTREES_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                return run_git(cwd, *args, ok=ok, stdin=stdin)
        return run_git(cwd, *args, ok=ok, stdin=stdin)

    def out(self, cwd: Path, *args: str) -> str:
        """What ``git -C cwd *args`` printed, stripped (it must succeed)."""
        return self.run(cwd, *args).stdout.strip()

    def identity_args(self, cwd: Path) -> list[str]:
        """``-c user.<item>=…`` for each identity item the repository's config lacks."""
        proc = self.run(cwd, "config", "--get-regexp", r"^user\.(name|email)$", ok=(0, 1))
        configured = {line.split(" ", 1)[0] for line in proc.stdout.splitlines()}
        args = []
        for item, fallback in FALLBACK_IDENTITY.items():
            env = item.upper()
            given = os.environ.get(f"GIT_AUTHOR_{env}") and os.environ.get(f"GIT_COMMITTER_{env}")
            if f"user.{item}" not in configured and not given:
                args += ["-c", f"user.{item}={fallback}"]
        return args

    # -- refs and ancestry -------------------------------------------------------------

    def current_branch(self) -> str:
        """The branch checked out in the user's checkout (``GitError`` when detached)."""
        proc = self.run(self.top, "symbolic-ref", "-q", "--short", "HEAD", ok=(0, 1))
        if proc.returncode != 0:
            raise GitError(f"{self.top} has a detached HEAD, not a branch", code="detached_head")
        return proc.stdout.strip()

    def checked_branch(self, branch: str) -> str:
        """``branch``, once git accepts it as a branch name (else ``InvalidRequest``)."""
        proc = self.run(self.top, "check-ref-format", f"refs/heads/{branch}", ok=(0, 1))
        if proc.returncode != 0 or branch.startswith("-"):
            raise InvalidRequest(f"{branch!r} is not a valid branch name")
        return branch

    def head(self, ref: str) -> str:
        """The commit ``ref`` names (``GitError`` with code ``ref_not_found`` if none)."""
        if ref.startswith("-"):
            raise InvalidRequest(f"{ref!r} is not a git ref")
        proc = self.run(self.top, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", ok=(0, 1))
        if proc.returncode != 0:
            raise GitError(f"{ref!r} names no commit in {self.top}", code="ref_not_found")
        return proc.stdout.strip()

    def ref_exists(self, ref: str) -> bool:
        return self.run(self.top, "rev-parse", "-q", "--verify", ref, ok=(0, 1)).returncode == 0

    def is_ancestor(self, commit: str, of: str) -> bool:
        proc = self.run(self.top, "merge-base", "--is-ancestor", commit, of, ok=(0, 1))
        return proc.returncode == 0

    def commits_between(self, base: str, tip: str) -> int:
        """How many commits ``tip`` has that ``base`` does not."""
        return int(self.out(self.top, "rev-list", "--count", f"{base}..{tip}"))

    # -- inside a worktree -------------------------------------------------------------

    def private_dir(self, worktree: Path) -> Path:
        """The worktree's own git directory (``<common>/worktrees/<id>`` for a linked one)."""
        return Path(self.out(worktree, "rev-parse", "--absolute-git-dir"))

    def status(self, worktree: Path) -> list[tuple[str, str]]:
        """``git status --porcelain`` of every file, untracked ones too: (XY, path) pairs."""
        out = self.run(
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
