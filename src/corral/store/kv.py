"""Actors' durable key-value state: one namespace per actor, string keys and values.

An actor reaches it over the runner link (``ToServerKvRequest``); ``KvStore.apply``
validates one operation, runs it in one transaction and answers ``{"ok": true, ...}``, or
``{"ok": false, "code", "error"}`` for a request it refuses (nothing is written then).
Keys sort byte by byte on both databases, so ``list`` pages the same way everywhere.

    {"op": "get",    "keys": [k, ...]}                      → {"values": [v | null, ...]}
    {"op": "put",    "entries": {k: v, ...}}                → {}
    {"op": "delete", "keys": [k, ...]}                      → {"deleted": n}
    {"op": "list",   "prefix": p, "after": k?, "limit": n}  → {"entries": [[k, v], ...]}
    {"op": "drop"}                                          → {"deleted": n}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, TypeAdapter, ValidationError

from corral.errors import CorralError, PayloadTooLarge
from corral.store.db import Database
from corral.wire import WireModel

MAX_KEY_BYTES = 2048
MAX_VALUE_BYTES = 128 * 1024  # encoded, as DESIGN says
MAX_KEYS = 128  # per request
MAX_LIST = 1000

Key = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KEY_BYTES)]


class _Op(WireModel):
    pass


class Get(_Op):
    op: Literal["get"]
    keys: list[Key] = Field(min_length=1, max_length=MAX_KEYS)


class Put(_Op):
    op: Literal["put"]
    entries: dict[Key, str] = Field(min_length=1, max_length=MAX_KEYS)


class Delete(_Op):
    op: Literal["delete"]
    keys: list[Key] = Field(min_length=1, max_length=MAX_KEYS)


class List(_Op):
    op: Literal["list"]
    prefix: str = ""
    after: Key | None = None
    limit: int = Field(100, ge=1, le=MAX_LIST)


class Drop(_Op):
    op: Literal["drop"]


KvOp = Annotated[Get | Put | Delete | List | Drop, Field(discriminator="op")]
_OPS: TypeAdapter[KvOp] = TypeAdapter(KvOp)


class KvStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def apply(self, actor_id: str, body: dict[str, Any], now: float) -> dict[str, Any]:
        """Run one KV operation for ``actor_id``; never raises for a bad request."""
        try:
            op = _OPS.validate_python(body)
            _check_sizes(op)
            return {"ok": True, **_run(self.db, actor_id, op, now)}
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return _refused("invalid_request", f"{where}: {first['msg']}")
        except CorralError as exc:
            return _refused(exc.code, str(exc))


def _refused(code: str, error: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "error": error}


def _check_sizes(op: Get | Put | Delete | List | Drop) -> None:
    # Lengths above are in characters; the limits are on the stored UTF-8 bytes.
    keys: list[str] = []
    if isinstance(op, Put):
        keys = list(op.entries)
    elif isinstance(op, Get | Delete):
        keys = op.keys
    for key in keys:
        if len(key.encode()) > MAX_KEY_BYTES:
            raise PayloadTooLarge(f"a key is over {MAX_KEY_BYTES} bytes")
    if isinstance(op, Put):
        for key, value in op.entries.items():
            if len(value.encode()) > MAX_VALUE_BYTES:
                raise PayloadTooLarge(f"the value of {key[:80]!r} is over {MAX_VALUE_BYTES} bytes")


def _run(db: Database, actor_id: str, op: Get | Put | Delete | List | Drop, now: float) -> Any:
    with db.transaction(write=not isinstance(op, Get | List)) as tx:
        if isinstance(op, Get):
            marks = ", ".join("?" for _ in op.keys)
            rows = tx.execute(
                f"SELECT key, value FROM actor_kv WHERE actor_id = ? AND key IN ({marks})",
                (actor_id, *op.keys),
            )
            found = {r["key"]: r["value"] for r in rows}
            return {"values": [found.get(k) for k in op.keys]}
        if isinstance(op, Put):
            tx.many(
                "INSERT INTO actor_kv (actor_id, key, value, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (actor_id, key) DO UPDATE "
                "SET value = excluded.value, updated_at = excluded.updated_at",
                [(actor_id, k, v, now) for k, v in op.entries.items()],
            )
            return {}
        if isinstance(op, Delete):
            keys = list(dict.fromkeys(op.keys))
            marks = ", ".join("?" for _ in keys)
            gone = tx.execute(
                f"DELETE FROM actor_kv WHERE actor_id = ? AND key IN ({marks}) RETURNING key",
                (actor_id, *keys),
            )
            return {"deleted": len(gone)}
        if isinstance(op, List):
            rows = tx.execute(
                "SELECT key, value FROM actor_kv WHERE actor_id = ? AND key > ? "
                "AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
                (actor_id, op.after or "", len(op.prefix), op.prefix, op.limit),
            )
            return {"entries": [[r["key"], r["value"]] for r in rows]}
        gone = tx.execute("DELETE FROM actor_kv WHERE actor_id = ? RETURNING key", (actor_id,))
        return {"deleted": len(gone)}
