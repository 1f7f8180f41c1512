"""Helpers of the task-graph end-to-end tests: a real git repository, the real ``corral``
CLI as a subprocess, the fake Claude, and a look into the plan's database while a run works on it.

Every process gets an isolated environment (``isolated_env`` of ``e2e_support``, plus an
empty global git config); every ``corral tasks`` command runs in the repository with a
timeout. Waiting is a condition polled against a deadline, never a sleep that hopes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from e2e_support import CORRAL, FAKE_CLAUDE, isolated_env, wait_until

from corral.store import Store
from corral.tasks.model import Task

COMMAND_TIMEOUT_S = 60.0
# A git filter that blocks while a gate file exists, so a test can SIGKILL a run while git
# is in the middle of ``git add`` (clean) or of writing a merge's files (smudge).
GATED_FILTER = textwrap.dedent(
    """\
    #!/bin/sh
    # $1: clean | smudge; the gate is $GATES/$1, the "I am waiting" marker $GATES/$1.waiting
    if [ -e "$GATES/$1" ]; then
        touch "$GATES/$1.waiting"
        while [ -e "$GATES/$1" ]; do sleep 0.02; done
    fi
    exec cat
    """
)


@dataclass
class Result:
    code: int
    out: str

    def __str__(self) -> str:
        return f"exit {self.code}:\n{self.out}"


@dataclass
class TaskRepo:
    """A git repository on ``main`` with one commit, and how to run corral on it."""

    root: Path
    repo: Path = field(init=False)
    env: dict[str, str] = field(init=False)
    ledger: Path = field(init=False)
    gates: Path = field(init=False)

    def __post_init__(self) -> None:
        self.env = isolated_env(self.root)
        gitconfig = self.root / "gitconfig-global"
        gitconfig.write_text("")
        self.gates = self.root / "gates"
        self.gates.mkdir()
        self.env.update(
            GIT_CONFIG_GLOBAL=str(gitconfig),
            GIT_CONFIG_NOSYSTEM="1",
            GATES=str(self.gates),
            COLUMNS="200",
        )
        self.ledger = Path(self.env["FAKE_CLAUDE_LEDGER"])
        self.repo = self.root / "repo"
        self.repo.mkdir()
        self.git("init", "-q", "-b", "main")
        self.git("config", "user.name", "Test User")
        self.git("config", "user.email", "test@example.com")
        (self.repo / "README.md").write_text("# test repository\n")
        (self.repo / "shared.txt").write_text("line one\nline two\nline three\n")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "initial commit")

    # -- git -------------------------------------------------------------------------------

    def git(self, *args: str, cwd: Path | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["git", *args],
            cwd=cwd or self.repo,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
        return proc.stdout

    def git_ok(self, *args: str) -> bool:
        proc = subprocess.run(
            ["git", *args],
            cwd=self.repo,
            env=self.env,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        return proc.returncode == 0

    def show(self, path: str, ref: str = "main") -> str:
        return self.git("show", f"{ref}:{path}")

    def tree_files(self, ref: str = "main") -> list[str]:
        return self.git("ls-tree", "-r", "--name-only", "-z", ref).split("\0")[:-1]

    def subjects(self, ref: str = "main") -> list[str]:
        return self.git("log", "--format=%s", ref).splitlines()

    def is_ancestor(self, commit: str, of: str) -> bool:
        return self.git_ok("merge-base", "--is-ancestor", commit, of)

    def checkout_snapshot(self) -> dict[str, bytes]:
        """The user's files (everything outside .git and .corral), byte for byte."""
        found = {}
        for path in sorted(self.repo.rglob("*")):
            rel = path.relative_to(self.repo)
            if rel.parts[0] in (".git", ".corral") or not path.is_file():
                continue
            found[str(rel)] = path.read_bytes()
        return found

    def install_gated_filter(self) -> None:
        """``*.slow`` files go through ``GATED_FILTER`` (committed .gitattributes)."""
        script = self.root / "gated-filter.sh"
        script.write_text(GATED_FILTER)
        script.chmod(0o755)
        self.git("config", "filter.gated.clean", f"{script} clean")
        self.git("config", "filter.gated.smudge", f"{script} smudge")
        (self.repo / ".gitattributes").write_text("*.slow filter=gated\n")
        self.git("add", ".gitattributes")
        self.git("commit", "-q", "-m", "gated filter for *.slow")

    def install_broken_filter(self) -> None:
        """``*.bad`` files go through a required clean filter that fails (committed
        .gitattributes): an agent writing one finishes, then ``git add`` fails."""
        self.git("config", "filter.broken.clean", "false")
        self.git("config", "filter.broken.required", "true")
        (self.repo / ".gitattributes").write_text("*.bad filter=broken\n")
        self.git("add", ".gitattributes")
        self.git("commit", "-q", "-m", "a filter that fails")

    def close_gate(self, name: str) -> None:
        (self.gates / name).touch()

    def open_gate(self, name: str) -> None:
        (self.gates / name).unlink(missing_ok=True)

    def waiting_at_gate(self, name: str) -> bool:
        return (self.gates / f"{name}.waiting").exists()

    @contextlib.contextmanager
    def merge_lock_held(self) -> Iterator[None]:
        """Hold corral's lock serializing merges into main, as a merge in progress would."""
        common = Path(self.git("rev-parse", "--git-common-dir").strip())
        path = (self.repo / common / "corral-merge-main.lock").resolve()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- plans -----------------------------------------------------------------------------

    def write_plan(self, plan: dict[str, Any], name: str = "plan.yaml") -> Path:
        """Plans live outside the repository, so they never touch the user's checkout."""
        path = self.root / name
        path.write_text(yaml.safe_dump(plan, sort_keys=False))
        return path

    # -- corral ----------------------------------------------------------------------------

    def argv(self, *args: str, fake_claude: bool = True) -> list[str]:
        if args and args[0] == "run" and fake_claude:
            args = (*args, "--claude-bin", FAKE_CLAUDE)
        return [CORRAL, "tasks", *args]

    def corral(
        self, *args: str, timeout: float = COMMAND_TIMEOUT_S, fake_claude: bool = True
    ) -> Result:
        """``corral tasks ARGS``; a ``run`` uses the fake Claude unless told otherwise."""
        proc = subprocess.run(
            self.argv(*args, fake_claude=fake_claude),
            cwd=self.repo,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(proc.returncode, proc.stdout + proc.stderr)

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        """A ``corral tasks`` command in its own process group (killed as a whole)."""
        log = open(self.root / "corral-background.log", "ab")  # noqa: SIM115
        try:
            return subprocess.Popen(
                self.argv(*args),
                cwd=self.repo,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    @staticmethod
    def kill_group(proc: subprocess.Popen[bytes]) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def status(self) -> dict[str, Any]:
        result = self.corral("status", "--json")
        assert result.code == 0, str(result)
        state: dict[str, Any] = json.loads(result.out)
        return state

    def tasks(self) -> dict[str, dict[str, Any]]:
        return {t["id"]: t for t in self.status()["tasks"]}

    # -- the database, read while a ``tasks run`` works on it ----------------------------------

    @property
    def db_path(self) -> Path:
        return self.repo / ".corral" / "corral.db"

    @contextlib.contextmanager
    def store(self) -> Iterator[Store]:
        store = Store.open(str(self.db_path))
        try:
            yield store
        finally:
            store.close()

    def db_tasks(self, store: Store) -> dict[str, Task]:
        projects = store.projects.list()
        if not projects:
            return {}
        return {t.key: t for t in store.tasks.list(projects[0].id)}

    def db_steps(self) -> dict[str, dict[str, Any]]:
        """Each task's status and the steps its attempt recorded, straight from the database."""
        with self.store() as store:
            return {
                k: {"status": str(t.status), **t.steps} for k, t in self.db_tasks(store).items()
            }

    def background_log(self) -> str:
        return (self.root / "corral-background.log").read_text(errors="replace")

    # -- the fake Claude's ledger ------------------------------------------------------------

    def ledger_events(self) -> list[dict[str, Any]]:
        try:
            lines = self.ledger.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def finished_per_prompt(self) -> Counter[str]:
        return Counter(e["prompt"] for e in self.ledger_events() if e["event"] == "finish")

    def started(self, prompt_part: str) -> bool:
        return any(
            e["event"] == "start" and prompt_part in e["prompt"] for e in self.ledger_events()
        )


# ---- plans of fake-Claude tasks -------------------------------------------------------------


def write(path: str, content: str) -> str:
    """The fake Claude's directive writing ``content`` to ``path`` in its worktree."""
    return f"[fake:write={path}:{content.replace(chr(10), chr(92) + 'n')}]"


def task(key: str, *after: str, prompt: str | None = None, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": key,
        "title": f"Task {key}",
        "prompt": prompt if prompt is not None else f"Create {key}. " + file_directive(key),
    }
    if after:
        body["after"] = list(after)
    return {**body, **kw}


def file_directive(key: str) -> str:
    return write(f"files/{key}.txt", f"made by {key}\n")


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "") -> Any:
    """``wait_until`` with a finer interval, for catching a run at a given step."""
    return wait_until(predicate, timeout, interval=0.01, what=what or None)


def kill_when_journaled(tr: TaskRepo, key: str) -> None:
    """``tasks run`` until task ``key``'s agent (one that lingers after its result) has its
    result in the journal but its step not yet reported; then kill -9 the run."""
    journal = tr.repo / ".corral" / "journal" / f"{key}.json"
    proc = tr.start("run", "--workers", "1")
    try:
        wait_for(journal.exists, what="the agent's result in the journal")
        assert "agent" not in tr.db_steps()[key]
    finally:
        tr.kill_group(proc)
