"""Dispatch benchmark: a real coordinator and R runners as processes, long-poll transport.

Measures, for SQLite and PostgreSQL:
  latency     POST /runs → the run's process has started (the process prints its own
              start time), one run at a time on an idle system: p50 and p99
  throughput  no-op runs (`true`) created in batches, until all are completed: runs/s

    python benchmarks/dispatch.py [--runs 2000] [--runners 4] [--slots 8] [--samples 200]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg

CORRAL = str(Path(sys.executable).parent / "corral")
PG_URL = os.environ.get("CORRAL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"coordinator at {url} did not come up")


@contextmanager
def cluster(db: str, runners: int, slots: int, workdir: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CORRAL_URL": url}
    procs: list[subprocess.Popen[bytes]] = []
    logs = []

    def spawn(args: list[str], name: str) -> None:
        log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(subprocess.Popen([CORRAL, *args], env=env, stdout=log, stderr=log,
                                      cwd=workdir, start_new_session=True))

    try:
        spawn(["serve", "--port", str(port), "--db", db, "--poll-timeout", "30"], "coordinator")
        wait_healthy(url)
        for i in range(runners):
            spawn(["runner", "--name", f"bench-{i}", "--slots", str(slots)], f"runner-{i}")
        end = time.monotonic() + 20
        while len(httpx.get(f"{url}/runners").json()["runners"]) < runners:
            if time.monotonic() > end:
                raise RuntimeError("runners did not register")
            time.sleep(0.05)
        yield url
    finally:
        for proc in reversed(procs):
            with_signal(proc, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with_signal(proc, signal.SIGKILL)
                proc.wait()
        for log in logs:
            log.close()


def with_signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def wait_done(client: httpx.Client, run_id: str) -> dict[str, object]:
    while True:
        run = client.get(f"/runs/{run_id}").json()
        if run["status"] in ("completed", "failed", "timed_out", "cancelled"):
            return dict(run)
        time.sleep(0.002)


def measure_latency(url: str, samples: int) -> list[float]:
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(samples):
            sent = time.time()
            run_id = client.post("/runs", json={"type": "command",
                                                "command": ["date", "+%s.%N"]}).json()["run_id"]
            run = wait_done(client, run_id)
            assert run["status"] == "completed", run
            lines = client.get(f"/runs/{run_id}/logs").json()["lines"]
            latencies.append((float(lines[0]["text"]) - sent) * 1000)
    return latencies


def measure_throughput(url: str, runs: int) -> float:
    batch = [{"type": "command", "command": ["true"]}] * 500
    with httpx.Client(base_url=url, timeout=60) as client:
        start = time.monotonic()
        for offset in range(0, runs, len(batch)):
            client.post("/runs:batch", json={"runs": batch[: runs - offset]}).raise_for_status()
        while True:
            counts = client.get("/stats").json()["runs"]
            done = counts.get("completed", 0) + counts.get("failed", 0)
            if done >= runs:
                break
            time.sleep(0.01)
        elapsed = time.monotonic() - start
        assert counts.get("failed", 0) == 0, counts
    return runs / elapsed


@contextmanager
def database(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield str(workdir / "bench.db")
        return
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    rows = []
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as db:
            with cluster(db, 1, 1, Path(tmp)) as url:
                latencies = measure_latency(url, args.samples)
        with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as db:
            with cluster(db, args.runners, args.slots, Path(tmp)) as url:
                throughput = measure_throughput(url, args.runs)
        rows.append((kind, pct(latencies, 50), pct(latencies, 99),
                     statistics.mean(latencies), throughput))
    print(f"\ndispatch, long-poll transport; latency: 1 runner, {args.samples} sequential runs; "
          f"throughput: {args.runners} runners x {args.slots} slots, {args.runs} no-op runs")
    print(f"{'store':<10} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'runs/s':>8}")
    for kind, p50, p99, mean, tput in rows:
        print(f"{kind:<10} {p50:>8.1f} {p99:>8.1f} {mean:>8.1f} {tput:>8.0f}")


if __name__ == "__main__":
    main()
