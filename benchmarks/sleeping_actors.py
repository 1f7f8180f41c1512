"""Sleeping actors at scale, in the store the coordinator uses (SQLite and PostgreSQL).

With N actors asleep (10 and 10,000 by default), measures what a coordinator pays for them:

  create         get-or-create of one actor (a transaction: row, placement attempt), per actor
  tick           the reconciler's actor pass (due timers, stranded placements, queues), p50
  wake           one sleeping actor woken and placed on a runner with a free slot: the
                 lifecycle step, the placement and its start command in one transaction, p50/p99
  memory         this process's peak RSS after all that (a coordinator holds nothing per
                 sleeping actor: they live in the database)

With --served, a whole coordinator instead (``corral serve`` on a database holding N
sleeping actors, and a runner hosting them as real processes), with N = each of --counts:

  rss            the coordinator's resident memory once it has served the wakes
  idle cpu       the coordinator's CPU per second with nothing asked of it (its reconciler's
                 passes over the actors)
  wake           a sleeping actor's first answer through the gateway (wake, placement, the
                 process's start, the tunnel), p50/p99, and the coordinator's CPU per wake
  warm           a request to a woken actor through the gateway, p50

    python benchmarks/sleeping_actors.py [--counts 10,10000] [--wakes 200] [--pg URL]
                                         [--served [--databases sqlite,postgres]]
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

import actors as bench  # benchmarks/actors.py: the cluster and its measures
import httpx
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
def pg_store(url: str) -> Iterator[tuple[Store, str]]:
    schema = f"bench_{int(time.time() * 1000)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in url else "?"
    db_url = f"{url}{sep}options={quote(f'-csearch_path={schema}')}"
    store = Store.open(db_url)
    try:
        yield store, db_url
    finally:
        store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def sqlite_store() -> Iterator[tuple[Store, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        db_url = str(Path(tmp) / "bench.db")
        store = Store.open(db_url)
        try:
            yield store, db_url
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


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def served(db_url: str, store: Store, count: int, wakes: int, workdir: Path) -> None:
    """N sleeping actors in the database, then a real coordinator and runner over it."""
    now = time.time()
    ids = [
        store.actors.create(NewActor("counter", f"k{i}", crash_policy=CrashPolicy.SLEEP), now)[0].id
        for i in range(count)
    ]  # no runner hosts "counter" yet: each sleeps (sleep policy, no serverless pool)
    store.close()
    with (
        bench.cluster(workdir, db=db_url, actor_slots=wakes + 1) as (url, pids),
        httpx.Client(base_url=url, headers=bench.AUTH, timeout=60) as http,
    ):
        bench.wait(lambda: bench._runner_active(http), what="the runner")
        assert http.get(f"/actors/{ids[-1]}").json()["state"] == "sleeping"
        coordinator = pids["coordinator"]
        idle_from = bench.cpu_seconds(coordinator)
        time.sleep(5.0)
        idle_cpu = (bench.cpu_seconds(coordinator) - idle_from) / 5.0
        woken, cpu = [], []
        for actor_id in ids[:: max(1, count // wakes)][:wakes]:  # spread over the table
            cpu_from = bench.cpu_seconds(coordinator)
            started = time.perf_counter()
            with http.stream("GET", f"/gateway/{actor_id}/hit/wake") as response:
                next(response.iter_raw())
                woken.append(time.perf_counter() - started)
            cpu.append(bench.cpu_seconds(coordinator) - cpu_from)
        warm = bench.warm(http, f"{url}/gateway/{ids[0]}", 200)
        print(
            f"  {count:>6} asleep   rss {rss_mib(coordinator):5.0f} MiB   idle cpu "
            f"{idle_cpu * 1000:5.1f} ms/s   wake p50 {ms(statistics.median(woken))} "
            f"p99 {ms(percentile(woken, 0.99))} cpu {ms(statistics.mean(cpu))}   "
            f"warm p50 {ms(statistics.median(warm))}   (n={len(woken)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="10,10000")
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--served", action="store_true")
    parser.add_argument("--databases", default="sqlite,postgres")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    for name in args.databases.split(","):
        print(name)
        for count in counts:
            if args.served:
                with tempfile.TemporaryDirectory() as tmp:
                    if name == "sqlite":
                        db_url = str(Path(tmp) / "c.db")
                        served(db_url, Store.open(db_url), count, min(args.wakes, count), Path(tmp))
                    else:
                        with pg_store(args.pg) as (store, db_url):
                            served(db_url, store, count, min(args.wakes, count), Path(tmp))
                continue
            opener = sqlite_store if name == "sqlite" else lambda: pg_store(args.pg)
            with opener() as (store, _):
                measure(store, count, min(args.wakes, count))


if __name__ == "__main__":
    main()
