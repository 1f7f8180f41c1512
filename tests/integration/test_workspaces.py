"""Task worktrees, commits and merges (``corral.workspaces``) against real git repositories.

Each test gets a fresh repository in ``tmp_path`` (branch ``main``, one commit, a local
identity) and a git that reads neither the developer's global nor the system config.
Crashes are simulated by leaving behind the state a crash would (a worktree, a branch, a
commit, a half-done merge) and running the step again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from corral.errors import InvalidRequest
from corral.workspaces import (
    GitError,
    MergeResult,
    SetupFailed,
    Workspace,
    WorkspaceError,
    merge_lock,
)

APP = "line one\nline two\nline three\n"


def git(cwd: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


@pytest.fixture(autouse=True)
def isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in list(os.environ):
        if name.startswith("GIT_") and name not in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM"):
            monkeypatch.delenv(name)


def make_repo(path: Path, *, identity: bool = True) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    if identity:
        git(path, "config", "user.name", "Test User")
        git(path, "config", "user.email", "test@example.com")
    (path / "README.md").write_text("# demo\n")
    (path / "app.txt").write_text(APP)
    git(path, "add", "-A")
    git(
        path,
        "-c",
        "user.name=Init",
        "-c",
        "user.email=init@example.com",
        "commit",
        "-qm",
        "initial",
    )
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def ws(repo: Path) -> Workspace:
    return Workspace(repo)


def do_task(ws: Workspace, key: str, files: dict[str, str], message: str | None = None) -> str:
    """Prepare ``key``'s worktree, write ``files`` there and commit; the commit's sha."""
    wt = ws.prepare_worktree(key, "main")
    for name, text in files.items():
        (wt / name).parent.mkdir(parents=True, exist_ok=True)
        (wt / name).write_text(text)
    sha = ws.commit_all(wt, message or f"task {key}")
    assert sha is not None
    return sha


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file of a working tree (outside .git and .corral), with its bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".corral")
    }


def user_checkout(repo: Path) -> dict[str, Any]:
    """What a merge must not change in the user's checkout: files, index, branch."""
    return {
        "files": tree_files(repo),
        "index": (repo / ".git" / "index").read_bytes(),
        "staged": git(repo, "ls-files", "--stage"),
        "branch": git(repo, "symbolic-ref", "HEAD"),
    }


def assert_integration_clean(ws: Workspace, target: str = "main") -> None:
    path = ws.integration_path(target)
    assert git(path, "rev-parse", "-q", "--verify", "MERGE_HEAD", check=False) == ""
    assert git(path, "status", "--porcelain", "--untracked-files=all", "--ignored") == ""


# -- layout and prepare ---------------------------------------------------------------


def test_prepare_creates_worktree_on_task_branch_and_hides_corral(repo: Path, ws: Workspace):
    wt = ws.prepare_worktree("t1", "main")

    assert wt == repo / ".corral" / "worktrees" / "t1" == ws.worktree_path("t1")
    assert ws.branch_name("t1") == "corral/t1"
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/corral/t1"
    assert git(wt, "rev-parse", "HEAD") == ws.head("main") == git(repo, "rev-parse", "main")
    assert (wt / "app.txt").read_text() == APP
    assert ws.current_branch() == "main"

    ws.prepare_worktree("t2", "main")
    exclude = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert exclude.count(".corral/") == 1
    assert not (repo / ".gitignore").exists()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert not ws.branch_has_changes("t1", "main")


def test_prepare_reuses_worktree_left_by_a_crash(repo: Path, ws: Workspace):
    wt = ws.prepare_worktree("t1", "main")
    (wt / "app.txt").write_text("edited by the agent\n")
    (wt / "new.txt").write_text("new\n")
    do_task(ws, "other", {"other.txt": "main moves on\n"})
    ws.merge("other", "main", strategy="merge", message="merge other")

    assert ws.prepare_worktree("t1", "main") == wt
    assert (wt / "app.txt").read_text() == "edited by the agent\n"
    assert (wt / "new.txt").read_text() == "new\n"
    assert not (wt / "other.txt").exists()  # still on its original base


