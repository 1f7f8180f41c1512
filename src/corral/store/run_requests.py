"""Idempotency keys of the requests that create runs (``Idempotency-Key`` on ``POST
/runs`` and ``POST /runs:batch``).

A request sent again with the key of one that created runs gets those runs, not new
ones: a client that lost the answer (a cut connection, a coordinator that died) may send
it again, to this coordinator or another, and the work is queued once. The key is taken
in the transaction that creates the runs, so the two are written together or not at all;
a second request with the key while the first is being written waits for it (PostgreSQL's
unique index; SQLite has one writer) and then gets its runs.

A key belongs to its caller (``scope``: the token's id) and to its request: the same key
with other runs is refused (``idempotency_key_reused``), not answered with runs the
caller did not ask for. Keys are kept for ``KEPT_S`` (retention deletes them after).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.errors import InvalidRequest
from corral.store.db import Database, Tx

KEPT_S = 24 * 3600.0
MAX_KEY_CHARS = 255


@dataclass(frozen=True)
class RunRequest:
    scope: str  # the caller: keys of different callers never meet
    key: str
    digest: str  # of what the request asked for

    @classmethod
    def of(cls, scope: str, key: str, asked: Sequence[Any]) -> RunRequest:
        """``asked``: the request's runs as JSON values (their fields as sent)."""
        if not (0 < len(key) <= MAX_KEY_CHARS and key.isascii() and key.isprintable()):
            raise InvalidRequest(
                f"an Idempotency-Key is 1 to {MAX_KEY_CHARS} printable ASCII characters",
                code="invalid_idempotency_key",
            )
        text = json.dumps(asked, sort_keys=True, separators=(",", ":"))
        return cls(scope, key, hashlib.sha256(text.encode()).hexdigest())


def take(tx: Tx, request: RunRequest, run_ids: Sequence[str], now: float) -> list[str] | None:
    """Take the key for the runs this transaction creates (``run_ids``; None); or, taken
    already, the ids of the runs its request created. One statement when it is free."""
    while True:
        inserted = tx.one(
            "INSERT INTO run_requests (scope, key, digest, run_ids, created_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING key",
            (request.scope, request.key, request.digest, json.dumps(list(run_ids)), now),
        )
        if inserted is not None:
            return None
        stored = tx.one(
            "SELECT digest, run_ids FROM run_requests WHERE scope = ? AND key = ?",
            (request.scope, request.key),
        )
        if stored is not None:
            break
        # Deleted (a day old: retention) between the two statements: free again.
    if stored["digest"] != request.digest:
        raise InvalidRequest(
            f"the Idempotency-Key {request.key!r} was sent with other runs: a key "
            "stands for one request",
            code="idempotency_key_reused",
        )
    ids: list[str] = json.loads(stored["run_ids"])
    return ids


def collect(db: Database, cutoff: float, batch: int) -> int:
    """Delete the keys taken before ``cutoff``, ``batch`` a transaction; how many."""
    deleted = 0
    while True:
        with db.transaction() as tx:
            rows = tx.execute(
                "DELETE FROM run_requests WHERE (scope, key) IN (SELECT scope, key "
                "FROM run_requests WHERE created_at < ? LIMIT ?) RETURNING key",
                (cutoff, batch),
            )
        deleted += len(rows)
        if len(rows) < batch:
            return deleted
