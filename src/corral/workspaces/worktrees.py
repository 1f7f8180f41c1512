"""The worktrees git knows in a repository, told valid from broken and finished from not.

A kill can leave a worktree at any stage of ``git worktree add``: a registration without
its files, files without a registration, a checkout half written. Before corral runs git
in a directory it checks that git knows it as a worktree and that git there would act on
it (``checkout_at``): in a broken directory git would walk up and act on the user's
checkout instead. A checkout is known finished once corral's ``corral-ready`` mark is in
its private directory (``finished``); one that is not holds nothing to keep and is built
again. Registrations are dropped one by one, never with ``git worktree prune`` (see
``forget_stale``).
"""

from __future__ import annotations

import fcntl
import shutil
from dataclasses import dataclass
from pathlib import Path

from corral.workspaces import locks
from corral.workspaces.names import EXCLUDE_LINE, WORKTREES_DIR
from corral.workspaces.repo import GitRepo

READY_MARK = "corral-ready"


@dataclass(frozen=True)
class Registered:
    branch: str | None  # the full ref checked out, None when detached
    prunable: bool


def ensure_excluded(repo: GitRepo) -> None:
    """Make git ignore ``.corral/`` via ``info/exclude`` (idempotent, concurrency-safe)."""
    info = repo.common_dir / "info"
    info.mkdir(exist_ok=True)
    with open(info / "exclude", "a+", encoding="utf-8", errors="surrogateescape") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        if any(line.strip() in (EXCLUDE_LINE, "/" + EXCLUDE_LINE) for line in text.splitlines()):
            return
        f.write(("" if not text or text.endswith("\n") else "\n") + EXCLUDE_LINE + "\n")


def registered(repo: GitRepo) -> dict[Path, Registered]:
    """Every worktree git knows, by path (``git worktree list``)."""
    _drop_unborn_registrations(repo)
    out = repo.run(repo.top, "worktree", "list", "--porcelain", "-z").stdout
    found = {}
    for record in out.split("\0\0"):
        fields = [f for f in record.split("\0") if f]
        if not fields or not fields[0].startswith("worktree "):
            continue
        branch = next((f.removeprefix("branch ") for f in fields if f.startswith("branch ")), None)
        prunable = any(f.split(" ", 1)[0] == "prunable" for f in fields)
        found[Path(fields[0].removeprefix("worktree ")).resolve()] = Registered(branch, prunable)
    return found


def user_worktrees(repo: GitRepo) -> list[Path]:
    """Every worktree of the repository but corral's own."""
    mine = repo.top / ".corral"
    return [w for w in registered(repo) if w != mine and mine not in w.parents]


def checkout_at(repo: GitRepo, path: Path) -> str | None:
    """The ref checked out in the valid worktree at ``path`` ('' if detached), else None."""
    entry = registered(repo).get(path.resolve())
    if entry is None or entry.prunable or path.is_symlink() or not path.is_dir():
        return None
    proc = repo.run(path, "rev-parse", "--show-toplevel", ok=(0, 128))
    if proc.returncode != 0 or Path(proc.stdout.strip()).resolve() != path.resolve():
        return None  # its .git is missing or dangling: git would act on another repository
    return entry.branch or ""


def discard_broken(repo: GitRepo, path: Path, branch_ref: str | None = None) -> None:
    """Remove what is at ``path`` (not a valid worktree) and forget stale registrations."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    forget_stale(repo, path, branch_ref)


def forget_stale(repo: GitRepo, path: Path, branch_ref: str | None) -> None:
    """Drop the registrations, whose directory is gone, of ``path`` or ``branch_ref``.

    ``git worktree remove`` on each rather than ``git worktree prune``: pruning is
    repository-wide and would also forget the user's own worktrees whose directories
    are missing for now (an unmounted disk).
    """
    for where, entry in registered(repo).items():
        # A registration git left locked ("initializing": `worktree add` was killed)
        # is not prunable for git, but its directory is gone all the same.
        gone = entry.prunable or not (where.is_dir() or where.is_symlink())
        if gone and (where == path.resolve() or entry.branch == branch_ref):
            repo.run(repo.top, "worktree", "remove", "--force", "--force", str(where))


def finished(repo: GitRepo, worktree: Path) -> bool:
    """Is the worktree known to be fully checked out?

    ``git worktree add`` writes ``locked`` ("initializing") in the worktree's private
    directory before checking files out and removes it once done (or once its checkout
    failed, before it deletes what it made); corral writes its mark right after. No mark
    and no ``locked``: complete if the index matches ``HEAD`` (git wrote the index last;
    the kill came before the mark, or corral predates the mark), else not.
    """
    private = repo.private_dir(worktree)
    if (private / READY_MARK).exists():
        return True
    if (private / "locked").exists():
        return False
    index = repo.run(worktree, "diff-index", "--cached", "--quiet", "HEAD", ok=range(256))
    if index.returncode != 0:  # differs, or no HEAD at all
        return False
    (private / READY_MARK).touch()
    return True


def mark_finished(repo: GitRepo, worktree: Path) -> None:
    (repo.private_dir(worktree) / READY_MARK).touch()


def drop_if_unfinished(repo: GitRepo, worktree: Path) -> bool:
    """Remove the (valid) worktree if its checkout is not known complete; True if so."""
    if finished(repo, worktree):
        return False
    repo.run(repo.top, "worktree", "remove", "--force", "--force", str(worktree))
    return True


def _drop_unborn_registrations(repo: GitRepo) -> None:
    """Remove what a `git worktree add` killed before it wrote ``commondir`` left.

    Its ``<common>/worktrees/<id>`` holds git's ``locked`` ("initializing") and an empty
    or missing ``commondir``/``gitdir``/``HEAD``: every ``git worktree`` command then
    fails ("failed to read …/commondir"). Its ``locked`` is judged like a lock file
    (``locks``: no live git in the repository, old enough) before the directory goes.
    """
    admin = repo.common_dir / "worktrees"
    unborn = [
        entry
        for entry in (admin.iterdir() if admin.is_dir() else ())
        if (entry / "locked").is_file()
        and not all(_nonempty(entry / name) for name in ("commondir", "gitdir", "HEAD"))
    ]
    if not unborn:
        return
    scope = locks.Scope((repo.top, repo.common_dir), (repo.top / WORKTREES_DIR,))
    for cleared in locks.clear_debris([entry / "locked" for entry in unborn], scope):
        shutil.rmtree(cleared.parent, ignore_errors=True)


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False