def test_prepare_reattaches_an_existing_branch_without_resetting_it(repo: Path, ws: Workspace):
    sha = do_task(ws, "t1", {"feature.txt": "feature\n"})
    shutil.rmtree(ws.worktree_path("t1"))  # the worktree is gone, the branch is not
    do_task(ws, "other", {"other.txt": "x\n"})
    ws.merge("other", "main", strategy="merge", message="merge other")

    wt = ws.prepare_worktree("t1", "main")

    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/corral/t1"
    assert git(wt, "rev-parse", "HEAD") == sha
    assert (wt / "feature.txt").read_text() == "feature\n"
    assert ws.branch_has_changes("t1", "main")


@pytest.mark.parametrize("damage", ["dot_git_file", "admin_dir", "unregistered_dir"])
def test_prepare_recreates_a_broken_worktree_dir(repo: Path, ws: Workspace, damage: str):
    path = ws.worktree_path("t1")
    if damage == "unregistered_dir":
        path.mkdir(parents=True)
        (path / "junk.txt").write_text("junk\n")
    else:
        ws.prepare_worktree("t1", "main")
        (path / "junk.txt").write_text("junk\n")
        if damage == "dot_git_file":
            (path / ".git").unlink()  # git here would now act on the user's repo
        else:
            shutil.rmtree(repo / ".git" / "worktrees" / "t1")
    wt = ws.prepare_worktree("t1", "main")

    assert Path(git(wt, "rev-parse", "--show-toplevel")).resolve() == wt.resolve()
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/corral/t1"
    assert not (wt / "junk.txt").exists()
    assert git(wt, "status", "--porcelain") == ""
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_the_users_own_missing_worktrees_are_not_pruned(tmp_path: Path, repo: Path, ws: Workspace):
    elsewhere = tmp_path / "usb-stick" / "feature"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(elsewhere))
    shutil.rmtree(tmp_path / "usb-stick")  # unmounted, say
    do_task(ws, "t1", {"x.txt": "x\n"})
    shutil.rmtree(ws.worktree_path("t1"))  # a stale registration corral must clear

    ws.prepare_worktree("t1", "main")
    assert ws.remove_worktree_if_clean("t1")

    assert str(elsewhere) in git(repo, "worktree", "list")


def test_prepare_refuses_a_worktree_on_another_branch(repo: Path, ws: Workspace):
    wt = ws.prepare_worktree("t1", "main")
    git(wt, "checkout", "-q", "-b", "other")
    with pytest.raises(WorkspaceError) as e:
        ws.prepare_worktree("t1", "main")
    assert e.value.code == "worktree_mismatch"
    assert f"git -C {wt} switch corral/t1" in e.value.message
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/other"


def test_bad_names_are_refused(ws: Workspace):
    for key in ("../x", "a/b", "-x", "x.lock", "a..b", ""):
        with pytest.raises(InvalidRequest):
            ws.prepare_worktree(key, "main")
    with pytest.raises(InvalidRequest):
        ws.prepare_worktree("t1", "no..branch")
    with pytest.raises(GitError) as e:
        ws.prepare_worktree("t1", "missing")
    assert e.value.code == "ref_not_found"


# -- bootstrap ------------------------------------------------------------------------


def test_worktreeinclude_copies_untracked_files_and_never_commits_them(repo: Path, ws: Workspace):
    (repo / ".env").write_text("SECRET=1\n")  # untracked and not ignored
    (repo / "config" / "local").mkdir(parents=True)
    (repo / "config" / "local" / "db.json").write_text("{}\n")
    (repo / "certs").mkdir()
    (repo / "certs" / "dev.pem").write_text("pem\n")
    (repo / ".worktreeinclude").write_text(
        "# files a fresh checkout lacks\n.env\n\n/config/local/\ncerts/*.pem\nnothing-*.txt\n"
    )

    wt = ws.prepare_worktree("t1", "main")

    assert (wt / ".env").read_text() == "SECRET=1\n"
    assert (wt / "config" / "local" / "db.json").read_text() == "{}\n"
    assert (wt / "certs" / "dev.pem").read_text() == "pem\n"

    (wt / ".env").write_text("SECRET=changed\n")
    ws.prepare_worktree("t1", "main")
    assert (wt / ".env").read_text() == "SECRET=changed\n"  # present files are left alone

    assert ws.commit_all(wt, "nothing but copies") is None
    (wt / "feature.txt").write_text("f\n")
    sha = ws.commit_all(wt, "feature")
    assert sha is not None
    assert git(wt, "show", "--name-only", "--format=", sha).splitlines() == ["feature.txt"]
    assert ws.remove_worktree_if_clean("t1")  # the copies do not make it dirty
    assert not wt.exists()


