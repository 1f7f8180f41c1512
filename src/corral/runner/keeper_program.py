"""The group keeper's own program: when the runner dies, SIGKILL its runs' process groups.

Run as ``python -I -S keeper_program.py RUNNER_PID`` by ``corral.runner.keeper`` (read that
module first), its stdin the read end of a pipe only the runner writes to: 4-byte native
ints, the id of each run's process group when its process started (again after the pipe
was full, or to a new keeper: a set). A group is kept until it is empty, not just until
its leader exits: what the run started may still be running, and holding the run's pipes
it keeps the run from finishing. Stdlib only (``-I -S``: nothing of the runner's
environment).

The runner's death shows as the pipe's end of file, and as SIGUSR1 (PR_SET_PDEATHSIG, for
a runner whose pipe a forked copy still holds open); either way it reads what is left in
the pipe, SIGKILLs every group still registered, and exits. It ignores SIGTERM, SIGINT and
SIGHUP: a service manager's stop reaches the runner too, whose runs have their grace
period; the keeper acts only once the runner is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
RECORD = 4
PRUNE_MS = 1000


class RunnerGone(Exception):
    pass


def _runner_gone(signum: int, frame: object) -> None:
    raise RunnerGone


def main() -> None:
    runner = int(sys.argv[1])
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, _runner_gone)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
    groups: set[int] = set()
    pending = b""
    poller = select.poll()
    poller.register(0, select.POLLIN)
    try:
        if os.getppid() != runner:
            raise RunnerGone  # it died before the prctl
        while True:
            # While groups run, a look each second for those now empty (their ids could
            # be reused); else a wait for the next one.
            if poller.poll(PRUNE_MS if groups else None):
                chunk = os.read(0, 65536)
                if not chunk:
                    break
                pending = register(groups, pending + chunk)
            groups = {pgid for pgid in groups if _running(pgid)}
            # What comes meanwhile waits in the pipe (64 KiB: 16,384 records): it wakes
            # 4 times a second at most, not at each start. The runner's death interrupts
            # the sleep (SIGUSR1); only its pipe's end of file waits for the sleep's end.
            time.sleep(0.25)
    except RunnerGone:
        os.set_blocking(0, False)
        try:
            while chunk := os.read(0, 65536):
                pending = register(groups, pending + chunk)
        except BlockingIOError:
            pass
    for pgid in groups:
        with contextlib.suppress(OSError):  # the group is gone
            os.killpg(pgid, signal.SIGKILL)


def _running(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # it is there, and not ours to signal: it would not be ours to kill either
    return True


def register(groups: set[int], data: bytes) -> bytes:
    """Apply the whole records in ``data``; the rest, to complete with the next read."""
    end = len(data) - len(data) % RECORD
    for offset in range(0, end, RECORD):
        groups.add(int.from_bytes(data[offset : offset + RECORD], sys.byteorder))
    return data[end:]


if __name__ == "__main__":
    main()
