"""Peers side by side: corral, a DBOS queue and procrastinate, same workload, same machine.

For each store (SQLite, PostgreSQL) every system runs back to back in one invocation, so they
see the same load on a shared machine:

  corral control   `corral serve` + runners (benchmarks/noop_runner.py) whose runs start no
                   process: the control plane alone
  corral `true`    `corral serve` + real runners; each run starts the process `true`
  DBOS             a DBOS queue in this process (enqueue and workers in one process), at its
                   default polling (1 s) and tuned (--dbos-tuned-polling); SQLite and PostgreSQL
  procrastinate    its worker in this process (LISTEN/NOTIFY), PostgreSQL only

and measures:
  latency     enqueue → start of the job, one job at a time on an idle system: p50, p99
  throughput  --jobs no-op jobs enqueued at once (in batches where the API has them), until
              the store says every one has finished: jobs/s end to end

Each peer runs in a child process of its own (DBOS keeps process-wide state). Needs the
`bench` extra: `pip install -e '.[bench]'`.

    python benchmarks/peers.py [--db sqlite|postgres|both] [--samples 100] [--jobs 2000]
                               [--dbos-tuned-polling 0.01] [--procrastinate-concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg
from dispatch import (
    AUTH,
    CORRAL,
    NOOP_RUNNER,
    cluster,
    database,
    first_line_then_end,
    measure_latency,
    measure_throughput,
    pct,
)

# corral's runners: 4 x 8 slots, as dispatch.py's control-plane measure; the peers get the
# same 32 jobs at once where they have a setting for it.
RUNNERS, SLOTS = 4, 8
WARMUP = 10
DBOS_DEFAULT_POLLING_S = 1.0  # a DBOS queue's polling_interval_sec unless told


@dataclass
class Figures:
    p50: float  # ms
    p99: float  # ms
    jobs_per_s: float


# --- corral: real `corral serve` and runner processes ---------------------------------


def corral_start_latency(url: str, samples: int, starts: Path) -> list[float]:
    """POST /runs → the runner started the run, in ms: the time the no-op runner wrote to
    ``starts`` when its attempt began (the moment a process would start), as each peer's
    figure is its job's body starting."""
    latencies = []
    body = {"type": "command", "command": ["true"]}
    with httpx.Client(base_url=url, timeout=30, headers=AUTH) as client:
        for i in range(WARMUP + samples):
            sent = time.time()
            run_id = client.post("/runs", json=body).json()["run_id"]
            _, run = first_line_then_end(client, run_id)
            assert run["status"] == "completed", run
            if i >= WARMUP:
                started = {
                    found: float(at)
                    for found, at in (line.split() for line in starts.read_text().splitlines())
                }[run_id]
                latencies.append((started - sent) * 1000)
    return latencies


def corral(kind: str, samples: int, jobs: int, *, processes: bool = False) -> Figures:
    runner = CORRAL if processes else NOOP_RUNNER
    with (
        tempfile.TemporaryDirectory() as tmp,
        database(kind, Path(tmp)) as db,
        _noop_starts(Path(tmp) / "starts") as starts,
        cluster(db, 1, 1, Path(tmp), "websocket", runner) as target,
    ):
        if processes:  # the process prints its own start time (dispatch.py's measure)
            latencies = measure_latency(target.url, samples, WARMUP)
        else:
            latencies = corral_start_latency(target.url, samples, starts)
    with (
        tempfile.TemporaryDirectory() as tmp,
        database(kind, Path(tmp)) as db,
        cluster(db, RUNNERS, SLOTS, Path(tmp), "websocket", runner) as target,
    ):
        throughput = measure_throughput(target, jobs)
    return Figures(pct(latencies, 50), pct(latencies, 99), throughput.runs_per_s)


@contextmanager
def _noop_starts(path: Path) -> Iterator[Path]:
    """The no-op runners started meanwhile write each run's start to ``path``."""
    path.touch()
    os.environ["NOOP_STARTS"] = str(path)
    try:
        yield path
    finally:
        del os.environ["NOOP_STARTS"]


# --- the peers, each in a child process of its own ----------------------------------


def schema_of(db_url: str) -> str:
    """The schema database() made, from its URL's search_path option."""
    options = parse_qs(urlsplit(db_url).query)["options"][0]  # "-csearch_path=bench_…"
    return options.split("=", 1)[1]


def wait_for_done(count_done: Callable[[], int], total: int, deadline_s: float = 600) -> None:
    """Ask the store every 20 ms (as measure_throughput asks /stats) until all are done."""
    end = time.monotonic() + deadline_s
    while (done := count_done()) < total:
        if time.monotonic() > end:
            raise RuntimeError(f"only {done} of {total} jobs finished in {deadline_s} s")
        time.sleep(0.02)


