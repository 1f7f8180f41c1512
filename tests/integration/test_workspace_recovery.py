"""Workspaces after a kill -9 inside a git command, against real git repositories.

The state a kill leaves is made by hand (a worktree ``git worktree add`` never finished, a
worktree missing files, git's lock files, a detached HEAD) and the next step must recover
from it, or refuse it, saying what to run, when the work in it is not corral's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_workspaces import APP, do_task, git, isolated_git, repo, ws

from corral.workspaces import GitError, Workspace, WorkspaceError, locks

__all__ = ["isolated_git", "repo", "ws"]  # the fixtures of test_workspaces apply here too


def private_dir(worktree: Path) -> Path:
    return Path(git(worktree, "rev-parse", "--absolute-git-dir"))


# -- a worktree whose checkout never finished ---------------------------------------------


def test_a_worktree_git_never_finished_is_rebuilt(repo: Path, ws: Workspace) -> None:
    """As ``git worktree add`` leaves it when killed mid-checkout: ``locked`` still there,
    files missing, no index."""
    wt = ws.prepare_worktree("t1", "main")
    private = private_dir(wt)
    (private / "corral-ready").unlink(missing_ok=True)
    (private / "locked").write_text("initializing")
    (private / "index").unlink()
    (wt / "app.txt").unlink()

    again = ws.prepare_worktree("t1", "main")
    assert again == wt
    assert (wt / "app.txt").read_text() == APP
    assert git(wt, "status", "--porcelain") == ""
    assert not (private_dir(wt) / "locked").exists()
    (wt / "new.txt").write_text("new\n")
    sha = ws.commit_all(wt, "task t1")
    assert sha is not None
    assert git(repo, "diff", "--name-status", "main", sha) == "A\tnew.txt"


def test_a_finished_worktree_without_the_mark_keeps_its_edits(ws: Workspace) -> None:
    """git finished (no ``locked``) but the kill came before corral's mark: reused as is."""
    wt = ws.prepare_worktree("t1", "main")
    (private_dir(wt) / "corral-ready").unlink(missing_ok=True)
    (wt / "edit.txt").write_text("the agent's edit\n")
    assert ws.prepare_worktree("t1", "main") == wt
    assert (wt / "edit.txt").read_text() == "the agent's edit\n"
    assert (private_dir(wt) / "corral-ready").exists()


def test_a_worktree_git_left_unlocked_without_an_index_is_rebuilt(ws: Workspace) -> None:
    """Killed while cleaning up after a failed checkout: ``locked`` gone, the files not."""
    wt = ws.prepare_worktree("t1", "main")
    private = private_dir(wt)
    (private / "corral-ready").unlink(missing_ok=True)
    (private / "index").unlink()
    (wt / "app.txt").unlink()
    assert ws.prepare_worktree("t1", "main") == wt
    assert (wt / "app.txt").read_text() == APP
    assert git(wt, "status", "--porcelain") == ""


def test_an_integration_worktree_killed_before_it_had_a_head_is_rebuilt(
    repo: Path, ws: Workspace
) -> None:
    """As ``git worktree add --detach`` leaves it when killed before setting HEAD: a null
    HEAD, ``locked``. Every merge used to fail on it ("Could not parse object 'HEAD'")."""
    do_task(ws, "t1", {"one.txt": "1\n"})
    assert ws.merge("t1", "main", strategy="merge", message="merge t1").status == "merged"
    private = private_dir(ws.integration_path("main"))
    (private / "corral-ready").unlink(missing_ok=True)
    (private / "locked").write_text("initializing")
    (private / "HEAD").write_text("0" * 40 + "\n")
    do_task(ws, "t2", {"two.txt": "2\n"})

    result = ws.merge("t2", "main", strategy="merge", message="merge t2")
    assert result.status == "merged"
    assert git(repo, "show", "main:two.txt") == "2"
    assert not (private_dir(ws.integration_path("main")) / "locked").exists()


def test_a_registration_killed_before_git_wrote_it_is_removed(repo: Path, ws: Workspace) -> None:
    """``git worktree add`` killed right after creating ``.git/worktrees/<id>``: an empty
    ``commondir`` made every ``git worktree`` command fail."""
    ws.prepare_worktree("t1", "main")
    unborn = repo / ".git" / "worktrees" / "t2"
    unborn.mkdir()
    leave_lock(unborn / "locked")
    (unborn / "gitdir").write_text(f"{ws.worktree_path('t2')}/.git\n")
    (unborn / "HEAD").write_text("0" * 40 + "\n")
    (unborn / "commondir").write_text("")
    listing = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True)
    assert listing.returncode != 0 and b"commondir" in listing.stderr

    wt = ws.prepare_worktree("t2", "main")
    assert (wt / "app.txt").read_text() == APP
    assert git(repo, "worktree", "list").count("corral/t") == 2


