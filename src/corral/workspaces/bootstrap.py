"""Bootstrapping a task worktree: copy the untracked files it needs, run its setup command.

The include file (``.worktreeinclude`` at the top of the user's checkout) lists one path or
glob per line, relative to the repository (``#`` starts a comment, a leading or trailing
``/`` is ignored, ``**`` matches across directories, ``!`` negation is not supported).
Every file matched (directories are copied file by file) that is missing from the worktree
is copied in; files already there are left alone, so a reused worktree keeps its edits.

What was copied is recorded, *before* copying, in the worktree's private git directory
(``corral-bootstrap``, never in the working tree): ``commit_all`` never commits those files
and ``remove_worktree_if_clean`` does not count them as changes, even when the user's
``.gitignore`` does not ignore them. The setup command runs once per worktree: a marker in
the same directory (``corral-setup``, holding the command) skips it on reuse, and a changed
command runs again.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from corral.workspaces.cmd import WorkspaceError, run_setup

RECORD_FILE = "corral-bootstrap"
SETUP_MARK = "corral-setup"
_SKIPPED_TOP = frozenset({".git", ".corral"})


def include_patterns(repo: Path, include_file: str) -> list[str]:
    path = repo / include_file
    if not path.is_file():
        return []
    patterns = []
    for number, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern = line.strip("/")
        parts = PurePosixPath(pattern).parts
        if line.startswith("!") or not parts or ".." in parts:
            raise WorkspaceError(
                f"{path}:{number}: {line!r} is not a path or glob inside the repository",
                code="invalid_include",
            )
        patterns.append(pattern)
    return patterns


def _files_under(repo: Path, match: Path) -> list[str]:
    """``match`` (a file, symlink or directory) as the repo-relative files to copy."""
    if match.is_symlink() or match.is_file():
        return [match.relative_to(repo).as_posix()]
    if not match.is_dir():
        return []
    found = []
    for root, dirs, files in os.walk(match):
        base = Path(root)
        dirs[:] = [d for d in dirs if d != ".git"]
        linked = [d for d in dirs if (base / d).is_symlink()]  # copied as links, not walked
        dirs[:] = [d for d in dirs if d not in linked]
        found += [(base / name).relative_to(repo).as_posix() for name in [*files, *linked]]
    return found


def recorded(private_dir: Path) -> set[str]:
    """The files bootstrap copied into the worktree whose private git dir is given."""
    try:
        return set(json.loads((private_dir / RECORD_FILE).read_text()))
    except (OSError, ValueError):
        return set()


def copy_included(repo: Path, worktree: Path, private_dir: Path, include_file: str) -> list[str]:
    """Copy the included files missing from ``worktree``; return their relative paths."""
    wanted: dict[str, None] = {}
    for pattern in include_patterns(repo, include_file):
        for match in sorted(repo.glob(pattern)):
            parts = match.relative_to(repo).parts
            if parts and parts[0] not in _SKIPPED_TOP:
                wanted.update(dict.fromkeys(_files_under(repo, match)))
    missing = [
        rel for rel in wanted if not (worktree / rel).exists() and not (worktree / rel).is_symlink()
    ]
    if not missing:
        return []
    record = private_dir / RECORD_FILE
    scratch = record.with_name(RECORD_FILE + ".tmp")
    scratch.write_text(json.dumps(sorted(recorded(private_dir) | set(missing))))
    scratch.replace(record)
    try:
        for rel in missing:
            src, dest = repo / rel, worktree / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dest)
            else:
                shutil.copy2(src, dest)
    except OSError as e:
        raise WorkspaceError(
            f"cannot copy {include_file} entries into {worktree}: {e}", code="bootstrap_failed"
        ) from e
    return missing


def setup_once(
    worktree: Path,
    private_dir: Path,
    command: Sequence[str],
    timeout: float | None,
    env: Mapping[str, str] | None = None,
) -> bool:
    """Run ``command`` in ``worktree`` unless it already succeeded there; True if it ran."""
    mark = private_dir / SETUP_MARK
    want = json.dumps(list(command))
    if mark.is_file() and mark.read_text() == want:
        return False
    mark.unlink(missing_ok=True)
    run_setup(command, worktree, timeout, env)
    mark.write_text(want)
    return True
