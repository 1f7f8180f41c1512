"""Database URLs are printed without their passwords (``corral up``, logs)."""

from __future__ import annotations

import pytest

from corral.store.db import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:s3cret@db:5432/x", "postgresql://u:***@db:5432/x"),
        ("postgresql://u:p%40ss@db/x?sslmode=require", "postgresql://u:***@db/x?sslmode=require"),
        ("postgres:///x?host=/tmp&password=s3cret&a=1", "postgres:///x?host=/tmp&password=***&a=1"),
        ("postgresql://postgres@127.0.0.1:5432/test", "postgresql://postgres@127.0.0.1:5432/test"),
        (".corral/corral.db", ".corral/corral.db"),
    ],
)
def test_passwords_are_masked_and_nothing_else_changes(url: str, shown: str) -> None:
    assert redact_url(url) == shown