def test_a_locked_registration_whose_directory_is_gone_is_forgotten(ws: Workspace) -> None:
    wt = ws.prepare_worktree("t1", "main")
    (private_dir(wt) / "locked").write_text("initializing")
    (private_dir(wt) / "corral-ready").unlink(missing_ok=True)
    shutil.rmtree(wt)
    assert ws.prepare_worktree("t1", "main") == wt
    assert (wt / "app.txt").read_text() == APP


# -- the second line: a commit never deletes files the agent did not delete ---------------


def test_a_commit_deleting_files_missing_before_the_agent_is_refused(
    repo: Path, ws: Workspace
) -> None:
    wt = ws.prepare_worktree("t1", "main")
    (wt / "app.txt").unlink()  # missing before the agent starts: a checkout cut short
    ws.record_baseline(wt)
    (wt / "new.txt").write_text("the agent's file\n")
    tip = git(repo, "rev-parse", "corral/t1")

    with pytest.raises(WorkspaceError) as caught:
        ws.commit_all(wt, "task t1")
    assert caught.value.code == "unexpected_deletions"
    assert caught.value.details["paths"] == ["app.txt"]
    assert f"git worktree remove --force {wt}" in caught.value.message
    assert "corral tasks retry t1" in caught.value.message
    assert git(repo, "rev-parse", "corral/t1") == tip  # nothing committed
    assert (wt / "new.txt").exists()  # the worktree is kept as it was


def test_the_agent_may_delete_files(repo: Path, ws: Workspace) -> None:
    wt = ws.prepare_worktree("t1", "main")
    ws.record_baseline(wt)
    (wt / "app.txt").unlink()
    sha = ws.commit_all(wt, "task t1")
    assert sha is not None
    assert git(repo, "diff", "--name-status", "main", sha) == "D\tapp.txt"


def test_the_first_baseline_is_kept_when_the_agent_runs_again(repo: Path, ws: Workspace) -> None:
    """The agent deleted a file, was killed, and runs again: the file it deleted is not
    taken for one missing before it started."""
    wt = ws.prepare_worktree("t1", "main")
    ws.record_baseline(wt)
    (wt / "app.txt").unlink()
    ws.prepare_worktree("t1", "main")
    ws.record_baseline(wt)
    sha = ws.commit_all(wt, "task t1")
    assert sha is not None
    assert git(repo, "diff", "--name-status", "main", sha) == "D\tapp.txt"


# -- lock files a killed git left behind ----------------------------------------------------

LONG_AGO = 3600.0


def leave_lock(path: Path) -> Path:
    """A lock file as a git killed an hour ago left it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    past = time.time() - LONG_AGO
    os.utime(path, (past, past))
    return path


def test_lock_debris_of_a_killed_merge_is_cleared(repo: Path, ws: Workspace) -> None:
    do_task(ws, "t1", {"one.txt": "1\n"})
    assert ws.merge("t1", "main", strategy="merge", message="merge t1").status == "merged"
    do_task(ws, "t2", {"two.txt": "2\n"})
    common = Path(git(repo, "rev-parse", "--absolute-git-dir"))
    integration = private_dir(ws.integration_path("main"))
    debris = [
        leave_lock(integration / name) for name in ("HEAD.lock", "ORIG_HEAD.lock", "index.lock")
    ]
    debris += [leave_lock(common / "refs/heads/main.lock"), leave_lock(common / "packed-refs.lock")]

    result = ws.merge("t2", "main", strategy="merge", message="merge t2")
    assert result.status == "merged"
    assert git(repo, "rev-parse", "main") == result.commit
    assert [p for p in debris if p.exists()] == []
    assert git(repo, "show", "main:two.txt") == "2"


def test_lock_debris_of_a_killed_commit_is_cleared(repo: Path, ws: Workspace) -> None:
    wt = ws.prepare_worktree("t1", "main")
    (wt / "one.txt").write_text("1\n")
    common = Path(git(repo, "rev-parse", "--absolute-git-dir"))
    debris = [leave_lock(private_dir(wt) / name) for name in ("HEAD.lock", "index.lock")]
    debris.append(leave_lock(common / "refs/heads/corral/t1.lock"))

    assert ws.prepare_worktree("t1", "main") == wt
    assert [p for p in debris if p.exists()] == []
    sha = ws.commit_all(wt, "task t1")
    assert sha == git(repo, "rev-parse", "corral/t1")


def test_a_lock_held_by_a_live_git_is_left_alone(
    repo: Path, ws: Workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The user's ``git update-ref`` of main waits in its reference-transaction hook, holding
    ``refs/heads/main.lock`` (aged, as by a slow hook): corral's merge must not take it."""
    monkeypatch.setattr(locks, "WAIT_S", 0.5)
    do_task(ws, "t1", {"one.txt": "1\n"})
    users_commit = git(repo, "commit-tree", "-p", "main", "-m", "the user's", "main^{tree}")
    gate = tmp_path / "gate"
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text(  # waits in the user's update of main only
        "#!/bin/sh\n"
        "updates=$(cat)\n"
        f'if [ "$1" = prepared ] && [ -e "{gate}" ] && echo "$updates" | grep -q "{users_commit}"\n'
        "then\n"
        f'  touch "{gate}.waiting"; while [ -e "{gate}" ]; do sleep 0.02; done\n'
        "fi\n"
    )
    hook.chmod(0o755)
    gate.touch()
    user = subprocess.Popen(["git", "-C", str(repo), "update-ref", "refs/heads/main", users_commit])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "gate.waiting").exists():
            assert time.monotonic() < deadline and user.poll() is None, "the hook never ran"
            time.sleep(0.02)
        held = Path(repo / ".git" / "refs/heads/main.lock")
        past = time.time() - LONG_AGO
        os.utime(held, (past, past))

        with pytest.raises(GitError):
            ws.merge("t1", "main", strategy="merge", message="merge t1")
        assert held.exists()
    finally:
        gate.unlink()
        assert user.wait(timeout=30) == 0
    assert git(repo, "rev-parse", "main") == users_commit
    result = ws.merge("t1", "main", strategy="merge", message="merge t1")
    assert result.status == "merged"


