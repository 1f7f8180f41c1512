"""Which coordinators are up, and since when: a row per coordinator process, written by
each at every reconciler pass (``beat``), saying it was up from ``up_since`` (its start)
to ``seen_at`` (its last pass).

A runner silent past its threshold is declared lost only when some coordinator was up to
hear it for that whole threshold of its silence (``store/reconcile.py``): after a restart,
a coordinator need not wait a threshold of its own when another was up all along, while a
runner that had no coordinator to talk to (all of them down) is not declared lost for it.
"""

from __future__ import annotations

from corral.store.db import Database

# Rows of coordinators not seen for this long are deleted (one per process start).
FORGET_AFTER_S = 7 * 24 * 3600.0


def beat(db: Database, node: str, up_since: float, now: float) -> None:
    """The coordinator ``node``, up since ``up_since``, is up at ``now``."""
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO coordinators (node, up_since, seen_at) VALUES (?, ?, ?) "
            "ON CONFLICT (node) DO UPDATE SET seen_at = excluded.seen_at "
            "WHERE coordinators.seen_at < excluded.seen_at",
            (node, up_since, now),
        )
        tx.execute("DELETE FROM coordinators WHERE seen_at < ?", (now - FORGET_AFTER_S,))
