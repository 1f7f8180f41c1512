"""A ``corral`` command in a pseudo-terminal of its own, as a person at a shell runs it:
its stdout is a terminal, and Ctrl-C (``\\x03`` typed into it) reaches it as SIGINT."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import termios
import threading
from pathlib import Path

from e2e_support import wait_until


class Terminal:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        master, slave = os.openpty()
        self._master = master
        self._chunks: list[bytes] = []
        self.popen = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**env, "TERM": "xterm", "COLUMNS": "200", "LINES": "50"},
            cwd=cwd,
            preexec_fn=_own_terminal,  # a session of its own, with this terminal
        )
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # EIO: the child side closed
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace").replace("\r\n", "\n")

    def expect(self, needle: str, timeout: float = 30.0) -> str:
        return wait_until(lambda: needle in self.text and self.text, timeout, what=repr(needle))

    def ctrl_c(self) -> None:
        os.write(self._master, b"\x03")

    def wait(self, timeout: float = 30.0) -> int:
        code = self.popen.wait(timeout)
        self._reader.join(timeout)
        return code

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        with contextlib.suppress(OSError):
            os.close(self._master)


def _own_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    # As an interactive shell does for the job it runs: Ctrl-C interrupts it, even when the
    # tests themselves were started in the background, where SIGINT is ignored and the
    # command would inherit that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
