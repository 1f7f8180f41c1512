"""A child process in its own process group, so a stop reaches everything it started.

The child is also tied to the runner's life: if the runner dies (even by SIGKILL) the
group keeper (``corral.runner.keeper``) kills the child and what it started, so a run
reclaimed by another runner never goes on here too. The keeper is running before the child
starts, learns its group right after, and finds it by the runner's instance in its
environment meanwhile. No code of corral's runs in the child before its exec: a Python
``preexec_fn`` would force the slow fork path, and ``setpriv --pdeathsig`` a second exec,
each of them at least doubling the cost of a start.

On Linux with pidfds (5.3+) a child is started by ``subprocess.Popen``, which vforks, and
watched by the event loop through a pidfd and two pipes (``WatchedProcess``): uvloop's own
spawn forks the whole runner and took ~3 ms more before the child ran, on every start
(a cold wake of an actor waits on it). Elsewhere asyncio's subprocess does it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

from corral.agents.base import ProcessSpec
from corral.runner.keeper import INSTANCE, Keeper

T = TypeVar("T")
PIPE_LIMIT = 2**16  # a line of output longer than this is an error (asyncio's default)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a process whose one loop lives as long as it does (``corral runner``, ``up``,
    ``serverless-endpoint``): on uvloop when it is installed (``uvicorn[standard]`` brings
    it), where libuv watches the children itself and the tunnel's frames cost less CPU;
    else on asyncio, children watched by pidfds. The garbage collector runs rarely
    (``collect_less``)."""
    collect_less()
    try:
        import uvloop
    except ImportError:

        async def with_pidfds() -> T:
            _watch_children_with_pidfds()
            return await main

        return asyncio.run(with_pidfds())
    return uvloop.run(main)


def collect_less() -> None:
    """Let Python's cyclic garbage collector run far less often in a long-lived process.

    By default it runs at every 700 container objects allocated and not yet freed: a
    coordinator under load allocates that many in well under a millisecond, and its
    collections took 5-7 % of the coordinator's CPU (450 young and 4 full collections,
    0.65 s, in 20,000 runs of the dispatch benchmark; more with event streams open). What
    start-up allocated (modules, the app and its routes) is moved out of the collector's
    sight for good, and a collection waits for 50,000: serving makes few reference cycles
    (nearly everything is freed by reference counting), so the garbage that waits for a
    collection stays small."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 50)


def _watch_children_with_pidfds() -> None:
    """Python 3.11 waits for each child in a thread of its own (ThreadedChildWatcher): a
    thread started per run. A pidfd is one file descriptor in the event loop instead
    (Linux 5.3+); Python 3.12 does this by itself. The watcher is process-wide and tied to
    one loop: called from inside the process's one loop."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return  # an older kernel
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


class Process(Protocol):
    """What a child's supervisors use: an ``asyncio.subprocess.Process`` or a
    ``WatchedProcess``."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    @property
    def stderr(self) -> asyncio.StreamReader | None: ...

    async def wait(self) -> int: ...


class Child:
    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    @classmethod
    async def spawn(cls, spec: ProcessSpec) -> Child:
        if not spec.argv:
            raise ValueError("empty argv")
        # No keeper, no start: nothing would kill the run should the runner die.
        keeper = Keeper.of_this_process()
        env = {**spec.env, INSTANCE: keeper.instance}
        if _PIDFDS:
            return cls(await WatchedProcess.start(spec.argv, spec.cwd, env, keeper))
        proc = await asyncio.create_subprocess_exec(
            *spec.argv,
            cwd=spec.cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: signals reach its children
        )
        _keep(keeper, proc.pid)
        return cls(proc)

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def stop(self, grace_s: float) -> int:
        """SIGTERM the group, then SIGKILL it if it has not exited within ``grace_s``."""
        if self.proc.returncode is None:
            self.signal_group(signal.SIGTERM)
            try:
                return await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                pass
        self.signal_group(signal.SIGKILL)  # also reaps stragglers left in the group
        return await self.proc.wait()


def _pidfds_work() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False  # an older kernel
    return True


_PIDFDS = _pidfds_work()


class WatchedProcess:
    """A child started by ``subprocess.Popen`` (vfork), its exit watched through a pidfd
    and its output read through pipes, all in the running event loop. Nothing else reaps
    it: libuv and asyncio's pidfd watcher wait only for the children they started."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        pidfd: int,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self._popen = popen
        self._pidfd = pidfd
        self.pid = popen.pid
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(pidfd, self._reap)

    @classmethod
    async def start(
        cls, argv: tuple[str, ...], cwd: str | None, env: dict[str, str], keeper: Keeper
    ) -> WatchedProcess:
        # Blocking, as asyncio's own subprocess is: a vfork returns once the child exec'd.
        popen = subprocess.Popen(  # noqa: ASYNC220
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: signals reach its children
        )
        assert popen.stdout is not None and popen.stderr is not None
        try:
            _keep(keeper, popen.pid)
            pidfd = os.pidfd_open(popen.pid)
            stdout = await _read_pipe(popen.stdout)
            stderr = await _read_pipe(popen.stderr)
        except BaseException:
            popen.kill()
            popen.wait()
            Keeper.leader_exited(popen.pid)
            raise
        return cls(popen, pidfd, stdout, stderr)

    @property
    def returncode(self) -> int | None:
        """As asyncio's: -N for a death by signal N; None while it runs."""
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def _reap(self) -> None:
        returncode = self._popen.poll()  # the pidfd is readable: it exited, waitpid is due
        if returncode is None:
            return
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        Keeper.leader_exited(self.pid)
        if not self._exited.done():
            self._exited.set_result(returncode)


def _keep(keeper: Keeper, pgid: int) -> None:
    """The keeper SIGKILLs this new group if the runner dies."""
    try:
        keeper.add(pgid)
    except OSError:
        # Its keeper died and another could not start: the group must not run unkept.
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
        raise


class _PipeProtocol(asyncio.StreamReaderProtocol):
    """Closes the pipe at its end of file (uvloop's pipe transport would keep it open)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._pipe = transport

    def eof_received(self) -> bool:
        super().eof_received()
        self._pipe.close()
        return True


async def _read_pipe(pipe: Any) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=PIPE_LIMIT, loop=loop)
    await loop.connect_read_pipe(lambda: _PipeProtocol(reader, loop=loop), pipe)
    return reader
