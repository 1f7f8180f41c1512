"""Workspaces: a git worktree per task, committed and merged into the target branch.

See ``corral.workspaces.workspace`` for the layout, the layers and the invariants.
"""

from corral.workspaces.cmd import GitError, SetupFailed, WorkspaceError
from corral.workspaces.merge import MergeResult, MergeStatus, Strategy, merge_lock
from corral.workspaces.names import sanitize_branch
from corral.workspaces.workspace import Workspace

__all__ = [
    "GitError",
    "MergeResult",
    "MergeStatus",
    "SetupFailed",
    "Strategy",
    "Workspace",
    "WorkspaceError",
    "merge_lock",
    "sanitize_branch",
]
