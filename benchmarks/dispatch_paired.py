"""Paired A/B of the dispatch latency: two source trees' clusters up at once, one run at a
time on each in turn, so that both see the same load.

dispatch.py measured one tree, then the other: on a shared machine the load moves between
the two by more than most changes do (p50 ±50 % from one round to the next with the same
code, load 4-19). Here a coordinator and a runner (1 slot) of each tree run side by side on
databases of their own, and the client alternates a run on each (which goes first swaps at
each pair); the latency is dispatch.py's (POST /runs → the run's process has started).
Besides it: when POST /runs was answered, and the whole cycle (until the client's log stream
ended). The same tree against itself measures what the method leaves: p50 6.89 and 6.95 ms on
PostgreSQL, 4.27 and 4.27 on SQLite (300 runs each, load ~3), where dispatch.py's rounds of
one tree moved by ±50 %. Name the trees by path: a branch's base is ``git archive BASE src``
unpacked somewhere, not another checkout while it moves on.

    python benchmarks/dispatch_paired.py A_SRC B_SRC [--samples 300] [--db sqlite|postgres]

e.g. ``mkdir /tmp/base && git archive main | tar -x -C /tmp/base`` then
``python benchmarks/dispatch_paired.py /tmp/base/src src --db postgres``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from dispatch import AUTH, cluster, database, first_line_then_end, pct

WARMUP = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trees", nargs=2, help="the src directories of the two trees")
    parser.add_argument("--samples", type=int, default=300, help="runs on each tree")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    names = [f"A {args.trees[0]}", f"B {args.trees[1]}"]
    body = {"type": "command", "command": ["date", "+%s.%N"], "labels": []}
    latency: dict[str, list[float]] = {n: [] for n in names}
    answered: dict[str, list[float]] = {n: [] for n in names}
    cycle: dict[str, list[float]] = {n: [] for n in names}
    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        clients = {}
        for name, tree in zip(names, args.trees, strict=True):
            # The cluster's processes import corral from this tree (they inherit the
            # environment as it is when the cluster starts).
            os.environ["PYTHONPATH"] = str(Path(tree).resolve())
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            db = stack.enter_context(database(args.db, tmp))
            target = stack.enter_context(cluster(db, 1, 1, tmp, "websocket"))
            clients[name] = stack.enter_context(
                httpx.Client(base_url=target.url, timeout=30, headers=AUTH)
            )
        for i in range(WARMUP + args.samples):
            for name in names if i % 2 == 0 else names[::-1]:
                client = clients[name]
                sent = time.time()
                run_id = client.post("/runs", json=body).json()["run_id"]
                got = time.time()
                first, run = first_line_then_end(client, run_id)
                ended = time.time()
                assert run["status"] == "completed", run
                if i >= WARMUP:
                    latency[name].append((float(first) - sent) * 1000)
                    answered[name].append((got - sent) * 1000)
                    cycle[name].append((ended - sent) * 1000)
    print(
        f"dispatch latency on {args.db}, {args.samples} runs on each tree in turn (1-min load "
        f"average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)"
    )
    print(f"{'tree':<40} {'p50 ms':>7} {'p90 ms':>7} {'mean ms':>8} {'answered':>9} {'cycle':>7}")
    for name in names:
        print(
            f"{name[:40]:<40} {pct(latency[name], 50):>7.2f} {pct(latency[name], 90):>7.2f} "
            f"{statistics.mean(latency[name]):>8.2f} {pct(answered[name], 50):>9.2f} "
            f"{pct(cycle[name], 50):>7.2f}"
        )


if __name__ == "__main__":
    main()
