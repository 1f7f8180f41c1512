"""Actors' key-value state (``Store.kv``, ``corral.store.kv``) on SQLite and PostgreSQL alike:
each operation, byte-order listing with paging, isolation between actors, and refusals
that write nothing."""

from __future__ import annotations

from typing import Any

import pytest

from corral.store import Store
from corral.store.kv import MAX_KEYS

NOW = 1_700_000_000.0
VALUE_LIMIT = 128 * 1024  # DESIGN: values ≤ 128 KiB, encoded


def kv(store: Store, op: dict[str, Any], actor: str = "act_1") -> dict[str, Any]:
    return store.kv.apply(actor, op, NOW)


def test_put_get_delete(store: Store) -> None:
    assert kv(store, {"op": "put", "entries": {"a": "1", "b": "2"}}) == {"ok": True}
    assert kv(store, {"op": "put", "entries": {"a": "one"}}) == {"ok": True}  # overwrites
    got = kv(store, {"op": "get", "keys": ["a", "missing", "b"]})
    assert got == {"ok": True, "values": ["one", None, "2"]}
    assert kv(store, {"op": "delete", "keys": ["a", "a", "nope"]}) == {"ok": True, "deleted": 1}
    assert kv(store, {"op": "get", "keys": ["a"]})["values"] == [None]


def test_actors_do_not_see_each_other(store: Store) -> None:
    kv(store, {"op": "put", "entries": {"k": "mine"}}, actor="act_1")
    kv(store, {"op": "put", "entries": {"k": "theirs"}}, actor="act_2")
    assert kv(store, {"op": "get", "keys": ["k"]}, actor="act_1")["values"] == ["mine"]
    assert kv(store, {"op": "drop"}, actor="act_2") == {"ok": True, "deleted": 1}
    assert kv(store, {"op": "get", "keys": ["k"]}, actor="act_1")["values"] == ["mine"]


def test_list_by_prefix_in_byte_order_with_paging(store: Store) -> None:
    # Upper case sorts before lower case byte by byte, whatever the database's locale.
    keys = ["user/b", "user/B", "user/a", "user/é", "users", "other"]
    kv(store, {"op": "put", "entries": {k: k.upper() for k in keys}})
    first = kv(store, {"op": "list", "prefix": "user/", "limit": 2})
    assert first == {"ok": True, "entries": [["user/B", "USER/B"], ["user/a", "USER/A"]]}
    rest = kv(store, {"op": "list", "prefix": "user/", "after": "user/a"})
    assert [k for k, _ in rest["entries"]] == ["user/b", "user/é"]
    everything = kv(store, {"op": "list"})["entries"]
    assert [k for k, _ in everything] == sorted(keys, key=str.encode)


def test_a_value_may_be_128_kib_and_no_more(store: Store) -> None:
    largest = "é" * (VALUE_LIMIT // 2)  # two bytes each, encoded
    assert kv(store, {"op": "put", "entries": {"k": largest}}) == {"ok": True}
    assert kv(store, {"op": "get", "keys": ["k"]})["values"] == [largest]
    over = kv(store, {"op": "put", "entries": {"k": largest + "x"}})
    assert over["ok"] is False and over["code"] == "payload_too_large", over
    assert kv(store, {"op": "get", "keys": ["k"]})["values"] == [largest]


@pytest.mark.parametrize(
    "op,code",
    [
        ({"op": "teleport"}, "invalid_request"),
        ({"op": "get", "keys": []}, "invalid_request"),
        ({"op": "get", "keys": [""]}, "invalid_request"),
        ({"op": "put", "entries": {"a": 1}}, "invalid_request"),
        ({"op": "put", "entries": {"a": "1"}, "extra": True}, "invalid_request"),
        ({"op": "get", "keys": [str(i) for i in range(MAX_KEYS + 1)]}, "invalid_request"),
        ({"op": "list", "limit": 0}, "invalid_request"),
        ({"op": "put", "entries": {"é" * 1500: "x"}}, "payload_too_large"),
        (
            {"op": "put", "entries": {"ok": "1", "big": "x" * (VALUE_LIMIT + 1)}},
            "payload_too_large",
        ),
    ],
)
def test_a_bad_request_is_refused_and_writes_nothing(
    store: Store, op: dict[str, Any], code: str
) -> None:
    result = kv(store, op)
    assert result["ok"] is False and result["code"] == code, result
    assert result["error"]
    assert kv(store, {"op": "list"})["entries"] == []
