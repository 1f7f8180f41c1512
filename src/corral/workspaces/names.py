"""Names: where a task's worktree and branch live, and which task keys can name them."""

from __future__ import annotations

import re
from pathlib import Path

from corral.errors import InvalidRequest

BRANCH_PREFIX = "corral/"
WORKTREES_DIR = Path(".corral") / "worktrees"
INTEGRATION_DIR = Path(".corral") / "integration"
EXCLUDE_LINE = ".corral/"
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a plan's task id


def check_key(key: str) -> None:
    if not _KEY.fullmatch(key) or ".." in key or key.endswith((".", ".lock")):
        raise InvalidRequest(f"task key {key!r} cannot name a git branch and a worktree")


def sanitize_branch(branch: str) -> str:
    """``branch`` as a single file name (for the integration worktree and the lock)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", branch.replace("/", "__"))