def test_worktreeinclude_entries_outside_the_repo_are_refused(repo: Path, ws: Workspace):
    (repo / ".worktreeinclude").write_text("../outside\n")
    with pytest.raises(WorkspaceError) as e:
        ws.prepare_worktree("t1", "main")
    assert e.value.code == "invalid_include"


def test_setup_command_runs_in_the_worktree_once(ws: Workspace):
    setup = [sys.executable, "-c", "open('setup.log', 'a').write('ran\\n')"]
    wt = ws.prepare_worktree("t1", "main", setup_command=setup)
    assert (wt / "setup.log").read_text() == "ran\n"

    ws.prepare_worktree("t1", "main", setup_command=setup)
    assert (wt / "setup.log").read_text() == "ran\n"

    ws.prepare_worktree("t1", "main", setup_command=[*setup, "changed"])
    assert (wt / "setup.log").read_text() == "ran\nran\n"


def test_setup_command_sees_only_the_environment_it_is_given(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RUNNER_SECRET", "s3cret")  # the runner's own, not the run's
    dump = [sys.executable, "-c", "import os, json; json.dump(dict(os.environ), open('env', 'w'))"]
    wt = ws.prepare_worktree("t1", "main", setup_command=dump, setup_env={"ONLY": "this"})
    seen = json.loads((wt / "env").read_text())
    assert seen["ONLY"] == "this" and "RUNNER_SECRET" not in seen


def test_failed_setup_command_raises_with_its_output(ws: Workspace):
    failing = [sys.executable, "-c", "import sys; print('npm is sad'); sys.exit(3)"]
    with pytest.raises(SetupFailed) as e:
        ws.prepare_worktree("t1", "main", setup_command=failing)
    assert "npm is sad" in e.value.message
    assert "exit 3" in e.value.message
    assert e.value.code == "setup_failed"

    fixed = [sys.executable, "-c", "open('ok', 'w').write('1')"]
    wt = ws.prepare_worktree("t1", "main", setup_command=fixed)  # retried: runs again
    assert (wt / "ok").exists()

    with pytest.raises(SetupFailed):
        ws.prepare_worktree("t2", "main", setup_command=["/nonexistent/setup-tool"])


# -- commits --------------------------------------------------------------------------


def test_commit_without_changes_returns_none(repo: Path, ws: Workspace):
    wt = ws.prepare_worktree("t1", "main")
    # Even with the message of the commit the branch was created at.
    assert ws.commit_all(wt, "initial") is None
    assert ws.commit_all(wt, "anything") is None
    assert git(wt, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")
    assert not ws.branch_has_changes("t1", "main")


def test_commit_is_idempotent_across_a_crash(repo: Path, ws: Workspace):
    wt = ws.prepare_worktree("t1", "main")
    (wt / "app.txt").write_text("changed\n")
    (wt / "dir").mkdir()
    (wt / "dir" / "new.txt").write_text("new\n")
    (wt / "README.md").unlink()

    sha = ws.commit_all(wt, "Add the feature\n\nWith a body.\n")

    assert sha == git(wt, "rev-parse", "HEAD")
    assert git(wt, "status", "--porcelain") == ""
    assert git(wt, "rev-parse", "HEAD^") == git(repo, "rev-parse", "main")
    assert git(wt, "log", "-1", "--format=%an <%ae>") == "Test User <test@example.com>"
    changed = git(wt, "show", "--name-status", "--format=", sha).splitlines()
    assert sorted(changed) == ["A\tdir/new.txt", "D\tREADME.md", "M\tapp.txt"]
    # Re-run after "crashing" between the commit and recording it.
    assert ws.commit_all(wt, "Add the feature\n\nWith a body.\n") == sha
    assert ws.commit_all(wt, "another message") is None
    assert git(wt, "rev-list", "--count", "main..HEAD") == "1"
    assert ws.branch_has_changes("t1", "main")


def test_commit_without_identity_uses_corral(tmp_path: Path):
    ws = Workspace(make_repo(tmp_path / "bare-config", identity=False))
    wt = ws.prepare_worktree("t1", "main")
    (wt / "x.txt").write_text("x\n")
    assert ws.commit_all(wt, "x") is not None
    assert git(wt, "log", "-1", "--format=%an <%ae>|%cn <%ce>") == (
        "corral <corral@localhost>|corral <corral@localhost>"
    )
    result = ws.merge("t1", "main", strategy="merge", message="merge t1")
    assert result.status == "merged"


def test_commit_refuses_anything_but_a_task_worktree(repo: Path, ws: Workspace):
    (repo / "app.txt").write_text("user's own edit\n")
    with pytest.raises(WorkspaceError) as e:
        ws.commit_all(repo, "should not happen")
    assert e.value.code == "not_a_task_worktree"
    assert git(repo, "diff", "--cached", "--name-only") == ""


# -- merges ---------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["merge", "ff"])
def test_clean_merge_advances_the_branch_without_touching_the_users_checkout(
    repo: Path, ws: Workspace, strategy: Any
):
    (repo / "app.txt").write_text("the user's uncommitted edit\n")
    (repo / "scratch.txt").write_text("untracked\n")
    git(repo, "add", "scratch.txt")
    (repo / "notes.txt").write_text("untracked too\n")
    sha = do_task(ws, "t1", {"feature.txt": "feature\n", "app.txt": APP + "line four\n"})
    old_main = ws.head("main")
    before = user_checkout(repo)

    result = ws.merge("t1", "main", strategy=strategy, message="Merge task t1")

    assert result.status == "merged"
    assert result.commit == ws.head("main") == git(repo, "rev-parse", "refs/heads/main")
    if strategy == "ff":
        assert result.commit == sha
    else:
        assert git(repo, "rev-list", "--parents", "-n1", "main").split() == [
            result.commit,
            old_main,
            sha,
        ]
        assert git(repo, "log", "-1", "--format=%s", "main") == "Merge task t1"
    assert git(repo, "show", "main:feature.txt") == "feature"
    assert user_checkout(repo) == before
    assert_integration_clean(ws)
    assert not ws.branch_has_changes("t1", "main")


def test_merge_leaves_a_checkout_of_another_branch_exactly_as_it_was(repo: Path, ws: Workspace):
    git(repo, "checkout", "-q", "-b", "dev")
    (repo / "app.txt").write_text("wip\n")
    (repo / "untracked.txt").write_text("u\n")
    do_task(ws, "t1", {"feature.txt": "feature\n"})
    status = git(repo, "status", "--porcelain", "--untracked-files=all")
    before = user_checkout(repo)

    assert ws.merge("t1", "main", strategy="merge", message="m").status == "merged"

    assert git(repo, "status", "--porcelain", "--untracked-files=all") == status
    assert user_checkout(repo) == before
    assert ws.current_branch() == "dev"


def test_conflicting_merge_is_reported_and_changes_nothing(repo: Path, ws: Workspace):
    do_task(ws, "a", {"app.txt": "line one\nline TWO from a\nline three\n"})
    b_tip = do_task(ws, "b", {"app.txt": "line one\nline 2 from b\nline three\n", "b.txt": "b\n"})
    assert ws.merge("a", "main", strategy="merge", message="merge a").status == "merged"
    main_after_a = ws.head("main")
    before = user_checkout(repo)

    result = ws.merge("b", "main", strategy="merge", message="merge b")

    assert result.status == "conflict"
    assert result.commit is None
    assert result.conflicted_paths == ["app.txt"]
    assert "app.txt" in result.conflict_detail
    assert "line TWO from a" in result.conflict_detail
    assert "line 2 from b" in result.conflict_detail
    assert len(result.conflict_detail) <= 4200
    assert ws.head("main") == main_after_a
    assert ws.head("corral/b") == b_tip
    assert user_checkout(repo) == before
    assert_integration_clean(ws)
    # Nothing sticks: asking again gives the same answer.
    assert ws.merge("b", "main", strategy="ff", message="merge b").status == "conflict"


def test_conflict_detail_is_capped(repo: Path, ws: Workspace):
    big_a = "".join(f"a line {i}\n" for i in range(2000))
    big_b = "".join(f"b line {i}\n" for i in range(2000))
    do_task(ws, "a", {"app.txt": big_a})
    do_task(ws, "b", {"app.txt": big_b})
    ws.merge("a", "main", strategy="merge", message="merge a")
    result = ws.merge("b", "main", strategy="merge", message="merge b")
    assert result.status == "conflict"
    assert len(result.conflict_detail) <= 4096 + 20
    assert result.conflict_detail.endswith("(truncated)")


def test_merging_again_says_already_merged(repo: Path, ws: Workspace):
    do_task(ws, "t1", {"feature.txt": "feature\n"})
    first = ws.merge("t1", "main", strategy="merge", message="merge t1")
    # A crash after the merge, before it was recorded: the task is merged again.
    again = ws.merge("t1", "main", strategy="merge", message="merge t1")
    assert again == MergeResult("already_merged", first.commit)
    assert ws.head("main") == first.commit


def test_interrupted_merge_is_cleaned_up_before_the_next(repo: Path, ws: Workspace):
    do_task(ws, "a", {"app.txt": "from a\n"})
    do_task(ws, "b", {"app.txt": "from b\n"})
    ws.merge("a", "main", strategy="merge", message="merge a")
    integ = ws.integration_path("main")
    # A merge killed halfway: MERGE_HEAD, conflict markers and stray files left behind.
    git(integ, "checkout", "-q", "--detach", "main")
    assert git(integ, "merge", "--no-edit", "corral/b", check=False) != ""
    assert git(integ, "rev-parse", "-q", "--verify", "MERGE_HEAD") != ""
    (integ / "stray.txt").write_text("left over\n")
    (integ / "build").mkdir()
    (integ / "build" / "out.o").write_text("obj\n")
    do_task(ws, "c", {"c.txt": "c\n"})

    result = ws.merge("c", "main", strategy="merge", message="merge c")

    assert result.status == "merged"
    assert git(repo, "show", "main:c.txt") == "c"
    assert git(repo, "show", "main:app.txt") == "from a"
    assert_integration_clean(ws)

    # A git killed while holding the index lock is cleaned up too.
    (Path(git(integ, "rev-parse", "--absolute-git-dir")) / "index.lock").write_text("")
    do_task(ws, "d", {"d.txt": "d\n"})
    assert ws.merge("d", "main", strategy="ff", message="merge d").status == "merged"
    assert_integration_clean(ws)


def test_broken_integration_worktree_is_recreated(repo: Path, ws: Workspace):
    do_task(ws, "a", {"a.txt": "a\n"})
    do_task(ws, "b", {"b.txt": "b\n"})
    ws.merge("a", "main", strategy="merge", message="merge a")
    (ws.integration_path("main") / ".git").unlink()

    assert ws.merge("b", "main", strategy="merge", message="merge b").status == "merged"
    assert_integration_clean(ws)


def test_merge_into_a_branch_with_a_slash(repo: Path, ws: Workspace):
    git(repo, "branch", "release/1.0", "main")
    wt = ws.prepare_worktree("t1", "release/1.0")
    (wt / "fix.txt").write_text("fix\n")
    ws.commit_all(wt, "fix")

    result = ws.merge("t1", "release/1.0", strategy="ff", message="m")

    assert result.status == "merged"
    assert ws.head("release/1.0") == result.commit != ws.head("main")
    assert ws.integration_path("release/1.0").name == "release__1.0"
    assert (repo / ".git" / "corral-merge-release__1.0.lock").exists()


def test_bad_merge_arguments_are_refused(ws: Workspace):
    do_task(ws, "t1", {"x.txt": "x\n"})
    with pytest.raises(InvalidRequest):
        ws.merge("t1", "main", strategy="rebase", message="m")  # type: ignore[arg-type]
    with pytest.raises(GitError):
        ws.merge("nope", "main", strategy="merge", message="m")


def test_concurrent_merges_into_one_branch_all_land_once(repo: Path):
    keys = [f"t{i}" for i in range(4)]
    tips = {key: do_task(Workspace(repo), key, {f"{key}.txt": f"{key}\n"}) for key in keys}
    start = threading.Barrier(len(keys))

    def merge(key: str) -> MergeResult:
        start.wait()
        return Workspace(repo).merge(key, "main", strategy="merge", message=f"merge {key}")

    with ThreadPoolExecutor(len(keys)) as pool:
        results = list(pool.map(merge, keys))

    assert [r.status for r in results] == ["merged"] * 4
    assert git(repo, "rev-list", "--count", "--first-parent", "main") == "5"
    assert git(repo, "rev-list", "--count", "--merges", "main") == "4"
    assert git(repo, "rev-list", "--count", "main") == "9"
    for key, tip in tips.items():
        assert git(repo, "merge-base", "--is-ancestor", tip, "main", check=False) == ""
        assert git(repo, "show", f"main:{key}.txt") == key
    assert {r.commit for r in results} == {git(repo, "rev-parse", f"main~{i}") for i in range(4)}
    assert_integration_clean(Workspace(repo))


def test_a_merge_waits_for_the_branch_lock_held_by_another_process(repo: Path, ws: Workspace):
    do_task(ws, "t1", {"x.txt": "x\n"})
    lock = repo / ".git" / "corral-merge-main.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        results: list[MergeResult] = []
        merging = threading.Thread(
            target=lambda: results.append(ws.merge("t1", "main", strategy="merge", message="m"))
        )
        merging.start()
        merging.join(timeout=0.5)
        assert merging.is_alive() and not results
        assert not ws.is_ancestor(ws.head("corral/t1"), ws.head("main"))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
        assert holder.stdout is not None
        holder.stdout.close()
    merging.join(timeout=30)
    assert [r.status for r in results] == ["merged"]


def test_merge_lock_excludes_threads_of_one_process(repo: Path, ws: Workspace):
    do_task(ws, "t1", {"x.txt": "x\n"})
    results: list[MergeResult] = []
    with merge_lock(ws.repo.common_dir, "main"):
        merging = threading.Thread(
            target=lambda: results.append(ws.merge("t1", "main", strategy="ff", message="m"))
        )
        merging.start()
        merging.join(timeout=0.5)
        assert merging.is_alive() and not results
    merging.join(timeout=30)
    assert [r.status for r in results] == ["merged"]


def test_merge_is_redone_when_the_branch_moves_meanwhile(
    repo: Path, ws: Workspace, monkeypatch: pytest.MonkeyPatch
):
    a_tip = do_task(ws, "a", {"a.txt": "a\n"})
    outsider = do_task(ws, "outsider", {"o.txt": "o\n"})
    real_git = ws.repo.run
    swaps: list[tuple[str, ...]] = []

    def moving_git(cwd: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        if args[:1] == ("update-ref",):
            if not swaps:  # someone else advances main between our merge and our swap
                git(repo, "update-ref", "refs/heads/main", outsider)
            swaps.append(args)
        return real_git(cwd, *args, **kw)

    monkeypatch.setattr(ws.repo, "run", moving_git)

    result = ws.merge("a", "main", strategy="merge", message="merge a")

    assert result.status == "merged"
    assert len(swaps) == 2
    assert git(repo, "rev-list", "--parents", "-n1", "main").split() == [
        result.commit,
        outsider,
        a_tip,
    ]
    assert_integration_clean(ws)


def test_merge_of_a_branch_with_nothing_new_is_already_merged(ws: Workspace):
    ws.prepare_worktree("t1", "main")
    assert ws.merge("t1", "main", strategy="merge", message="m") == MergeResult(
        "already_merged", ws.head("main")
    )


# -- removal --------------------------------------------------------------------------


def test_remove_worktree_only_when_clean(repo: Path, ws: Workspace):
    wt = ws.prepare_worktree("dirty", "main")
    (wt / "untracked.txt").write_text("u\n")
    assert not ws.remove_worktree_if_clean("dirty")
    assert (wt / "untracked.txt").exists()

    (wt / "untracked.txt").unlink()
    (wt / "app.txt").write_text("modified\n")
    assert not ws.remove_worktree_if_clean("dirty")
    assert (wt / "app.txt").read_text() == "modified\n"

    git(wt, "add", "app.txt")
    assert not ws.remove_worktree_if_clean("dirty")

    sha = do_task(ws, "unmerged", {"u.txt": "u\n"})
    assert ws.remove_worktree_if_clean("unmerged", delete_branch_if_merged_into="main")
    assert not ws.worktree_path("unmerged").exists()
    assert ws.head("corral/unmerged") == sha  # unmerged work is kept on its branch
    assert "unmerged" not in git(repo, "worktree", "list")

    do_task(ws, "merged", {"m.txt": "m\n"})
    ws.merge("merged", "main", strategy="merge", message="m")
    assert ws.remove_worktree_if_clean("merged", delete_branch_if_merged_into="main")
    assert git(repo, "branch", "--list", "corral/merged") == ""

    assert ws.remove_worktree_if_clean("merged")  # already gone


def test_remove_keeps_a_broken_directory(ws: Workspace):
    path = ws.worktree_path("t1")
    path.mkdir(parents=True)
    (path / "something.txt").write_text("?\n")
    assert not ws.remove_worktree_if_clean("t1")
    assert (path / "something.txt").exists()


@pytest.fixture(autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leftover, leftover
