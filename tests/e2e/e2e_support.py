"""Helpers of the end-to-end tests: real ``corral serve`` and ``corral runner`` processes.

Every process runs in its own process group and working directory, with its output in a
log file, in an environment isolated from the developer's (``HOME``, the fake Claude's
home and ledger, no ``CLAUDECODE*`` or ``CORRAL_*`` variables). Waiting is always a
condition polled against a deadline (``wait_until``), never a sleep that hopes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx

from corral.client import Client

BIN_DIR = Path(sys.executable).parent
CORRAL = str(BIN_DIR / "corral")
FAKE_CLAUDE = str(Path(__file__).resolve().parents[1] / "fakes" / "claude")
TERMINAL = frozenset({"completed", "failed", "cancelled", "timed_out"})

# Short timings, so that long-polls, heartbeats and loss all happen within a test.
POLL_TIMEOUT_S = 2.0
HEARTBEAT_INTERVAL_S = 0.5
LOST_AFTER_S = 2.0
START_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 300
# The admin token every process of a test shares (CORRAL_TOKEN): coordinators accept it,
# runners and the CLI send it.
TOKEN = "crl_e2e-admin-token"

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 20.0,
    *,
    interval: float = 0.05,
    what: str | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.1f}s waiting for {what or predicate!r}; "
                f"last value: {value!r}"
            )
        time.sleep(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def timestamp(value: str) -> float:
    """An ISO 8601 time from the API, as seconds since the epoch."""
    return datetime.fromisoformat(value).timestamp()


def isolated_env(root: Path) -> dict[str, str]:
    """The environment of every process a test starts."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("CLAUDECODE", "CLAUDE_CODE", "CORRAL_", "FAKE_CLAUDE"))
    }
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        FAKE_CLAUDE_HOME=str(root / "fake-claude"),
        FAKE_CLAUDE_LEDGER=str(root / "fake-claude-ledger.jsonl"),
        # The fake claude's "#!/usr/bin/env python3" finds this venv's interpreter.
        PATH=f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        # These tests exercise the seed's long-poll protocol (heartbeats, re-registration);
        # the WebSocket link has its own (test_e2e_websocket.py passes --transport).
        CORRAL_TRANSPORT="poll",
        # Runs see only an allow-list of a runner's environment: the fake claude's
        # settings must be let through.
        CORRAL_PASS_ENV="FAKE_CLAUDE_*",
        CORRAL_TOKEN=TOKEN,
    )
    return env


class Proc:
    """A ``corral`` process in its own process group, its output appended to a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], root: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = root / name
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.log_path = root / "logs" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert not self.alive(), f"{self.name} is already running"
        self._close_log()
        self.starts += 1
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed when the process is reaped)
        self._log.write(f"==== start #{self.starts}: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def send(self, sig: signal.Signals) -> None:
        """Signal the process itself (not its group)."""
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.popen is not None
        code = self.popen.wait(timeout)
        self._close_log()
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group and reap the process."""
        if self.popen is None:
            return
        if self.popen.returncode is None:  # not reaped yet: its pid is still its group's id
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=30)
        self._close_log()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Coordinator(Proc):
    def __init__(
        self,
        name: str,
        env: dict[str, str],
        root: Path,
        *,
        port: int,
        db: str,
        host: str = "127.0.0.1",
        lost_after_s: float = LOST_AFTER_S,
        extra: Iterable[str] = (),
    ) -> None:
        self.port = port
        self.url = f"http://{host}:{port}"
        argv = [
            CORRAL,
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            "--db",
            db,
            "--poll-timeout",
            str(POLL_TIMEOUT_S),
            "--heartbeat-interval",
            str(HEARTBEAT_INTERVAL_S),
            "--lost-after",
            str(lost_after_s),
            *extra,
        ]
        super().__init__(name, argv, env, root)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        def ready() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited ({self.popen and self.popen.returncode})")
            return self.healthy()

        wait_until(ready, timeout, what=f"{self.name} to answer GET /health")


class Runner(Proc):
    def __init__(
        self,
        name: str,
        env: dict[str, str],
        root: Path,
        *,
        url: str,
        slots: int,
        extra: Iterable[str] = (),
    ) -> None:
        argv = [
            CORRAL,
            "runner",
            "--coordinator",
            url,
            "--name",
            name,
            "--slots",
            str(slots),
            "--claude-bin",
            FAKE_CLAUDE,
            *extra,
        ]
        super().__init__(name, argv, env, root)


