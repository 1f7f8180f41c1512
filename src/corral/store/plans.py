"""PostgreSQL's plans of corral's statements, kept fit for the tables as they are now.

A statement sent more than a few times is prepared (psycopg's ``prepare_threshold``):
PostgreSQL plans it for its parameters five times, then may settle on one generic plan,
made for the sizes its tables had then, and keeps it until something invalidates it — an
``ANALYZE`` of a table it reads. A coordinator starts on an empty database, so its claim
settles on sequential scans of a ``runs`` table of a few rows, and goes on scanning it
whole at 100,000 runs: a dispatch took 35 ms instead of 5 behind 100,000 pending runs
(``benchmarks/pending_dispatch.py --db postgres``), and the dispatch benchmark's control
plane slowed as its table grew, until autovacuum's analyze came (its naptime is a minute;
longer when it is busy).

So the coordinator holding the reconciler's lease looks each second (one catalog read,
``Coordinator.analyze_forever``) for tables grown past twice the size the planner last
recorded, and analyzes them: the plans that read them are made again for what they hold.
A table that keeps growing is analyzed at about 1, 2, 4, 8 … times ``MIN_BYTES``, a
handful of times, each reading a sample of at most 30,000 rows. Sizes, not row counts:
``pg_relation_size`` is exact at once, where the statistics' live-row counts lag by a
second or more. SQLite keeps no plans across statements this way: there it does nothing.
"""

from __future__ import annotations

from corral.store.db import Database

GROWTH = 2  # a table this many times the size its last analysis recorded is analyzed
MIN_BYTES = 512 * 1024  # smaller tables: any plan reads them in microseconds

_GROWN = (
    "SELECT c.relname FROM pg_class c "
    "WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
    "AND c.relkind = 'r' "
    "AND pg_relation_size(c.oid) >= ? "
    "AND pg_relation_size(c.oid) > ? * c.relpages::bigint * current_setting('block_size')::int "
    "ORDER BY c.relname"
)


def analyze_grown(db: Database) -> list[str]:
    """Analyze the tables of corral's schema that have grown past ``GROWTH`` times their
    recorded size (PostgreSQL); the names of those analyzed."""
    if db.dialect != "postgres":
        return []
    with db.transaction(write=False) as tx:
        grown = [name for (name,) in tx.tuples(_GROWN, (MIN_BYTES, GROWTH))]
    for name in grown:
        # A table at a time, each in a transaction of its own: an analysis holds only a
        # lock that writers do not wait for, but no longer than it needs to.
        with db.transaction() as tx:
            tx.execute(f'ANALYZE "{name}"')
    return grown
