"""Leases on work one coordinator does at a time (the reconciler) when several share a
database: a row per kind of work naming its holder until when. The holder renews it as
it works; another takes it over once it has expired, so the work moves within one lease
(seconds) when its holder dies. Taking and renewing are one upsert whose ``WHERE`` is the
guard, the same statement on both dialects."""

from __future__ import annotations

from corral.store.db import Database

RECONCILER = "reconciler"


def hold(db: Database, name: str, holder: str, now: float, ttl_s: float) -> bool:
    """Take or renew the lease ``name`` for ``holder`` until ``now + ttl_s``; False while
    another holds it unexpired."""
    with db.transaction() as tx:
        row = tx.one(
            "INSERT INTO coordinator_leases (name, holder, expires_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
            "expires_at = excluded.expires_at "
            "WHERE coordinator_leases.holder = excluded.holder "
            "OR coordinator_leases.expires_at < ? RETURNING holder",
            (name, holder, now + ttl_s, now),
        )
    return row is not None


def release(db: Database, name: str, holder: str) -> None:
    """Give the lease up at once (a coordinator that stops): another takes it at its next
    look, not a lease later."""
    with db.transaction() as tx:
        tx.execute("DELETE FROM coordinator_leases WHERE name = ? AND holder = ?", (name, holder))
