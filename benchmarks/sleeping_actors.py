"""Sleeping actors at scale, in the store the coordinator uses (SQLite and PostgreSQL).

With N actors asleep (10 and 10,000 by default), measures what a coordinator pays for them:

  create         get-or-create of one actor (a transaction: row, placement attempt), per actor
  tick           the reconciler's actor pass (due timers, stranded placements, queues), p50
  wake           one sleeping actor woken and placed on a runner with a free slot: the
                 lifecycle step, the placement and its start command in one transaction, p50/p99
  memory         this process's peak RSS after all that (a coordinator holds nothing per
                 sleeping actor: they live in the database)

    python benchmarks/sleeping_actors.py [--counts 10,10000] [--wakes 200] [--pg URL]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg

from corral.actors import lifecycle as lc
from corral.actors.lifecycle import CrashPolicy
from corral.actors.model import NewActor
from corral.store import Store

NOW = 1_000_000.0


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def pg_store(url: str) -> Iterator[Store]:
    schema = f"bench_{int(time.time() * 1000)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in url else "?"
    store = Store.open(f"{url}{sep}options={quote(f'-csearch_path={schema}')}")
    try:
        yield store
    finally:
        store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def sqlite_store() -> Iterator[Store]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(str(Path(tmp) / "bench.db"))
        try:
            yield store
        finally:
            store.close()


def measure(store: Store, count: int, wakes: int) -> None:
    started = time.perf_counter()
    ids = [
        store.actors.create(NewActor("echo", f"k{i}", crash_policy=CrashPolicy.SLEEP), NOW)[0].id
        for i in range(count)
    ]  # no runner hosts "echo" yet: each sleeps (sleep policy, no serverless pool)
    create_s = (time.perf_counter() - started) / count
    ticks = []
    for n in range(20):
        t = time.perf_counter()
        store.actors.tick(NOW + n)
        ticks.append(time.perf_counter() - t)
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=[], slots=1, version="1", transport="websocket",
        now=NOW, revive=False,
    )  # fmt: skip
    store.actors.host(runner.id, "default", ["echo"], wakes + 1)
    woken = []
    for actor_id in ids[:wakes]:
        t = time.perf_counter()
        store.actors.signal(actor_id, lc.Wake(), NOW + 30)
        woken.append(time.perf_counter() - t)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tick = statistics.median(ticks)
    print(
        f"  {count:>6} asleep   create {ms(create_s)}/actor   tick p50 {ms(tick)}"
        f"   wake p50 {ms(statistics.median(woken))} p99 {ms(percentile(woken, 0.99))}"
        f"   peak RSS {peak_mib:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="10,10000")
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    for name, opener in (("sqlite", sqlite_store), ("postgres", lambda: pg_store(args.pg))):
        print(name)
        for count in counts:
            with opener() as store:
                measure(store, count, min(args.wakes, count))


if __name__ == "__main__":
    main()
