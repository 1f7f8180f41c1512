"""A child process in its own process group, so a stop reaches everything it started."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys

from corral.agents.base import ProcessSpec

# Lines longer than this (a huge tool result in stream-json) are still read whole.
LINE_LIMIT = 64 * 1024 * 1024

_PR_SET_PDEATHSIG = 1
_libc = (
    ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if sys.platform == "linux"
    else None
)


def _die_with_parent() -> None:
    """In the child: be killed when the runner dies, even by SIGKILL (Linux only)."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    @classmethod
    async def spawn(cls, spec: ProcessSpec) -> Child:
        proc = await asyncio.create_subprocess_exec(
            *spec.argv,
            cwd=spec.cwd,
            env=spec.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: signals reach its children
            preexec_fn=_die_with_parent,
            limit=LINE_LIMIT,
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
