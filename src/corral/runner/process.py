"""A child process in its own process group, so a stop reaches everything it started.

The child is also tied to the runner's life: if the runner dies (even by SIGKILL) the
kernel kills the child (PR_SET_PDEATHSIG), so a run reclaimed by another runner never
goes on here too. ``setpriv --pdeathsig`` sets that up without a Python ``preexec_fn``,
which would force the slow fork path and nearly triple the cost of each spawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from corral.agents.base import ProcessSpec

T = TypeVar("T")

_SETPRIV = shutil.which("setpriv") if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child, when setpriv is missing: be killed when the runner dies."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _launch(argv: tuple[str, ...]) -> tuple[tuple[str, ...], Callable[[], None] | None]:
    if _SETPRIV:
        return (_SETPRIV, "--pdeathsig", "KILL", "--", *argv), None
    if sys.platform == "linux":
        return argv, _die_with_parent
    return argv, None


def _exists(spec: ProcessSpec) -> bool:
    program = spec.argv[0]
    if "/" in program:
        return os.access(os.path.join(spec.cwd or ".", program), os.X_OK)
    return shutil.which(program, path=spec.env.get("PATH", os.defpath)) is not None


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a process whose one loop lives as long as it does (``corral runner``, ``up``,
    ``serverless-endpoint``): on uvloop when it is installed (``uvicorn[standard]`` brings
    it), where libuv watches the children itself and the tunnel's frames cost less CPU;
    else on asyncio, children watched by pidfds."""
    try:
        import uvloop
    except ImportError:

        async def with_pidfds() -> T:
            _watch_children_with_pidfds()
            return await main

        return asyncio.run(with_pidfds())
    return uvloop.run(main)


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


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    @classmethod
    async def spawn(cls, spec: ProcessSpec) -> Child:
        if not spec.argv:
            raise ValueError("empty argv")
        argv, preexec = _launch(spec.argv)
        if _SETPRIV and not _exists(spec):
            # setpriv would report a missing program as its own failure: say it plainly.
            raise FileNotFoundError(f"no such program: {spec.argv[0]!r}")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=spec.cwd,
            env=spec.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: signals reach its children
            preexec_fn=preexec,
        )
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