def dbos_queue(kind: str, db: str, polling_s: float, samples: int, jobs: int) -> Figures:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {"name": "corral-peers-bench", "log_level": "WARNING"}
    if kind == "sqlite":
        if polling_s != DBOS_DEFAULT_POLLING_S:
            # Tuned: the file in WAL mode, as corral keeps its own (DBOS leaves SQLite's
            # rollback journal, which on this machine enqueues ~3x slower). The mode is
            # stored in the file, so DBOS's connections find it.
            with closing(sqlite3.connect(db)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        config["system_database_url"] = f"sqlite:///{db}"
        done_sql = "SELECT count(*) FROM workflow_status WHERE status = 'SUCCESS'"
    else:
        schema = schema_of(db)
        config["system_database_url"] = db.split("?", 1)[0]
        config["dbos_system_schema"] = schema
        done_sql = f"SELECT count(*) FROM {schema}.workflow_status WHERE status = 'SUCCESS'"
    DBOS(config=config)

    @DBOS.workflow()
    def noop() -> float:
        return time.time()  # the workflow's body runs: its start

    DBOS.launch()
    try:
        queue = DBOS.register_queue("bench", polling_interval_sec=polling_s)
        latencies = []
        for i in range(WARMUP + samples):
            # Arrive at a random point of the queue's polling cycle: one job right after the
            # last one's result would arrive at the same point of it every time.
            time.sleep(random.uniform(0, polling_s))
            sent = time.time()
            started = queue.enqueue(noop).get_result()
            if i >= WARMUP:
                latencies.append((started - sent) * 1000)

        conn = sqlite3.connect(db) if kind == "sqlite" else psycopg.connect(db, autocommit=True)
        with closing(conn):
            start = time.monotonic()
            for _ in range(jobs):  # DBOS has no batch enqueue: one durable enqueue a job
                queue.enqueue(noop)
            wait_for_done(
                lambda: int(conn.execute(done_sql).fetchone()[0]),  # type: ignore[index]
                WARMUP + samples + jobs,
            )
            elapsed = time.monotonic() - start
    finally:
        DBOS.destroy()
    return Figures(pct(latencies, 50), pct(latencies, 99), jobs / elapsed)


async def procrastinate_queue(db: str, concurrency: int, samples: int, jobs: int) -> Figures:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=db))
    starts: dict[int, asyncio.Future[float]] = {}

    @app.task(queue="bench", name="noop")
    async def noop(sample: int = -1) -> None:
        if sample in starts:
            starts[sample].set_result(time.time())  # the task's body runs: its start

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(
            app.run_worker_async(
                queues=["bench"], concurrency=concurrency, install_signal_handlers=False
            )
        )
        try:
            latencies = []
            for i in range(WARMUP + samples):
                starts[i] = asyncio.get_running_loop().create_future()
                sent = time.time()
                await noop.defer_async(sample=i)
                started = await asyncio.wait_for(starts[i], 30)
                if i >= WARMUP:
                    latencies.append((started - sent) * 1000)

            done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            total = WARMUP + samples + jobs
            async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
                start = time.monotonic()
                for offset in range(0, jobs, 500):  # batches of 500, as measure_throughput
                    await noop.batch_defer_async(*[{}] * min(500, jobs - offset))
                end = start + 600
                while (row := await (await conn.execute(done_sql)).fetchone()) and row[0] < total:
                    if time.monotonic() > end:
                        raise RuntimeError(f"only {row[0]} of {total} jobs finished")
                    await asyncio.sleep(0.02)
                elapsed = time.monotonic() - start
        finally:
            worker.cancel()
            with suppress(asyncio.CancelledError):
                await worker
    return Figures(pct(latencies, 50), pct(latencies, 99), jobs / elapsed)


def peer(kind: str, name: str, setting: float, samples: int, jobs: int) -> Figures:
    """One peer in a child process of this script, on a fresh database; it prints JSON."""
    with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as db:
        command = [sys.executable, __file__, "--samples", str(samples), "--jobs", str(jobs)]
        command += ["--db", kind, "--child", name, str(setting), db]
        out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, cwd=tmp)
    return Figures(**json.loads(out.stdout.strip().splitlines()[-1]))


def child(kind: str, name: str, setting: float, db: str, samples: int, jobs: int) -> None:
    if name == "dbos":
        figures = dbos_queue(kind, db, setting, samples, jobs)
    else:
        figures = asyncio.run(procrastinate_queue(db, int(setting), samples, jobs))
    print(json.dumps(asdict(figures)))


# --- the table --------------------------------------------------------------------------


def ratio(corral: float, peer: float) -> str:
    return f"{corral / peer:.2f}" if peer else "-"


