"""Event stream benchmark: a real coordinator with 50 ``GET /events`` subscribers attached
(in a process of their own), on SQLite and PostgreSQL.

Measures, for each store:
  latency     a change committed → each subscriber has its event: runs created one at a
              time on an idle system; for each run's first event at each subscriber, its
              arrival (wall clock) minus the change's time (``at``, taken in the change's
              transaction): p50, p99 over runs × subscribers
  throughput  the dispatch benchmark's control plane (4 runners x 8 slots whose runs start
              no process: noop_runner.py): runs/s without subscribers, then with them,
              --rounds times in turn; each measure on a coordinator and database of its own
              (none sees another's runs); the coordinator's CPU per run (the figure that
              holds up on a loaded machine), the subscribers' process's CPU (it shares the
              machine here, which a browser elsewhere would not: by default it reads the
              bytes as they come and neither decodes nor parses them), the megabytes it
              received (deflated: like browsers and httpx it accepts deflate) and how many
              streams the coordinator ended early (dropped as slow consumers: 0, or the
              figure is not what it says)

    python benchmarks/events.py [--subscribers 50] [--samples 200] [--runs 5000] [--rounds 3]
                                [--db sqlite|postgres|both] [--parse] [--no-latency]
                                [--profile DIR] [--one-coordinator]

``--one-coordinator``: each round measures alone and watched on one coordinator and
database, which of them first in turn: two fresh coordinators differ by as much as the
stream costs (identical pairs swing ±10 %).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from dispatch import (
    AUTH,
    NOOP_RUNNER,
    PG_URL,
    Cluster,
    Throughput,
    cluster,
    cpu_seconds,
    database,
    measure_throughput,
    pct,
)
from httpx_sse import aconnect_sse

PY_SPY = str(Path(sys.executable).parent / "py-spy")  # pip install py-spy (for --profile)
# Collapsed stacks of the thread holding the GIL (the Python work), 200 a second.
SPY_OPTIONS = ["--format", "raw", "--rate", "200", "--nonblocking", "--gil", "--output"]


async def subscribe(url: str, count: int, drain: bool = False) -> dict[str, object]:
    """``count`` streams until stdin closes; each first event of a run: arrival − its
    ``at`` (ms). ``drain``: read the bytes as they come (deflated), decode and parse
    nothing (no samples). Also how many streams ended early (dropped as slow consumers:
    the server ends such a stream)."""
    samples: list[float] = []
    opened = 0
    ended = 0
    received = 0  # bytes
    all_open = asyncio.Event()

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal opened, ended, received
        if drain:
            async with client.stream("GET", "/events", params={"kind": "run"}) as response:
                opened += 1
                if opened == count:
                    all_open.set()
                async for chunk in response.aiter_raw():
                    received += len(chunk)
            ended += 1
            return
        seen: set[str] = set()
        async with aconnect_sse(client, "GET", "/events", params={"kind": "run"}) as source:
            opened += 1
            if opened == count:
                all_open.set()
            async for message in source.aiter_sse():
                received += len(message.data)
                if message.event != "run":
                    continue
                arrived = time.time()
                event = json.loads(message.data)
                if event["run_id"] not in seen:
                    seen.add(event["run_id"])
                    samples.append((arrived - event["at"]) * 1000)
        ended += 1

    limits = httpx.Limits(max_connections=count + 1)
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=None, limits=limits) as client:
        streams = [asyncio.create_task(one(client)) for _ in range(count)]
        await all_open.wait()
        print("subscribed", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for stream in streams:
            stream.cancel()
    return {"samples": samples, "ended": ended, "bytes": received}


class Subscribers:
    """The subscribers' process, attached until ``close``; then what they saw."""

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

    def close(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)
        seen: dict[str, Any] = json.loads(self.out.read_text())
        return seen


def measure_latency(url: str, samples: int) -> None:
    body = {"type": "command", "command": ["true"]}
    with httpx.Client(base_url=url, timeout=30, headers=AUTH) as client:
        for _ in range(samples):
            client.post("/runs", json=body).raise_for_status()
            time.sleep(0.02)  # one change at a time: the stream's latency, not a queue's


