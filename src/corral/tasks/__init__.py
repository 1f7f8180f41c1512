"""Task graphs: plans of dependent tasks in a git repository, each run in its own worktree."""
