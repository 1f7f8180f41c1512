"""Dispatch latency with a backlog: does a queue of pending runs slow down the next dispatch?

A real coordinator and one WebSocket runner (1 slot). Before each point, the backlog is
raised to N pending runs that the runner cannot take (they need a label it has not got,
like work waiting for a pool that is down): every claim must pass over them. Then, one run
at a time, POST /runs → the run's process has started (it prints its own start time), as
``dispatch.py``'s latency: p50 and p99 at each backlog size, the coordinator's CPU per run
dispatched (steadier than the latency on a loaded machine; it includes what the coordinator
does meanwhile, its reconciler's passes too), and the load average. Goal (issue 16 §3): flat.

    python benchmarks/pending_dispatch.py [--backlog 0,10000,100000] [--samples 50]
                                          [--db sqlite|postgres]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx
from dispatch import AUTH, cluster, cpu_seconds, database, measure_latency, pct

BATCH = 500
UNTAKEN = {"type": "command", "command": ["true"], "labels": ["absent-pool"]}


def raise_backlog(url: str, have: int, want: int) -> None:
    with httpx.Client(base_url=url, timeout=120, headers=AUTH) as client:
        while have < want:
            n = min(BATCH, want - have)
            client.post("/runs:batch", json={"runs": [UNTAKEN] * n}).raise_for_status()
            have += n
        pending = client.get("/stats").json()["runs"].get("pending", 0)
    assert pending >= want, f"{pending} pending, wanted {want}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backlog", default="0,10000,100000")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--db", default="sqlite", choices=["sqlite", "postgres"])
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.backlog.split(","))
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        database(args.db, Path(tmp)) as db,
        cluster(db, 1, 1, Path(tmp), "websocket") as target,
    ):
        have = 0
        for size in sizes:
            started = time.monotonic()
            raise_backlog(target.url, have, size)
            fill_s, have = time.monotonic() - started, size
            cpu_before = cpu_seconds(target.coordinator_pid)
            latencies = measure_latency(target.url, args.samples, warmup=5)
            cpu_ms = (cpu_seconds(target.coordinator_pid) - cpu_before) * 1000
            cpu_per_run = cpu_ms / (args.samples + 5)
            load = os.getloadavg()[0]
            rows.append((size, pct(latencies, 50), pct(latencies, 99), cpu_per_run, load, fill_s))
    print(f"\ndispatch latency with a backlog ({args.db}, 1 WebSocket runner, 1 slot)")
    print(
        f"  {'pending runs':>12}  {'p50 ms':>8}  {'p99 ms':>8}  {'coord CPU ms/run':>16}  "
        f"{'load':>5}  (backlog raised in)"
    )
    for size, p50, p99, cpu_per_run, load, fill_s in rows:
        print(
            f"  {size:>12,}  {p50:8.1f}  {p99:8.1f}  {cpu_per_run:16.2f}  {load:5.1f}  "
            f"({fill_s:.0f} s)"
        )


if __name__ == "__main__":
    main()