def database_cpu(url: str) -> dict[int, float]:
    """PostgreSQL: CPU seconds so far of each server process serving the coordinator on
    ``url`` (its connections are named by it: see ``throughput``); SQLite: none."""
    if "application_name=" not in url:
        return {}
    name = url.rsplit("application_name=", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        pids = [
            int(row[0])
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            )
        ]
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            found[pid] = cpu_seconds(pid)
    return found


@dataclass
class Phase:
    """One throughput measure: its own coordinator, runners and fresh database."""

    measured: Throughput
    subscribers_cpu: float  # % of one core, the subscribers' process
    ended_early: int  # streams the coordinator ended during the measure (slow consumers)
    megabytes: float  # what the subscribers received, in all
    database_cpu_s: float  # PostgreSQL's server processes serving the coordinator (0: SQLite)

    @property
    def cpu_ms_per_run(self) -> float:
        return self.measured.coordinator_cpu * 10 / self.measured.runs_per_s

    def database_ms_per_run(self, runs: int) -> float:
        return self.database_cpu_s * 1000 / runs


def throughput(
    kind: str,
    runs: int,
    subscribers: int,
    drain: bool,
    profile: Path | None = None,
    spy_options: list[str] = SPY_OPTIONS,
) -> Phase:
    """The dispatch benchmark's control plane on a fresh database (nothing left over from
    another phase), with ``subscribers`` streams attached (0: none). ``profile``: py-spy
    records the coordinator meanwhile, into this file (collapsed stacks, ``spy_options``)."""
    with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as url:
        # Its connections named, their server processes' CPU is measured too.
        db = f"{url}&application_name={url.rsplit('%3D', 1)[1]}" if kind == "postgres" else url
        with cluster(db, 4, 8, Path(tmp), "websocket", NOOP_RUNNER) as target:
            return _throughput(
                target, db, runs, subscribers, drain, profile, spy_options, Path(tmp)
            )


def pair_on_one(kind: str, runs: int, subscribers: int, drain: bool, first: str) -> list[Phase]:
    """Alone and watched on one coordinator and database, ``first`` ("alone" or "watched")
    first: the stream's cost without what differs between two coordinators (their starts,
    their files). The second measure's store holds the first's runs: alternate ``first``."""
    with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as url:
        db = f"{url}&application_name={url.rsplit('%3D', 1)[1]}" if kind == "postgres" else url
        with cluster(db, 4, 8, Path(tmp), "websocket", NOOP_RUNNER) as target:
            order = [0, subscribers] if first == "alone" else [subscribers, 0]
            phases = [
                _throughput(target, db, runs, n, drain, None, SPY_OPTIONS, Path(tmp)) for n in order
            ]
    return phases if first == "alone" else phases[::-1]


