"""Event stream benchmark: a real coordinator with 50 ``GET /events`` subscribers attached
(in a process of their own), on SQLite and PostgreSQL.

Measures, for each store:
  latency     a change committed → each subscriber has its event: runs created one at a
              time on an idle system; for each run's first event at each subscriber, its
              arrival (wall clock) minus the change's time (``at``, taken in the change's
              transaction): p50, p99 over runs × subscribers
  throughput  the dispatch benchmark's control plane (4 runners x 8 slots whose runs start
              no process: noop_runner.py): runs/s without subscribers, then with them (a new
              coordinator and database each), and the coordinator's CPU (and per run: the
              figure that holds up on a loaded machine; the subscribers' own process shares
              the machine here, which a browser elsewhere would not)

    python benchmarks/events.py [--subscribers 50] [--samples 200] [--runs 3000]
                                [--db sqlite|postgres|both] [--drain]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from dispatch import (
    AUTH,
    NOOP_RUNNER,
    Throughput,
    cluster,
    cpu_seconds,
    database,
    measure_throughput,
    pct,
)
from httpx_sse import aconnect_sse


async def subscribe(url: str, count: int, drain: bool = False) -> list[float]:
    """``count`` streams; each first event of a run: arrival − its ``at`` (ms). Until
    stdin closes. ``drain``: read the bytes and parse nothing (no samples)."""
    samples: list[float] = []
    opened = 0
    all_open = asyncio.Event()

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal opened
        if drain:
            async with client.stream("GET", "/events", params={"kind": "run"}) as response:
                opened += 1
                if opened == count:
                    all_open.set()
                async for _ in response.aiter_raw():
                    pass
            return
        seen: set[str] = set()
        async with aconnect_sse(client, "GET", "/events", params={"kind": "run"}) as source:
            opened += 1
            if opened == count:
                all_open.set()
            async for message in source.aiter_sse():
                if message.event != "run":
                    continue
                arrived = time.time()
                event = json.loads(message.data)
                if event["run_id"] not in seen:
                    seen.add(event["run_id"])
                    samples.append((arrived - event["at"]) * 1000)

    limits = httpx.Limits(max_connections=count + 1)
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=None, limits=limits) as client:
        streams = [asyncio.create_task(one(client)) for _ in range(count)]
        await all_open.wait()
        print("subscribed", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for stream in streams:
            stream.cancel()
    return samples


class Subscribers:
    """The subscribers' process, attached until ``close``; then their samples."""

    def __init__(self, url: str, count: int, workdir: Path, drain: bool = False) -> None:
        self.out = workdir / f"samples-{time.monotonic_ns()}.json"
        how = "--drain" if drain else "--subscribe"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, how, url, str(count), str(self.out)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "subscribed":
            raise RuntimeError("the subscribers did not connect")

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def close(self) -> list[float]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)
        samples: list[float] = json.loads(self.out.read_text())
        return samples


def measure_latency(url: str, samples: int) -> None:
    body = {"type": "command", "command": ["true"]}
    with httpx.Client(base_url=url, timeout=30, headers=AUTH) as client:
        for _ in range(samples):
            client.post("/runs", json=body).raise_for_status()
            time.sleep(0.02)  # one change at a time: the stream's latency, not a queue's


def throughput(
    db: str, workdir: Path, runs: int, subscribers: int, drain: bool = False
) -> tuple[Throughput, float]:
    """Runs/s, and the CPU (% of one core) the subscribers' own process used meanwhile: it
    shares the machine with the coordinator, its database and the runners."""
    with cluster(db, 4, 8, workdir, "websocket", NOOP_RUNNER) as target:
        attached = Subscribers(target.url, subscribers, workdir, drain) if subscribers else None
        try:
            before, start = attached.cpu() if attached else 0.0, time.monotonic()
            measured = measure_throughput(target, runs)
            used = (attached.cpu() if attached else 0.0) - before
            return measured, 100 * used / (time.monotonic() - start)
        finally:
            if attached is not None:
                attached.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument(
        "--drain",
        action="store_true",
        help="in the throughput phase the subscribers read the bytes and parse nothing, as "
        "if they ran elsewhere: the coordinator's own cost, less the machine they share",
    )
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    lines = []
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            with database(kind, workdir) as db, cluster(db, 1, 1, workdir, "websocket") as c:
                attached = Subscribers(c.url, args.subscribers, workdir)
                measure_latency(c.url, args.samples)
                time.sleep(1)  # the last events reach every subscriber
                latencies = attached.close()
            with database(kind, workdir) as db:
                alone, _ = throughput(db, workdir, args.runs, 0)
            with database(kind, workdir) as db:
                watched, subscribers_cpu = throughput(
                    db, workdir, args.runs, args.subscribers, args.drain
                )
        cost = 100 * (1 - watched.runs_per_s / alone.runs_per_s)
        # Under a shared machine's load the rates swing; CPU per run holds up better.
        per_run = [t.coordinator_cpu * 10 / t.runs_per_s for t in (alone, watched)]  # ms
        lines.append(
            f"{kind:8}  latency p50 {pct(latencies, 50):6.2f} ms  p99 {pct(latencies, 99):6.2f} ms"
            f"  ({len(latencies)} samples)  |  control plane {alone.runs_per_s:6.0f} runs/s "
            f"alone, {watched.runs_per_s:6.0f} with {args.subscribers} subscribers "
            f"({cost:+.1f} % cost); coordinator CPU {alone.coordinator_cpu:.0f} % → "
            f"{watched.coordinator_cpu:.0f} % ({per_run[0]:.2f} → {per_run[1]:.2f} ms a run), "
            f"subscribers' process {subscribers_cpu:.0f} %, "
            f"machine {alone.machine_cpu:.0f} % → {watched.machine_cpu:.0f} %"
        )
        print(lines[-1], flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] in ("--subscribe", "--drain"):
        found = asyncio.run(subscribe(sys.argv[2], int(sys.argv[3]), sys.argv[1] == "--drain"))
        Path(sys.argv[4]).write_text(json.dumps(found))
    else:
        main()
