"""One coordinator per SQLite file.

Several coordinators share a PostgreSQL database; on SQLite a second one would run its own
reconciler beside the first and never hear of the runs created through it (wake-ups are
in-process). So a coordinator on SQLite holds an exclusive ``flock`` on ``<db>.coordinator``
for as long as it serves, and writes its pid and URL there: a second one is refused at once
with a message naming the first. The kernel drops the lock when its holder dies, so a
killed coordinator never leaves a stale one behind.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO

from corral.errors import Conflict
from corral.store.db import sqlite_path


class SoleCoordinator:
    """The lock a coordinator on a SQLite file holds while it serves (None of it on
    PostgreSQL): take it with :meth:`claim`, give it back with :meth:`release`."""

    def __init__(self, handle: IO[str] | None) -> None:
        self._handle = handle

    @classmethod
    def claim(cls, db_url: str, url: str) -> SoleCoordinator:
        path = sqlite_path(db_url)
        if path is None:
            return cls(None)
        lock = path.with_name(path.name + ".coordinator")
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise Conflict(
                f"another coordinator ({holder}) serves {path}: a SQLite database has one "
                "coordinator. Talk to that one (--url), or use PostgreSQL for several.",
                code="database_in_use",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, {url}\n")
        handle.flush()
        return cls(handle)

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the flock
            self._handle = None
