"""Dispatch benchmark: a real coordinator and R runners as processes, WebSocket and long-poll
runners side by side, on SQLite and PostgreSQL.

Measures, for each store and each runner transport:
  latency     POST /runs → the run's process has started (the process prints its own
              start time), one run at a time on an idle system (1 runner, 1 slot): p50, p99
  throughput  no-op runs (`true`) created in batches (POST /runs:batch) until all are
              completed: runs/s, with --runners (default 4 and 32) runners sharing
              --total-slots slots; and the coordinator's CPU meanwhile (100% = one core)
  control     the same with 4 runners whose runs start no process (noop_runner.py): the
              control plane alone, without the ~1 ms of CPU a process start costs

    python benchmarks/dispatch.py [--runs 2000] [--control-runs 10000] [--runners 4,32]
                                  [--total-slots 32] [--samples 200] [--db sqlite|postgres|both]
                                  [--transports websocket,poll]
"""

from __future__ import annotations

import argparse
import json
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
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import psycopg

CORRAL = [str(Path(sys.executable).parent / "corral")]
NOOP_RUNNER = [sys.executable, str(Path(__file__).with_name("noop_runner.py"))]
PG_URL = os.environ.get("CORRAL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
TOKEN = "crl_bench-admin-token"  # CORRAL_TOKEN of the coordinator and runners it starts
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TICKS = os.sysconf("SC_CLK_TCK")


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


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of a process (and of its reaped children), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / TICKS, sum(values) / TICKS


@dataclass
class Cluster:
    url: str
    coordinator_pid: int
    runner_pids: list[int]

    def runners_cpu(self) -> float:
        """The runners' CPU seconds, with the processes they ran (reaped children)."""
        return sum(cpu_seconds(pid, children=True) for pid in self.runner_pids)


@contextmanager
def cluster(
    db: str,
    runners: int,
    slots: int,
    workdir: Path,
    transport: str,
    runner_cmd: list[str] = CORRAL,
) -> Iterator[Cluster]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_URL"] = url
    env["CORRAL_TOKEN"] = TOKEN
    procs: list[subprocess.Popen[bytes]] = []
    logs = []

    def spawn(cmd: list[str], args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        proc = subprocess.Popen(
            [*cmd, *args],
            env=env,
            stdout=log,
            stderr=log,
            cwd=workdir,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    try:
        coordinator = spawn(
            CORRAL,
            ["serve", "--port", str(port), "--db", db, "--poll-timeout", "30"],
            "coordinator",
        )
        wait_healthy(url)
        runner_procs = []
        for i in range(runners):
            runner_procs.append(
                spawn(
                    runner_cmd,
                    [
                        "runner",
                        "--name",
                        f"bench-{i}",
                        "--slots",
                        str(slots),
                        "--transport",
                        transport,
                    ],
                    f"runner-{i}",
                )
            )
        end = time.monotonic() + 60
        while True:
            found = httpx.get(f"{url}/runners", headers=AUTH).json()["runners"]
            if (
                sum(r["state"] == "active" and r["transport"] == transport for r in found)
                >= runners
            ):
                break
            if time.monotonic() > end:
                raise RuntimeError("runners did not register")
            time.sleep(0.05)
        yield Cluster(url, coordinator.pid, [p.pid for p in runner_procs])
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
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def first_line_then_end(client: httpx.Client, run_id: str) -> tuple[str, dict[str, object]]:
    """Follow the run's log stream (one request, no polling) until the run ends."""
    first = ""
    with client.stream("GET", f"/runs/{run_id}/logs", params={"follow": "true"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line:
                continue
            item = json.loads(line)
            if item["event"] == "line" and not first:
                first = item["text"]
            elif item["event"] == "end":
                return first, item["run"]
    raise RuntimeError(f"the log stream of {run_id} ended without its end")


def measure_latency(
    url: str, samples: int, warmup: int = 10, labels: list[str] | None = None
) -> list[float]:
    """POST /runs → the run's process started (ms), one run at a time."""
    latencies = []
    body = {"type": "command", "command": ["date", "+%s.%N"], "labels": labels or []}
    with httpx.Client(base_url=url, timeout=30, headers=AUTH) as client:
        for i in range(warmup + samples):
            sent = time.time()
            run_id = client.post("/runs", json=body).json()["run_id"]
            first, run = first_line_then_end(client, run_id)
            assert run["status"] == "completed", run
            if i >= warmup:
                latencies.append((float(first) - sent) * 1000)
    return latencies


@dataclass
class Throughput:
    runs_per_s: float
    coordinator_cpu: float  # % of one core
    runners_cpu: float  # % of one core, the runners and the processes they ran
    machine_cpu: float  # % of one core, everything on the machine (the database too)


def measure_throughput(target: Cluster, runs: int) -> Throughput:
    """Runs/s, and the CPU the coordinator and the runners used meanwhile."""
    batch = [{"type": "command", "command": ["true"]}] * 500
    with httpx.Client(base_url=target.url, timeout=60, headers=AUTH) as client:
        # Runs the store held before (another measure's) are not this measure's.
        counts = client.get("/stats").json()["runs"]
        done_before = counts.get("completed", 0) + counts.get("failed", 0)
        failed_before = counts.get("failed", 0)
        cpu_before = cpu_seconds(target.coordinator_pid)
        runners_before = target.runners_cpu()
        busy_before, _ = machine_busy()
        start, started_at = time.monotonic(), time.time()
        for offset in range(0, runs, len(batch)):
            client.post("/runs:batch", json={"runs": batch[: runs - offset]}).raise_for_status()
        while True:
            counts = client.get("/stats").json()["runs"]
            done = counts.get("completed", 0) + counts.get("failed", 0) - done_before
            if done >= runs:
                break
            # Rarely: each /stats costs the coordinator a count of every run, and at 50 a
            # second it was 9 % of the CPU this measures (the end is seen up to 0.2 s late).
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        cpu = cpu_seconds(target.coordinator_pid) - cpu_before
        runners_cpu = target.runners_cpu() - runners_before
        busy = machine_busy()[0] - busy_before
        assert counts.get("failed", 0) == failed_before, counts
        # Runs/s until the last run finished, not until the poll above saw it (up to 0.2 s
        # later: 8 % of a 10,000-run measure at 4,000 runs/s). Runs are claimed in the order
        # they were created: the last to finish is among the newest.
        newest = client.get("/runs", params={"limit": 500}).json()["runs"]
        last = max(datetime.fromisoformat(r["finished_at"]).timestamp() for r in newest)
    return Throughput(
        runs / (last - started_at),
        100 * cpu / elapsed,
        100 * runners_cpu / elapsed,
        100 * busy / elapsed,
    )


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
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Row:
    store: str
    transport: str
    p50: float
    p99: float
    mean: float
    throughput: dict[int, Throughput]  # by number of runners
    control: Throughput  # 4 runners x 8 slots whose runs start no process


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument(
        "--control-runs",
        type=int,
        default=10000,
        help="runs of the control-plane measure (it is fast: more runs, a steadier figure)",
    )
    parser.add_argument("--runners", default="4,32", help="comma-separated runner counts")
    parser.add_argument("--total-slots", type=int, default=32, help="shared by the runners")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--transports", default="websocket,poll")
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    runner_counts = [int(n) for n in args.runners.split(",")]
    rows: list[Row] = []
    load_before = os.getloadavg()[0]
    for kind in kinds:
        for transport in transports:
            with (
                tempfile.TemporaryDirectory() as tmp,
                database(kind, Path(tmp)) as db,
                cluster(db, 1, 1, Path(tmp), transport) as target,
            ):
                latencies = measure_latency(target.url, args.samples)
            throughput = {}
            for count in runner_counts:
                slots = max(1, args.total_slots // count)
                with (
                    tempfile.TemporaryDirectory() as tmp,
                    database(kind, Path(tmp)) as db,
                    cluster(db, count, slots, Path(tmp), transport) as target,
                ):
                    throughput[count] = measure_throughput(target, args.runs)
            with (
                tempfile.TemporaryDirectory() as tmp,
                database(kind, Path(tmp)) as db,
                cluster(db, 4, 8, Path(tmp), transport, NOOP_RUNNER) as target,
            ):
                control = measure_throughput(target, args.control_runs)
            row = Row(
                kind,
                transport,
                pct(latencies, 50),
                pct(latencies, 99),
                statistics.mean(latencies),
                throughput,
                control,
            )
            rows.append(row)
            print(f"  done: {kind} {transport}", file=sys.stderr)

    slots_of = {n: max(1, args.total_slots // n) for n in runner_counts}
    print(
        f"\n(1-min load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
        "end: other work on the machine skews every figure)"
    )
    print(
        f"\ndispatch on {os.cpu_count()} cores; latency: POST /runs → process started, "
        f"1 runner x 1 slot, {args.samples} sequential runs; throughput: {args.runs} no-op "
        f"runs, {args.total_slots} slots in total; CPU meanwhile (100% = one core) of the "
        f"coordinator (coord), of the runners with the processes they ran (runners) and of "
        f"the whole machine (all: {100 * (os.cpu_count() or 1)}% = every core busy); "
        f"control: {args.control_runs} no-op runs on 4 runners x 8 slots that start no process "
        "(benchmarks/noop_runner.py), the control plane alone"
    )
    header = f"{'store':<9} {'transport':<10} {'p50 ms':>7} {'p99 ms':>7} {'mean ms':>8}"
    for n in runner_counts:
        label = f"{n}x{slots_of[n]}"
        header += f" {'runs/s ' + label:>14} {'coord':>6} {'runners':>8} {'all':>5}"
    header += f" {'control 4x8':>12} {'coord':>6}"
    print(header)
    for row in rows:
        line = (
            f"{row.store:<9} {row.transport:<10} {row.p50:>7.1f} {row.p99:>7.1f} {row.mean:>8.1f}"
        )
        for n in runner_counts:
            t = row.throughput[n]
            line += (
                f" {t.runs_per_s:>14.0f} {t.coordinator_cpu:>5.0f}% {t.runners_cpu:>7.0f}%"
                f" {t.machine_cpu:>4.0f}%"
            )
        line += f" {row.control.runs_per_s:>12.0f} {row.control.coordinator_cpu:>5.0f}%"
        print(line)


if __name__ == "__main__":
    main()
