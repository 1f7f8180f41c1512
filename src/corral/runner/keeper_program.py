"""The group keeper's own program: when the runner dies, SIGKILL its runs' processes.

Run as ``python -I -S keeper_program.py RUNNER_PID INSTANCE`` by ``corral.runner.keeper``
(read that module first), its stdin the read end of a pipe only the runner writes to:
4-byte native ints, the id of each run's process group when its process started (again
after the pipe was full, or to a new keeper: a set). A group is kept until it is empty, not
just until its leader exits: what the run started may still be running, and holding the
run's pipes it keeps the run from finishing. Stdlib only (``-I -S``: nothing of the
runner's environment).

The runner's death shows as the pipe's end of file, and as SIGUSR1 (PR_SET_PDEATHSIG, for
a runner whose pipe a forked copy still holds open); either way it reads what is left in
the pipe, SIGKILLs every group still registered, then every process whose environment
carries ``CORRAL_RUNNER_INSTANCE=INSTANCE`` and its group (``sweep``), and exits. It
ignores SIGTERM, SIGINT and SIGHUP: a service manager's stop reaches the runner too, whose
runs have their grace period; the keeper acts only once the runner is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import select
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator

INSTANCE = "CORRAL_RUNNER_INSTANCE"  # corral.runner.keeper.INSTANCE
PREFIX = f"{INSTANCE}=".encode()
PR_SET_PDEATHSIG = 1
RECORD = 4
PRUNE_MS = 1000


class RunnerGone(Exception):
    pass


def _runner_gone(signum: int, frame: object) -> None:
    raise RunnerGone


def main() -> None:
    runner, instance = int(sys.argv[1]), sys.argv[2]
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
                    # The runner's exit closed it; its PR_SET_PDEATHSIG comes just after,
                    # and must not break off the killing.
                    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
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
    entry = f"{INSTANCE}={instance}".encode()
    sweep(lambda: carriers(entry))


def sweep(look: Callable[[], Iterable[int]]) -> set[int]:
    """SIGKILL every process a ``look`` finds, and its group (what it killed): here those
    whose environment holds the runner's instance.

    They are the runs' processes and their descendants: those of a group not registered
    yet (the runner died between a start and its write), and those that left their run's
    group (a daemon's setsid) but kept its environment. What left both, exec'd with
    another environment in a group of its own, escapes. The instance is unique to one
    runner's life, so a pid reused since holds it only if a run's process gave it.

    Looks again until a look finds none it has not killed, and twice at least: a process
    forked while a look went by, or being started as the runner died (it holds ``entry``
    once its exec is done), is found by the next one."""
    killed: set[int] = set()
    for looks in itertools.count(1):
        found = set(look()) - killed
        for pid in found:
            with contextlib.suppress(OSError):  # it is gone
                pgid = os.getpgid(pid)
                os.kill(pid, signal.SIGKILL)  # first: it can no longer leave its group
                if pgid != os.getpgrp():  # never the looking process's own
                    os.killpg(pgid, signal.SIGKILL)
        killed |= found
        if not found and looks > 1:
            break
    return killed


def carriers(entry: bytes) -> Iterator[int]:
    """The processes whose environment holds ``entry`` (a ``NAME=value`` line), among those
    this user may read (the others are not ours to kill either)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return  # no /proc (macOS): the registered groups only
    for name in names:
        if name.isdigit() and entry in _environment(name).split(b"\0"):
            yield int(name)


# A runner's instance as ``Keeper`` makes it: ``<runner pid>.<16 hex digits>``.
_INSTANCE_VALUE = re.compile(rb"(\d+)\.[0-9a-f]{16}")


def orphans(spared: Collection[int]) -> Iterator[int]:
    """The processes carrying the instance of a runner that is gone — left running because
    its keeper died with it (both SIGKILLed at once: ``pkill -9 -f corral``) — but none
    carrying an instance one of ``spared`` carries (the runner looking, and its ancestors).

    An instance's runner is gone when its pid is no process, a zombie, or a process started
    after one of the instance's carriers: every carrier descends from a run the runner
    started, so a process younger than one of them holds a pid reused since. A runner
    that starts on the host kills these before it takes work (``Keeper.kill_orphans``):
    else a run the coordinator gave again, once the dead runner's lease expired, could
    start here beside its first attempt, in the same worktree."""
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return  # no /proc (macOS)
    # A pid names a runner in its own pid namespace only: a container's processes seen
    # from the host (same user) are not judged.
    here = _pid_namespace("self")
    if here is None:
        return
    carried: dict[bytes, list[int]] = {}
    for name in names:
        for variable in _environment(name).split(b"\0"):
            if variable.startswith(PREFIX) and _pid_namespace(name) == here:
                carried.setdefault(variable[len(PREFIX) :], []).append(int(name))
    kept = {v for pid in spared for v, pids in carried.items() if pid in pids}
    for value, pids in carried.items():
        matched = _INSTANCE_VALUE.fullmatch(value)
        if matched is None or value in kept:
            continue  # not an instance a runner made: not ours to judge
        runner = _started(int(matched[1]))
        if runner is None or any((_started(pid) or runner) < runner for pid in pids):
            yield from pids


def _pid_namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _started(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot); None if it is no process or a
    zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb", buffering=0) as file:
            fields = file.read().rsplit(b")", 1)[1].split()  # after the name, which may hold ")"
    except (OSError, IndexError):
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _environment(pid: str) -> bytes:
    """The environment a process was exec'd with; nothing if it is gone or another
    user's."""
    try:
        with open(f"/proc/{pid}/environ", "rb", buffering=0) as file:
            return file.read()
    except OSError:
        return b""


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
