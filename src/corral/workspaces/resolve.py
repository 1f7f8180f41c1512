"""Handing a merge conflict back to the agent, in the task's own worktree.

When a task's branch could not be merged into the target, a second attempt first merges
the target into the task branch (``--no-commit``), leaving the conflicts in the worktree
for the agent to resolve. The commit that follows is a merge commit, so the task branch
then contains the target and merges into it cleanly. Conflict markers the agent leaves
behind are caught before anything is committed.
"""

from __future__ import annotations

from pathlib import Path

from corral.workspaces.cmd import run_git

MARKERS = ("<<<<<<< ", ">>>>>>> ")


def merge_target_into(worktree: Path, target_branch: str) -> list[str]:
    """Start merging the target into the task branch; the paths left in conflict.

    Safe to repeat after a crash: a merge already under way is left as it is."""
    merging = run_git(worktree, "rev-parse", "-q", "--verify", "MERGE_HEAD", ok=(0, 1))
    if merging.returncode != 0:
        tip = run_git(worktree, "rev-parse", f"refs/heads/{target_branch}").stdout.strip()
        contained = run_git(worktree, "merge-base", "--is-ancestor", tip, "HEAD", ok=(0, 1))
        if contained.returncode == 0:
            return []
        run_git(worktree, "merge", "--no-ff", "--no-commit", tip, ok=(0, 1))
    conflicted = run_git(worktree, "diff", "--name-only", "--diff-filter=U").stdout
    return [line for line in conflicted.splitlines() if line]


def unresolved(worktree: Path, paths: list[str]) -> list[str]:
    """The paths that still hold conflict markers."""
    left = []
    for path in paths:
        try:
            text = (worktree / path).read_text(errors="replace")
        except OSError:
            continue  # deleted: a resolution too
        if any(line.startswith(MARKERS) for line in text.splitlines()):
            left.append(path)
    return left