def _throughput(
    target: Cluster,
    db: str,
    runs: int,
    subscribers: int,
    drain: bool,
    profile: Path | None,
    spy_options: list[str],
    tmp: Path,
) -> Phase:
    attached = Subscribers(target.url, subscribers, tmp, drain) if subscribers else None
    seen: dict[str, Any] = {}
    try:
        spy = None
        if profile is not None:
            spy = subprocess.Popen(
                [
                    PY_SPY,
                    "record",
                    "--pid",
                    str(target.coordinator_pid),
                    *spy_options,
                    str(profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)  # py-spy attached
        before, start = attached.cpu() if attached else 0.0, time.monotonic()
        db_before = database_cpu(db)
        measured = measure_throughput(target, runs)
        db_after = database_cpu(db)
        used = (attached.cpu() if attached else 0.0) - before
        elapsed = time.monotonic() - start
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
    finally:
        if attached is not None:
            seen = attached.close()
    return Phase(
        measured,
        100 * used / elapsed,
        int(seen.get("ended", 0)),
        seen.get("bytes", 0) / 1e6,
        sum(cpu - db_before.get(pid, 0.0) for pid, cpu in db_after.items()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="pairs of throughput measures (alone, then with the subscribers), each on a "
        "fresh coordinator and database: the median of each is reported",
    )
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument(
        "--parse",
        action="store_true",
        help="in the throughput phase the subscribers decode and parse every event (by default "
        "they read the bytes and decode nothing, as a browser elsewhere would cost this machine "
        "nothing)",
    )
    parser.add_argument("--no-latency", action="store_true", help="the throughput phase alone")
    parser.add_argument(
        "--one-coordinator",
        action="store_true",
        help="each round measures alone and watched on one coordinator and database (in "
        "turn first), not each on a fresh one: less noise between the two measures",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy records the coordinator during each throughput measure, into this "
        "directory (collapsed stacks, one file a measure; pip install py-spy)",
    )
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for kind in kinds:
        latencies: list[float] = []
        if not args.no_latency:
            with (
                tempfile.TemporaryDirectory() as tmp,
                database(kind, Path(tmp)) as db,
                cluster(db, 1, 1, Path(tmp), "websocket") as c,
            ):
                attached = Subscribers(c.url, args.subscribers, Path(tmp))
                measure_latency(c.url, args.samples)
                time.sleep(1)  # the last events reach every subscriber
                latencies = attached.close()["samples"]
            print(
                f"{kind:8}  latency p50 {pct(latencies, 50):6.2f} ms  p99 "
                f"{pct(latencies, 99):6.2f} ms  ({len(latencies)} samples, "
                f"{args.subscribers} subscribers)",
                flush=True,
            )
        alone: list[Phase] = []
        watched: list[Phase] = []
        for n in range(args.rounds):
            profiles = [
                args.profile / f"{kind}-{name}-{n}.txt" if args.profile else None
                for name in ("alone", "watched")
            ]
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
            if args.one_coordinator:
                first = "alone" if n % 2 == 0 else "watched"
                pair = pair_on_one(kind, args.runs, args.subscribers, not args.parse, first)
                alone.append(pair[0])
                watched.append(pair[1])
            else:
                alone.append(throughput(kind, args.runs, 0, not args.parse, profiles[0]))
                watched.append(
                    throughput(kind, args.runs, args.subscribers, not args.parse, profiles[1])
                )
            for name, phase in (("alone", alone[-1]), ("watched", watched[-1])):
                t = phase.measured
                print(
                    f"  {kind} {name:8} {t.runs_per_s:6.0f} runs/s  coordinator "
                    f"{t.coordinator_cpu:3.0f} % ({phase.cpu_ms_per_run:.3f} ms a run)  "
                    f"database {phase.database_ms_per_run(args.runs):.3f} ms a run  "
                    f"machine {t.machine_cpu:3.0f} %  subscribers' process "
                    f"{phase.subscribers_cpu:3.0f} %, {phase.megabytes:.0f} MB, "
                    f"{phase.ended_early} streams ended early  "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
        if not args.rounds:
            continue
        rate = [statistics.median(p.measured.runs_per_s for p in ps) for ps in (alone, watched)]
        per_run = [statistics.median(p.cpu_ms_per_run for p in ps) for ps in (alone, watched)]
        db_run = [
            statistics.median(p.database_ms_per_run(args.runs) for p in ps)
            for ps in (alone, watched)
        ]
        print(
            f"{kind:8}  {args.runs} runs x {args.rounds} rounds, medians: {rate[0]:6.0f} runs/s "
            f"alone, {rate[1]:6.0f} with {args.subscribers} subscribers "
            f"({100 * (1 - rate[1] / rate[0]):+.1f} % cost); coordinator CPU "
            f"{per_run[0]:.3f} → {per_run[1]:.3f} ms a run "
            f"({100 * (per_run[1] / per_run[0] - 1):+.1f} %)"
            + (f"; database CPU {db_run[0]:.3f} → {db_run[1]:.3f} ms a run" if db_run[0] else ""),
            flush=True,
        )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] in ("--subscribe", "--drain"):
        found = asyncio.run(subscribe(sys.argv[2], int(sys.argv[3]), sys.argv[1] == "--drain"))
        Path(sys.argv[4]).write_text(json.dumps(found))
    else:
        main()
