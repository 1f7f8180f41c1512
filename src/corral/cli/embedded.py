"""The process ``corral tasks`` assembles: an in-process coordinator, maybe a local runner.

``corral tasks …`` needs no server set up first: without ``--url`` it starts the
coordinator on a free loopback port over the repository's own database
(``<repo>/.corral/corral.db``), in a background thread, and talks to it over HTTP like to
any other coordinator. ``tasks run`` adds a runner with one slot per worker.

Only one ``tasks run`` works on a repository at a time (an exclusive lock file). Holding
that lock proves that runners an earlier one left registered are dead (killed, crashed):
they are stopped at once so their runs go back to pending and continue here, instead of
waiting for the heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO

from corral.coordinator.app import QuietServer, server_config
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import Conflict, Unavailable
from corral.runner.core import RunnerCore
from corral.runner.settings import RunnerSettings
from corral.runners import RunnerState
from corral.store import Store
from corral.tokens import new_secret


def runner_name(repo: Path) -> str:
    return f"local-{hashlib.sha256(str(repo).encode()).hexdigest()[:10]}"


def _lock_path(repo: Path) -> Path:
    return repo / ".corral" / "tasks-run.lock"


@contextlib.contextmanager
def run_lock(repo: Path) -> Iterator[IO[str]]:
    """The repository's one ``tasks run`` at a time; the holder writes its pid in it."""
    path = _lock_path(repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(
                f"another `corral tasks run` is working on {repo}", code="plan_running"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield handle


def run_in_progress(repo: Path) -> bool:
    """Whether a ``tasks run`` is alive on ``repo``, from the pid its lock holder wrote.

    Read-only on purpose: probing the lock itself could make a ``tasks run`` starting at
    that instant refuse. A reused pid errs on the side of "alive"."""
    try:
        pid = int(_lock_path(repo).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def stop_dead_local_runners(db_url: str, repo: Path, now: float) -> int:
    """Under the run lock: local runners still registered for this repo are dead."""
    store = Store.open(db_url)
    try:
        dead = [
            r
            for r in store.runners.list()
            if r.name == runner_name(repo) and r.state is not RunnerState.STOPPED
        ]
        for runner in dead:
            store.runners.set_state(runner.id, RunnerState.STOPPED, now)
        return len(dead)
    finally:
        store.close()


class Embedded:
    """A coordinator (and maybe a runner) served from a background thread."""

    def __init__(
        self,
        db_url: str,
        *,
        runner: RunnerSettings | None = None,
        settings: CoordinatorSettings | None = None,
    ) -> None:
        # Bound here and handed to the server: a port only looked up, then bound later,
        # may be taken in between by another process (tests run side by side in CI).
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        port = int(self._socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{port}"
        # Only this process talks to it: a token of its own, never written anywhere.
        self.token = new_secret()
        self.settings = replace(
            settings or CoordinatorSettings(db_url=db_url, port=port), token=self.token
        )
        self.runner_settings = (
            replace(runner, coordinator_url=self.url, token=self.token) if runner else None
        )
        self.runner: RunnerCore | None = None
        # Only a coordinator with its local runner (``tasks run``) lives long enough to
        # claim the database; a command's own (status, pause …) may run beside it.
        self._server = QuietServer(
            server_config(self.settings, host="127.0.0.1", port=port, sole=runner is not None)
        )
        self._ready = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="corral-embedded", daemon=True)

    def __enter__(self) -> Embedded:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None or not self._server.started:
            raise Unavailable(f"could not start the embedded coordinator: {self._error}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        if self._loop is not None and not self._done.is_set():
            if self.runner is not None:
                self._loop.call_soon_threadsafe(self.runner.drain)
            else:
                self._server.should_exit = True
        self._thread.join(60)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the thread that waits for readiness
            self._error = exc
        finally:
            self._done.set()
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        serving = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if serving.done():
                await serving
                return
            await asyncio.sleep(0.01)
        if self.runner_settings is not None:
            self.runner = RunnerCore(self.runner_settings)
        self._ready.set()
        if self.runner is not None:
            await self.runner.run()
            self._server.should_exit = True
        await serving