class JsonClient:
    """``corral.Client`` answering with the API's JSON (dicts), as the tests read it."""

    def __init__(self, url: str, token: str, timeout_s: float = 20.0) -> None:
        self.typed = Client(url, token=token, timeout_s=timeout_s)
        self.url = self.typed.url

    def close(self) -> None:
        self.typed.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.typed.request(method, path, **kwargs)

    def create_run(self, type: str, **fields: Any) -> dict[str, Any]:
        return self.typed.create_run(type, **fields).to_json()

    def create_runs(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [created.to_json() for created in self.typed.create_runs(specs)]

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self.typed.get_run(run_id).to_json()

    def list_runs(self, **filters: Any) -> dict[str, Any]:
        return self.typed.list_runs(**filters).to_json()

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        return self.typed.cancel_run(run_id).to_json()

    def logs(self, run_id: str, after: int = 0) -> dict[str, Any]:
        return self.typed.logs(run_id, after).to_json()

    def session_result(self, session: str) -> dict[str, Any]:
        return self.typed.session_result(session).to_json()

    def runners(self) -> list[dict[str, Any]]:
        return [runner.to_json() for runner in self.typed.list_runners()]


class Cluster:
    """The processes of one test: coordinators, runners, CLI calls, and a client."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = isolated_env(root)
        self.ledger_path = Path(self.env["FAKE_CLAUDE_LEDGER"])
        self.procs: list[Proc] = []
        self.coordinator: Coordinator | None = None
        self._client: JsonClient | None = None

    # ---- processes -----------------------------------------------------------------------

    def start_coordinator(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        db: str | None = None,
        lost_after_s: float = LOST_AFTER_S,
        wait: bool = True,
        extra: Iterable[str] = (),
    ) -> Coordinator:
        """``host``: any 127.x.y.z is this machine too (Linux), so that two coordinators
        may listen on one port, as two hosts behind one name would."""
        coordinator = Coordinator(
            f"coordinator{len([p for p in self.procs if isinstance(p, Coordinator)]) or ''}",
            self.env,
            self.root,
            port=port or free_port(),
            host=host,
            db=db or str(self.root / "corral.db"),
            lost_after_s=lost_after_s,
            extra=extra,
        )
        self.procs.append(coordinator)
        self.coordinator = coordinator
        coordinator.start()
        if wait:
            coordinator.wait_ready()
        return coordinator

    def restart_coordinator(self) -> None:
        """Start the (dead) coordinator again: same port, same database."""
        assert self.coordinator is not None
        self.coordinator.kill()
        self.reset_client()
        self.coordinator.start()
        self.coordinator.wait_ready()

    def start_runner(
        self,
        name: str,
        *,
        slots: int = 2,
        url: str | None = None,
        extra: Iterable[str] = (),
        wait: bool = True,
    ) -> Runner:
        runner = Runner(name, self.env, self.root, url=url or self.url, slots=slots, extra=extra)
        self.procs.append(runner)
        runner.start()
        if wait:
            self.wait_runner(name)
        return runner

    def wait_runner(self, name: str, state: str = "active", timeout: float = 30.0) -> str:
        """Wait until the runner called ``name`` is in ``state``; returns its runner id."""

        def found() -> str | None:
            for r in self.client.runners():
                if r["name"] == name and r["state"] == state:
                    return str(r["runner_id"])
            return None

        return wait_until(found, timeout, what=f"runner {name} to be {state}")

    def runner_by_id(self, runner_id: str) -> dict[str, Any]:
        (found,) = [r for r in self.client.runners() if r["runner_id"] == runner_id]
        return found

    @property
    def url(self) -> str:
        assert self.coordinator is not None, "start a coordinator first"
        return self.coordinator.url

    # ---- clients -------------------------------------------------------------------------

    @property
    def client(self) -> JsonClient:
        if self._client is None:
            self._client = JsonClient(self.url, TOKEN)
        return self._client

    def reset_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def cli(
        self, *args: str, url: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the ``corral`` CLI (``CORRAL_URL`` names the coordinator)."""
        env = {**self.env, "CORRAL_URL": url or self.url}
        return subprocess.run(
            [CORRAL, *args],
            env=env,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def wait_run(
        self,
        run_id: str,
        statuses: Iterable[str] = TERMINAL,
        timeout: float = 30.0,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """Wait until the run is in one of ``statuses`` (and ``where`` holds); returns it."""
        wanted = frozenset(statuses)

        def reached() -> dict[str, Any] | None:
            run = self.client.get_run(run_id)
            if run["status"] in wanted and (where is None or where(run)):
                return run
            return None

        return wait_until(reached, timeout, what=f"run {run_id} to be {sorted(wanted)}")

    def ledger(self) -> list[dict[str, Any]]:
        """The fake Claude's invocations, in order."""
        try:
            text = self.ledger_path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    # ---- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        self.reset_client()
        # Runners first: their children die with them (their keepers), then the coordinators.
        for proc in sorted(self.procs, key=lambda p: isinstance(p, Coordinator)):
            proc.kill()

    def logs(self) -> list[tuple[str, str]]:
        """(title, last lines) of every process log and of the fake Claude's ledger."""
        sections = []
        for proc in self.procs:
            lines = proc.log().splitlines()
            tail = "\n".join(lines[-LOG_TAIL_LINES:])
            sections.append((f"{proc.name} log ({proc.log_path}, last lines)", tail))
        if self.ledger_path.exists():
            sections.append(("fake claude ledger", self.ledger_path.read_text()))
        return sections


# ---- scenarios shared by the poll and the WebSocket tests ------------------------------------


def all_runs(cluster: Cluster, expected: int) -> list[dict[str, Any]]:
    """Every run, page by page; there must be ``expected`` of them."""
    found: list[dict[str, Any]] = []
    before = None
    while True:
        page = cluster.client.list_runs(limit=500, before=before)
        found.extend(page["runs"])
        before = page["next"]
        if before is None:
            break
    assert len(found) == expected, len(found)
    return found


def kill_coordinator_mid_workload(
    cluster: Cluster, runners: list[Runner], run_ids: list[str]
) -> list[dict[str, Any]]:
    """Once 10 of ``run_ids`` completed, SIGKILL the coordinator and restart it (same port,
    same database) while ``runners`` live on; check that every run then completed and that
    some run was in flight across the kill. Returns the finished runs."""
    coordinator = cluster.coordinator
    assert coordinator is not None

    def completed() -> int:
        return sum(r["status"] == "completed" for r in all_runs(cluster, len(run_ids)))

    wait_until(lambda: completed() >= 10, 30, interval=0.02, what="10 runs completed")
    killed_at = time.time()
    coordinator.send(signal.SIGKILL)
    assert coordinator.wait(10) == -signal.SIGKILL
    assert all(r.alive() for r in runners)
    cluster.restart_coordinator()  # same port, same SQLite file

    def all_finished() -> list[dict[str, Any]] | None:
        found = all_runs(cluster, len(run_ids))
        return found if all(r["status"] in TERMINAL for r in found) else None

    final = wait_until(all_finished, 60, interval=0.2, what=f"all {len(run_ids)} runs to finish")
    assert {r["run_id"]: r["status"] for r in final} == dict.fromkeys(run_ids, "completed")
    # The workload really spanned the crash: runs claimed before it finished after it.
    in_flight = [
        r for r in final if timestamp(r["claimed_at"]) < killed_at < timestamp(r["finished_at"])
    ]
    assert in_flight, "no run was in flight when the coordinator was killed"
    return final


def kill_runner_mid_run(
    cluster: Cluster, tmp_path: Path, *, sleep_s: int, extra: Iterable[str] = ()
) -> float:
    """Runners "a" and "b" (one slot each, ``extra`` flags) and a shell run; SIGKILL the
    runner that holds it, then check that its shell died with it and that the run completed
    on the other runner at attempt 2, the killed one lost. Returns the seconds from the kill
    until the run was seen completed."""
    runners = {n: cluster.start_runner(n, slots=1, wait=False, extra=extra) for n in ("a", "b")}
    ids = {name: cluster.wait_runner(name) for name in runners}
    starts = tmp_path / "starts"
    script = f'echo "$$" >> "{starts}"; sleep {sleep_s}; echo done'
    run_id = cluster.client.create_run(type="command", command=["sh", "-c", script])["run_id"]

    running = cluster.wait_run(run_id, {"running"})
    holder = next(name for name, rid in ids.items() if rid == running["runner_id"])
    other = next(name for name in ids if name != holder)
    wait_until(lambda: starts.exists() and starts.read_text().strip(), what="the run to start")
    first_shell = int(starts.read_text())

    killed_at = time.monotonic()
    runners[holder].send(signal.SIGKILL)
    assert runners[holder].wait(10) == -signal.SIGKILL
    # The runner's keeper kills its child with it: no orphan keeps running it.
    wait_until(lambda: not pid_alive(first_shell), 5, what="the orphaned shell to die")

    run = cluster.wait_run(run_id, timeout=30)
    reclaimed_after = time.monotonic() - killed_at
    assert run["status"] == "completed", run
    assert run["attempts"] == 2
    assert run["runner_id"] == ids[other]
    assert cluster.runner_by_id(ids[holder])["state"] == "lost"
    lines = [line["text"] for line in cluster.client.logs(run_id)["lines"]]
    assert lines == ["done"]  # the first attempt printed nothing
    assert len(starts.read_text().split()) == 2
    return reclaimed_after
