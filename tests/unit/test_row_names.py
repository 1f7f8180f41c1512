"""The store's rows are named by their statement's columns, read from the cursor once a
statement (``corral.store.db._names``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.store.db import _dicts


class Cursor:
    """A cursor that counts how often its ``description`` (costly in psycopg) is read."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.reads = 0

    @property
    def description(self) -> Sequence[Sequence[Any]]:
        self.reads += 1
        return [(name, None) for name in self.names]


def test_a_statements_column_names_are_read_once_and_kept() -> None:
    kept: dict[str, tuple[str, ...]] = {}
    cursor = Cursor("id", "status")
    assert _dicts(kept, "q", [(1, "pending")], cursor) == [{"id": 1, "status": "pending"}]
    assert _dicts(kept, "q", [(2, "claimed")], cursor) == [{"id": 2, "status": "claimed"}]
    assert cursor.reads == 1
    # A column added since (a migration): read again.
    wider = Cursor("id", "status", "lost_at")
    assert _dicts(kept, "q", [(3, "lost", 9.0)], wider) == [
        {"id": 3, "status": "lost", "lost_at": 9.0}
    ]
    assert wider.reads == 1