def print_table(rows: list[tuple[str, str, Figures]], args: argparse.Namespace) -> None:
    print(
        f"\npeers on {os.cpu_count()} cores; latency: enqueue → start of the job, "
        f"{args.samples} jobs one at a time; jobs/s: {args.jobs} no-op jobs enqueued at once "
        "until the store records all finished.\n"
        "start: corral control = the no-op runner began the run (its own clock); corral "
        "`true` = the process printed its own start time; "
        "DBOS, procrastinate = the job's Python function began. A DBOS or procrastinate job "
        "is an in-process function call; a corral `true` run starts a process; a corral "
        "control run is claimed, sent to a runner over its WebSocket, reported started and "
        "completed, but starts no process.\n"
        f"corral: `corral serve` + {RUNNERS} runners x {SLOTS} slots (latency: 1 x 1), "
        "runs posted in batches of 500; DBOS: one process enqueues and works, no batch "
        "enqueue (*tuned: its queue's polling_interval_sec, and on SQLite the file in WAL "
        "mode, as corral's); procrastinate: worker in-process, concurrency "
        f"{args.procrastinate_concurrency}, LISTEN/NOTIFY, batch defer of 500.\n"
        "ratios: corral/peer, corral control (ctl) and corral `true` (true) against each "
        "peer; below 1 is better for latency, above 1 for jobs/s."
    )
    ratios = ["p50 ctl", "p50 true", "p99 ctl", "p99 true", "j/s ctl", "j/s true"]
    print(f"{'':<78}corral/peer: ctl = corral control, true = corral `true`")
    print(
        f"{'store':<9} {'system':<36} {'p50 ms':>8} {'p99 ms':>8} {'jobs/s':>7}  "
        + " ".join(f"{r:>8}" for r in ratios)
    )
    for store in dict.fromkeys(r[0] for r in rows):
        of_store = [r for r in rows if r[0] == store]
        ctl = next(f for s, n, f in of_store if n.startswith("corral control"))
        true = next(f for s, n, f in of_store if n.startswith("corral `true`"))
        for _, name, f in of_store:
            line = f"{store:<9} {name:<36} {f.p50:>8.1f} {f.p99:>8.1f} {f.jobs_per_s:>7.0f}"
            if not name.startswith("corral"):
                pairs = [
                    (ctl.p50, f.p50),
                    (true.p50, f.p50),
                    (ctl.p99, f.p99),
                    (true.p99, f.p99),
                    (ctl.jobs_per_s, f.jobs_per_s),
                    (true.jobs_per_s, f.jobs_per_s),
                ]
                line += "  " + " ".join(f"{ratio(c, peer):>8}" for c, peer in pairs)
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--samples", type=int, default=100, help="latency samples per system")
    parser.add_argument("--jobs", type=int, default=2000, help="no-op jobs for jobs/s")
    parser.add_argument("--dbos-tuned-polling", type=float, default=0.01, help="seconds")
    parser.add_argument("--procrastinate-concurrency", type=int, default=RUNNERS * SLOTS)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # NAME SETTING DB
    args = parser.parse_args()
    if args.child:
        name, setting, db = args.child
        child(args.db, name, float(setting), db, args.samples, args.jobs)
        return

    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    tuned = args.dbos_tuned_polling
    # (name in the table, system, its setting): each measured on each store, back to back
    systems = [
        ("corral control (no process)", "corral", 0.0),
        ("corral `true` (a process a run)", "corral", 1.0),
        ("DBOS queue, polling 1 s (default)", "dbos", DBOS_DEFAULT_POLLING_S),
        (f"DBOS queue, polling {tuned:g} s (tuned*)", "dbos", tuned),
        ("procrastinate (LISTEN/NOTIFY)", "procrastinate", args.procrastinate_concurrency),
    ]
    rows: list[tuple[str, str, Figures]] = []
    load_before = os.getloadavg()
    for kind in kinds:
        for name, system, setting in systems:
            if system == "procrastinate" and kind != "postgres":
                continue  # procrastinate is PostgreSQL only
            if system == "corral":
                figures = corral(kind, args.samples, args.jobs, processes=bool(setting))
            else:
                figures = peer(kind, system, setting, args.samples, args.jobs)
            rows.append((kind, name, figures))
            print(f"  done: {kind} {name}", file=sys.stderr)
    load_after = os.getloadavg()
    print(
        f"\n(load average 1/5/15 min: {load_before[0]:.1f}/{load_before[1]:.1f}/"
        f"{load_before[2]:.1f} at the start, {load_after[0]:.1f}/{load_after[1]:.1f}/"
        f"{load_after[2]:.1f} at the end: other work on the machine skews every figure)"
    )
    print_table(rows, args)


if __name__ == "__main__":
    main()
