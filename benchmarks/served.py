"""A ``corral serve`` process for a benchmark: on a free port, in a temporary directory,
ready once it answers ``GET /health``, stopped (SIGTERM, then SIGKILL) at the end; the
last lines of its log are printed if they show an error."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

CORRAL = str(Path(sys.executable).parent / "corral")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def corral_serve(db_name: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of a coordinator on SQLite (``db_name``: a file in its directory) or
    on PostgreSQL (``db_name``: a database URL); ``env`` adds to a ``CORRAL_*``-free one."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        full_env.update(env or {})
        db = db_name if "://" in db_name else str(Path(tmp) / db_name)
        log_path = Path(tmp) / "coordinator.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [CORRAL, "serve", "--port", str(port), "--db", db],
                env=full_env,
                stdout=log,
                stderr=log,
                cwd=tmp,
                start_new_session=True,
            )
            try:
                end = time.monotonic() + 20
                while True:
                    try:
                        if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > end or proc.poll() is not None:
                        raise RuntimeError("the coordinator did not come up")
                    time.sleep(0.05)
                yield url, proc.pid
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        tail = log_path.read_text(errors="replace").splitlines()[-5:]
        if any("Error" in line or "Traceback" in line for line in tail):
            print("coordinator log (last lines):\n  " + "\n  ".join(tail))
