"""Wake-up latency between two coordinators on one PostgreSQL database (LISTEN/NOTIFY).

Two ``corral serve`` processes on a fresh schema; a runner's long-poll waits on B while a
run is created through A (across), or through B itself (same): the time from sending
``POST /runs`` to the poll's answer carrying the run, p50 and p99 of ``--samples`` runs.

    python benchmarks/peer_wakeups.py [--samples 200]
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg

CORRAL = str(Path(sys.executable).parent / "corral")
PG_URL = os.environ.get("CORRAL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
TOKEN = "crl_bench-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(db: str, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "CORRAL_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [CORRAL, "serve", "--port", str(port), "--db", db],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit(f"coordinator on {url} did not start")


def sample(create: httpx.Client, poll: httpx.Client, runner_id: str) -> float:
    """Seconds from POST /runs to the waiting poll's answer."""
    answered: list[float] = []

    def wait() -> None:
        response = poll.get(
            "/runner/runs", params={"runner_id": runner_id, "max_runs": 1, "timeout": 30}
        )
        assert response.status_code == 200, response.text
        answered.append(time.perf_counter())
        run = response.json()["runs"][0]
        poll.post(
            f"/runner/runs/{run['run_id']}/completed",
            json={"runner_id": runner_id, "attempt": run["attempts"], "exit_code": 0},
        )

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)  # the poll is waiting (a benchmark, not a test: no condition to see)
    sent = time.perf_counter()
    create.post("/runs", json={"type": "command", "command": ["true"]}).raise_for_status()
    waiter.join()
    return answered[0] - sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    db = f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"
    procs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            a, a_url = serve(db, Path(tmp))
            procs.append(a)
            b, b_url = serve(db, Path(tmp))
            procs.append(b)
            with (
                httpx.Client(base_url=a_url, headers=AUTH, timeout=60) as via_a,
                httpx.Client(base_url=b_url, headers=AUTH, timeout=60) as via_b,
                httpx.Client(base_url=b_url, headers=AUTH, timeout=60) as poll,
            ):
                registered = poll.post(
                    "/runner/register", json={"name": "bench", "hostname": "bench", "slots": 1}
                )
                runner_id = registered.json()["runner_id"]
                print(f"{'created through':<24} {'p50 ms':>8} {'p99 ms':>8}")
                for name, create in (("B (same coordinator)", via_b), ("A (across)", via_a)):
                    took = sorted(sample(create, poll, runner_id) for _ in range(args.samples))
                    p50 = statistics.median(took) * 1000
                    p99 = took[int(len(took) * 0.99) - 1] * 1000
                    print(f"{name:<24} {p50:>8.2f} {p99:>8.2f}")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()
