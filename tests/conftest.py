"""Shared fixtures: a fresh ``Store`` on each backend.

``store`` is parametrized over SQLite (a file under ``tmp_path``) and PostgreSQL (a fresh
schema per test in the database named by ``CORRAL_TEST_PG``). PostgreSQL tests are never
skipped: CI always has a server, so an unreachable one fails the test loudly.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from corral.store import Store

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
DIALECTS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio only: corral is built on it (trio is here only because
    selenium, for the browser tests, brings it)."""
    return "asyncio"


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The PostgreSQL server tests use (``CORRAL_TEST_PG``, or the local default)."""
    return os.environ.get("CORRAL_TEST_PG") or DEFAULT_PG_URL


def schema_url(pg_url: str, schema: str) -> str:
    """``pg_url`` with every connection's ``search_path`` set to ``schema``."""
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A fresh, uniquely named schema, dropped (CASCADE) after the test."""
    schema = f"t_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(pg_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is unreachable at CORRAL_TEST_PG={pg_url!r}: {exc}")
    try:
        yield schema
    finally:
        _drop_schema(pg_url, schema)


def _drop_schema(pg_url: str, schema: str) -> None:
    """Drop a test's schema. A process of the test still ending (a coordinator being
    stopped) may hold locks the drop waits for in the other order: PostgreSQL then ends the
    drop as a deadlock's victim, and the drop is simply tried again."""
    for attempt in range(10):
        try:
            with psycopg.connect(pg_url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == 9:
                raise
            time.sleep(0.2 * (attempt + 1))


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A Store URL for ``dialect``: more Stores (threads, processes) may open it too."""
    if dialect == "sqlite":
        return str(tmp_path / "corral.db")
    return schema_url(request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A fresh, migrated Store on each backend (ids ``sqlite`` and ``postgres``)."""
    s = Store.open(store_url)
    try:
        yield s
    finally:
        s.close()