# -- a worktree left on a detached HEAD -----------------------------------------------------


def test_a_worktree_detached_at_its_branch_tip_is_reattached(repo: Path, ws: Workspace) -> None:
    sha = do_task(ws, "t1", {"one.txt": "1\n"})
    wt = ws.worktree_path("t1")
    git(wt, "checkout", "-q", "--detach")
    (wt / "edit.txt").write_text("an edit\n")

    assert ws.prepare_worktree("t1", "main") == wt
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/corral/t1"
    assert git(wt, "rev-parse", "HEAD") == sha
    assert (wt / "edit.txt").read_text() == "an edit\n"


def test_a_worktree_detached_behind_its_branch_moves_to_the_tip(repo: Path, ws: Workspace) -> None:
    first = do_task(ws, "t1", {"one.txt": "1\n"})
    second = do_task(ws, "t1", {"two.txt": "2\n"}, message="task t1 again")
    wt = ws.worktree_path("t1")
    git(wt, "checkout", "-q", "--detach", first)
    (wt / "edit.txt").write_text("an edit\n")

    ws.prepare_worktree("t1", "main")
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/corral/t1"
    assert git(wt, "rev-parse", "HEAD") == second
    assert (wt / "two.txt").exists() and (wt / "edit.txt").read_text() == "an edit\n"


def test_a_detached_worktree_whose_branch_is_gone_is_reattached_at_the_recorded_commit(
    repo: Path, ws: Workspace
) -> None:
    sha = do_task(ws, "t1", {"one.txt": "1\n"})
    wt = ws.worktree_path("t1")
    git(wt, "checkout", "-q", "--detach")
    git(repo, "update-ref", "-d", "refs/heads/corral/t1")

    ws.prepare_worktree("t1", "main", recorded_commit=sha)
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/corral/t1"
    assert git(repo, "rev-parse", "corral/t1") == sha


def test_a_detached_worktree_holding_other_work_is_refused_with_the_command(
    repo: Path, ws: Workspace
) -> None:
    do_task(ws, "t1", {"one.txt": "1\n"})
    wt = ws.worktree_path("t1")
    git(wt, "checkout", "-q", "--detach", "main")
    (wt / "mine.txt").write_text("the user's\n")
    git(wt, "add", "mine.txt")
    git(wt, "commit", "-qm", "the user's own commit")
    users = git(wt, "rev-parse", "HEAD")

    with pytest.raises(WorkspaceError) as caught:
        ws.prepare_worktree("t1", "main")
    assert caught.value.code == "worktree_mismatch"
    command = f"git -C {wt} branch corral-saved/t1 HEAD && git -C {wt} switch corral/t1"
    assert command in caught.value.message
    assert git(wt, "rev-parse", "HEAD") == users  # left alone

    subprocess.run(command, shell=True, check=True, capture_output=True)
    assert ws.prepare_worktree("t1", "main") == wt
    assert git(repo, "rev-parse", "corral-saved/t1") == users
