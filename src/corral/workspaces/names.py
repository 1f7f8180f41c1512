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
MAX_BRANCH_CHARS = 255
# git check-ref-format: no control characters, space, ~ ^ : ? * [ \ anywhere.
_BRANCH_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def check_key(key: str, where: str = "") -> None:
    """A task id names a branch (``corral/<id>``) and a directory: refuse any other.

    Plan files and the REST API both call this, so neither path takes an id the other
    would refuse (``../../x``, ``-b``)."""
    if not _KEY.fullmatch(key) or ".." in key or key.endswith((".", ".lock")):
        raise InvalidRequest(
            f"{where}invalid id {key[:80]!r}: use 1-64 of A-Z a-z 0-9 . _ -, starting with a "
            "letter or digit, without '..', not ending in '.' or '.lock'",
            code="invalid_task_id",
        )


def task_branch(key: str) -> str:
    """The branch a task's work is committed on: ``corral/<key>``."""
    check_key(key)
    return BRANCH_PREFIX + key


def task_worktree(top: Path, key: str) -> Path:
    """Where the task's worktree lives in the repository whose top level is ``top``."""
    check_key(key)
    return top / WORKTREES_DIR / key


def integration_worktree(top: Path, target_branch: str) -> Path:
    """Where merges into ``target_branch`` are made (see ``merge``)."""
    return top / INTEGRATION_DIR / sanitize_branch(target_branch)


def check_branch(branch: str, where: str = "") -> None:
    """A target branch is passed to git: it must be a branch name git accepts
    (``git check-ref-format --branch``) and cannot look like an option (``-b``,
    ``--upload-pack=…``). Checked without git, so the API refuses it before storing it."""
    problem = _branch_problem(branch)
    if problem:
        raise InvalidRequest(
            f"{where}invalid branch {branch[:80]!r}: it {problem}", code="invalid_branch"
        )


def _branch_problem(branch: str) -> str | None:
    if not branch:
        return "is empty"
    if len(branch) > MAX_BRANCH_CHARS:
        return f"is longer than {MAX_BRANCH_CHARS} characters"
    if branch.startswith("-"):
        return "starts with '-'"
    if _BRANCH_FORBIDDEN.search(branch):
        return "contains a space, a control character or one of ~ ^ : ? * [ \\"
    if ".." in branch or "@{" in branch:
        return "contains '..' or '@{'"
    if any(not c or c.startswith(".") or c.endswith(".lock") for c in branch.split("/")):
        return "has an empty component, or one starting with '.' or ending in '.lock'"
    if branch.endswith("."):
        return "ends with '.'"
    if branch in ("@", "HEAD"):
        return "is reserved"
    return None


def sanitize_branch(branch: str) -> str:
    """``branch`` as a single file name (for the integration worktree and the lock)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", branch.replace("/", "__"))
