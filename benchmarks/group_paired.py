"""Paired A/B of one dispatch group on PostgreSQL: a run created and claimed into its start
command in one transaction (as POST /runs and a waiting runner socket share a store writer's
group), for two source trees side by side, without HTTP, sockets or runners.

dispatch_paired.py measures the whole path; on a loaded machine its p50 moved more than a
change of the store does (base against itself: ±0.5 ms at p50 ~19 ms, load 7). Here each tree
runs in a worker process of its own (its own schema, one runner of one slot), and the two
take turns a group at a time (which goes first swaps each pair); after each group the run is
started, finished and its command acknowledged, outside the figures. Per group: its wall
time, the same before its commit (the commit's WAL flush is the noisiest part), the backend's
CPU (/proc/PID/schedstat), the coordinator thread's CPU. Printed: the p50 of each tree and the
median of the pairs' differences (B - A). The same tree against itself measured, at load 7:
wall +41, before commit +42, backend CPU -14, client CPU +20 µs (500 pairs).

    python benchmarks/group_paired.py A_SRC B_SRC [--pairs 500]

e.g. ``mkdir /tmp/base && git archive main src | tar -x -C /tmp/base`` then
``python benchmarks/group_paired.py /tmp/base/src src``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

WARMUP = 100
FIGURES = ("wall", "before commit", "backend CPU", "client CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trees", nargs="*", help="the src directories of the two trees")
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    workers = []
    for tree in args.trees:
        env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
        workers.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    figures: list[list[list[float]]] = [[], []]
    try:
        for i in range(WARMUP + args.pairs):
            for k in (0, 1) if i % 2 == 0 else (1, 0):
                stdin, stdout = workers[k].stdin, workers[k].stdout
                assert stdin is not None and stdout is not None
                stdin.write("group\n")
                stdin.flush()
                measured = [float(x) for x in stdout.readline().split()]
                if i >= WARMUP:
                    figures[k].append(measured)
    finally:
        for w in workers:
            if w.stdin:
                w.stdin.close()
            w.wait()
    print(f"one create+claim group, {args.pairs} pairs (1-min load {os.getloadavg()[0]:.1f})")
    for j, name in enumerate(FIGURES):
        a = [f[j] for f in figures[0]]
        b = [f[j] for f in figures[1]]
        diff = statistics.median(y - x for x, y in zip(a, b, strict=True))
        print(
            f"  {name:<14} A p50 {statistics.median(a):8.1f}  B p50 {statistics.median(b):8.1f}"
            f"  median(B - A) {diff:+7.1f} µs"
        )


def worker() -> None:
    """One group a line read from stdin; its figures (µs) a line on stdout."""
    import psycopg
    from dispatch import PG_URL
    from store_cost import bench_runners

    from corral.coordinator import link_core
    from corral.runs import NewRun, RunReport, RunStatus, RunType
    from corral.store.db import PostgresDatabase, migrate
    from corral.store.store import Store

    # What the tree's push_work passes (a base from before the start commands were stored
    # by the claim's statement has no START_RUN).
    start_sql = getattr(link_core, "START_RUN", None)
    more = ((), start_sql) if start_sql else ()
    completed = RunReport(RunStatus.COMPLETED, exit_code=0)
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        db = PostgresDatabase(f"{PG_URL}?options=-csearch_path%3D{schema}", max_connections=1)
        migrate(db)
        store = Store(db)
        with db.transaction(write=False) as tx:
            row = tx.one("SELECT pg_backend_pid() AS pid")
        assert row is not None
        schedstat = Path(f"/proc/{row['pid']}/schedstat")

        def backend_us() -> float:
            return int(schedstat.read_text().split()[0]) / 1e3

        runner = bench_runners(store, 1, 1)[0]
        for _ in sys.stdin:
            now = time.time()
            backend, wall, thread = backend_us(), time.perf_counter(), time.thread_time()
            with db.transaction(flat=True):
                store.runs.create_many([NewRun(type=RunType.COMMAND, command=("true",))], now)
                commands, _ = store.commands.claim_into_commands(
                    runner, now, link_core._start_body, *more
                )
                before_commit = time.perf_counter()
            ended = time.perf_counter()
            backend, thread = backend_us() - backend, time.thread_time() - thread
            (command,) = commands
            held = [(command.body["run"]["run_id"], 1)]
            store.runs.mark_started_many(runner, held, now)
            store.runs.finish_many(runner, [(r, a, completed) for r, a in held], now)
            store.commands.acknowledge(runner, command.idx)
            print(
                f"{(ended - wall) * 1e6:.1f} {(before_commit - wall) * 1e6:.1f} "
                f"{backend:.1f} {thread * 1e6:.1f}",
                flush=True,
            )
        db.close()
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
