"""A PostgreSQL server of the chaos soak's own, in a temporary directory, to restart at will.

The shared server (port 5432) is never touched: other tests use it. This one is made with
``initdb`` from the installed PostgreSQL (the newest under ``/usr/lib/postgresql``, else
``initdb`` on ``PATH``), listens on 127.0.0.1 at a free port, trusts local connections,
and is deleted by ``close()``. PostgreSQL refuses to run as root, so as root (a CI machine)
its commands run as the ``postgres`` user, who owns the directory.

``fsync`` is off: the soak kills the server's processes, never the machine, and what a
killed process wrote is in the kernel's page cache, so a crash restart finds it all.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import psycopg

StopMode = Literal["fast", "immediate"]


def postgres_bin_dir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` are (Debian keeps them out of ``PATH``)."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    if found is None:
        raise RuntimeError("PostgreSQL's initdb was not found (install postgresql)")
    return Path(found).parent


class PgCluster:
    """``with PgCluster(port) as pg:`` a running server; ``pg.url`` names its database."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bin = postgres_bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="corral-chaos-pg-"))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgresql.log"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        self.restarts = 0

    def _run(self, *argv: str, timeout: float = 120.0) -> None:
        kwargs: dict[str, Any] = {"user": self.user} if self.user else {}
        done = subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.dir,
            **kwargs,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")

    def create(self) -> PgCluster:
        self._run(
            "initdb",
            "--no-sync",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        )
        self.start()
        return self

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.dir} -c fsync=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-o", options, "start"
        )
        self.wait_accepting()

    def stop(self, mode: StopMode = "fast") -> None:
        """``immediate``: every server process quits at once, as in a crash."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: StopMode = "fast", down_s: float = 0.0) -> None:
        self.stop(mode)
        time.sleep(down_s)  # the outage itself: nothing to wait for
        self.start()
        self.restarts += 1

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def wait_accepting(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        if self.running():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()
