"""What each store call of the control plane costs on PostgreSQL: the coordinator's CPU and
the server's, per run, by call and (--statements) by statement.

The dispatch benchmark's store calls without its sockets, event loop or runners: a fresh
schema, 4 runners x 8 slots, and --cycles times, for one runner in turn, 8 runs created,
claimed into start commands (``claim_into_commands``), started, finished, and the events
applied — each call a transaction of its own, through one connection — and every
``ANALYZE_EVERY`` cycles the tables grown since their last analysis analyzed, as the
coordinator does each second (``Store.analyze_grown``): without it, the claim's generic
plan, made on a table of a page, goes on reading the whole table (217 µs a run at 12,000
runs, against 77). The server's CPU is
its backend's, from /proc/PID/schedstat (nanoseconds), read around each call: unlike
run_cost.py's runs/s it holds up on a loaded machine, and it says which statement costs
what. --no-wake and --no-events disable the wake-up and event triggers, to see their share.

    python benchmarks/pg_statement_cost.py [--cycles 500] [--statements] [--no-wake] [--no-events]
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from dispatch import PG_URL
from store_cost import bench_runners

from corral.runs import NewRun, RunReport, RunStatus, RunType
from corral.store import db as store_db
from corral.store.db import Params, PostgresDatabase, migrate
from corral.store.store import Store

T = TypeVar("T")
RUNS_A_CYCLE = 8
ANALYZE_EVERY = 25  # cycles: about a second of the coordinator's at 200 runs/s
COMPLETED = RunReport(RunStatus.COMPLETED, exit_code=0)


def backend_cpu_s(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def disable_triggers(schema: str, wake: bool) -> None:
    """Disable corral's wake-up triggers (``wake``) or its other (event) triggers."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tgname, tgrelid::regclass::text FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE NOT tgisinternal AND n.nspname = %s AND (tgname LIKE 'corral_wake%%') = %s",
            (schema, wake),
        ).fetchall()
        for trigger, table in rows:
            conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")


def measure(db: PostgresDatabase, cycles: int, statements: bool) -> dict[str, list[float]]:
    """Seconds of (coordinator thread, backend) CPU by call, and by statement if asked."""
    store = Store(db)
    with db.transaction(write=False) as tx:
        row = tx.one("SELECT pg_backend_pid() AS pid")
    assert row is not None
    pid = row["pid"]
    cost: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def timed(name: str, call: Callable[[], T]) -> T:
        thread, backend = time.thread_time(), backend_cpu_s(pid)
        try:
            return call()
        finally:
            cost[name][0] += time.thread_time() - thread
            cost[name][1] += backend_cpu_s(pid) - backend

    if statements:
        execute = store_db._PostgresTx.execute

        def each(tx: store_db._PostgresTx, sql: str, params: Params = ()) -> list[Any]:
            return timed("  " + " ".join(sql.split())[:70], lambda: execute(tx, sql, params))

        store_db._PostgresTx.execute = each  # type: ignore[method-assign]
    runners = bench_runners(store, 4, RUNS_A_CYCLE)

    def start(run: Any) -> dict[str, Any]:
        return {"type": "start_run", "run": {"id": run.id}}

    def cycle(runner: str, n: int) -> None:
        now = time.time()
        specs = [NewRun(type=RunType.COMMAND, command=("true",)) for _ in range(RUNS_A_CYCLE)]
        timed("create", lambda: store.runs.create_many(specs, now))
        commands, _ = timed("claim", lambda: store.commands.claim_into_commands(runner, now, start))
        held = [(c.body["run"]["id"], 1) for c in commands]
        timed("start", lambda: store.runs.mark_started_many(runner, held, now))
        finals = [(run_id, attempt, COMPLETED) for run_id, attempt in held]
        timed("finish", lambda: store.runs.finish_many(runner, finals, now))
        timed("events applied", lambda: store.commands.events_applied(runner, n + 1))

    for n in range(cycles):
        cycle(runners[n % len(runners)], n)
        if n % ANALYZE_EVERY == 0:
            store.analyze_grown()  # not timed: the coordinator's loop of its own
    return cost


def report(cost: dict[str, list[float]], runs: int, flags: Sequence[str]) -> None:
    def us(seconds: float) -> str:
        return f"{seconds * 1e6 / runs:7.1f}"

    print(f"µs a run ({runs} runs{', ' + ' '.join(flags) if flags else ''}): coordinator  server")
    calls = {name: c for name, c in cost.items() if not name.startswith(" ")}
    for name, (thread, backend) in cost.items():
        print(f"  {us(thread) if name in calls else '       '}  {us(backend)}  {name}")
    print(
        f"  {us(sum(c[0] for c in calls.values()))}  "
        f"{us(sum(c[1] for c in calls.values()))}  in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--statements", action="store_true", help="the cost of each statement")
    parser.add_argument("--no-wake", action="store_true", help="wake-up triggers disabled")
    parser.add_argument("--no-events", action="store_true", help="event triggers disabled")
    args = parser.parse_args()
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        db = PostgresDatabase(f"{PG_URL}?options=-csearch_path%3D{schema}", max_connections=1)
        migrate(db)
        if args.no_wake:
            disable_triggers(schema, wake=True)
        if args.no_events:
            disable_triggers(schema, wake=False)
        flags = [f for f in ("--no-wake", "--no-events") if getattr(args, f[2:].replace("-", "_"))]
        report(measure(db, args.cycles, args.statements), args.cycles * RUNS_A_CYCLE, flags)
        db.close()
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
