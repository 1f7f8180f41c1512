"""The group keeper: a small helper process that SIGKILLs the runs' processes when the
runner dies.

No code of the runner runs after a SIGKILL, so another process does it: the keeper
(``keeper_program.py``, a bare ``python -I -S``, in its own session), started before the
runner's first run. It learns each run's process group from the runner through a pipe (4
bytes when the run's process starts), keeps it until it is empty, and once the pipe
reaches its end (the runner is gone) or PR_SET_PDEATHSIG tells it so, SIGKILLs the groups
left, then every process whose environment carries the runner's instance, and their
groups.

The instance (``CORRAL_RUNNER_INSTANCE=<runner pid>.<random>``, one a runner process's
life: a forked copy has its own) is set in every run's environment from its first
instruction, so it covers what the groups cannot: a run started just before the runner
died, its group not written yet, and what left its run's group (a daemon's setsid) but
kept its environment. What exec'd with another environment and left its run's group too
escapes; the kernel's PR_SET_PDEATHSIG, which this replaces, held a run's first process
only (set by ``setpriv``: a second exec, half the cost of each start).

It is off the spawn's path: one write to a pipe a start. Should it die (a SIGKILL, the OOM
killer), the runner starts another as soon as the event loop sees it through a pidfd (else
at the next start), with the same instance, and registers the groups whose leaders still
run (what an exited leader left behind in its group is then the instance's only). Until
then, and if both die at once (a ``pkill -9 -f corral``), nothing kills the runs — until a
runner starts on the host again: it kills what runners gone before left running
(``kill_orphans``), before it takes any work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import select
import sys
from collections.abc import Iterable
from pathlib import Path

from corral.runner import keeper_program

log = logging.getLogger("corral.runner")
PROGRAM = Path(keeper_program.__file__)
INSTANCE = keeper_program.INSTANCE


def kill_orphans() -> None:
    """SIGKILL the processes that runs of runners now gone left running, and their groups
    (``keeper_program.orphans``): their keepers died with them. A runner calls it as it
    starts, before it takes work; what it finds says a runner and its keeper were killed
    together."""
    spared = _self_and_ancestors()
    if not any(keeper_program.orphans(spared)):
        return  # the usual case: one look (the sweep looks twice at least)
    killed = keeper_program.sweep(lambda: keeper_program.orphans(spared))
    if killed:
        log.warning(
            "killed %d processes that runs of a dead runner left running (its keeper died "
            "with it): %s",
            len(killed),
            " ".join(map(str, sorted(killed))),
        )


def _self_and_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            pid = int(stat.rsplit(b")", 1)[1].split()[1])  # the parent's pid
        except (OSError, IndexError, ValueError):
            break
    return pids


class Keeper:
    """The runner's side of its keeper (one a process: ``Keeper.of_this_process()``)."""

    _current: Keeper | None = None

    @classmethod
    def of_this_process(cls) -> Keeper:
        keeper = cls._current
        if keeper is None or keeper.runner != os.getpid():  # a forked copy needs its own
            keeper = cls._current = cls()
        return keeper

    def __init__(self) -> None:
        self.runner = os.getpid()
        self.instance = f"{self.runner}.{secrets.token_hex(8)}"
        self.groups: set[int] = set()
        self.pid = 0
        self._pipe = -1
        self._behind = False
        self._start()

    def add(self, pgid: int) -> None:
        self.groups.add(pgid)
        # After a pipe full, every group whose leader runs again (the keeper's is a set).
        self._send(self.groups if self._behind else (pgid,))

    @classmethod
    def leader_exited(cls, pgid: int) -> None:
        """Not sent: the keeper keeps the group until it is empty. It is only no longer
        resent to a new keeper."""
        if cls._current is not None:
            cls._current.groups.discard(pgid)

    def _start(self) -> None:
        read, write = os.pipe()
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", str(PROGRAM), str(self.runner), self.instance],
                # Not an instance this runner inherited, as a run's descendant: that run's
                # keeper would kill this one before it did its work.
                {name: value for name, value in os.environ.items() if name != INSTANCE},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,  # signals to the runner's group (a terminal's ^C) skip it
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        os.set_blocking(write, False)
        self._pipe = write
        self._watch()
        if self.groups:
            self._send(self.groups)  # every group whose leader still runs

    def _watch(self) -> None:
        """Replace the keeper as soon as it dies, from the event loop it was started in."""
        try:
            loop = asyncio.get_running_loop()
            pidfd = os.pidfd_open(self.pid)
        except (RuntimeError, AttributeError, OSError):
            return  # no loop, or no pidfds (macOS, Linux < 5.3): the next send finds it
        loop.add_reader(pidfd, self._exited, loop, pidfd, self.pid)

    def _exited(self, loop: asyncio.AbstractEventLoop, pidfd: int, pid: int) -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        # A send found it dead first and replaced it; or this process is a forked copy of
        # the runner, whose keeper died with it.
        if pid != self.pid or self.runner != os.getpid():
            return
        try:
            self._replace()
        except OSError as exc:
            log.error("no group keeper (%s): the next start tries again", exc)

    def _replace(self) -> None:
        log.warning("the group keeper (pid %d) died: starting another", self.pid)
        os.close(self._pipe)
        self._pipe = -1  # should the start fail, the next send tries again
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self._start()

    def _send(self, groups: Iterable[int]) -> None:
        if self._pipe < 0:
            self._start()  # it sends every group
            return
        data = b"".join(pgid.to_bytes(4, sys.byteorder) for pgid in groups)
        try:
            for offset in range(0, len(data), select.PIPE_BUF):
                os.write(self._pipe, data[offset : offset + select.PIPE_BUF])  # all or nothing
        except BlockingIOError:
            # 16,384 records behind: it is stuck. The runs still carry the instance it
            # sweeps for; the next send tries the whole set again.
            if not self._behind:
                log.warning("the group keeper (pid %d) is not reading", self.pid)
            self._behind = True
            return
        except BrokenPipeError:
            self._replace()
            return
        self._behind = False
