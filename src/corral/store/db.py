"""A thin database handle over sqlite3 and psycopg: transactions, rows as dicts, dialect hooks.

SQL is written once with ``?`` placeholders; the PostgreSQL handle turns them into ``%s``.
Driver errors leave this module as ``Unavailable`` (the database is down or busy) so
callers above never see a driver type. A transaction opened inside another one of the same
thread is a savepoint of it, or part of it when the outer one is ``flat``: store operations
each open their own, and a caller can still make several of them one commit.

What fails inside a flat transaction fails it whole: if the code that opened the part that
failed catches the error and goes on, the flat transaction still ends rolled back, with
``SpoiltTransaction`` — the writes made before the failure cannot be undone alone.
"""

from __future__ import annotations

import math
import re
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg
import psycopg_pool
from psycopg import pq
from psycopg.rows import tuple_row

from corral.errors import InvalidRequest, Unavailable
from corral.store.schema import MIGRATIONS, render, statements
from corral.store.wakeups import NODE_SETTING

Row = dict[str, Any]
Params = Sequence[Any]


class SpoiltTransaction(Exception):
    """A flat transaction ended rolled back: a part of it failed, and the error was caught
    inside it (the code that opened that part tried another way, say) — what that part
    wrote before it failed could not be undone alone."""


class Tx(Protocol):
    # The clause that locks selected rows until commit, as ``Database.lock_rows()``.
    lock: str

    def execute(self, sql: str, params: Params = ()) -> list[Row]: ...

    def many(self, sql: str, rows: Sequence[Params]) -> None:
        """One statement (an INSERT) for each of ``rows``: cheaper than one execute each."""
        ...

    def one(self, sql: str, params: Params = ()) -> Row | None: ...

    def tuples(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """The rows as tuples, in the order of the columns: no dict a row (for reads that
        return thousands, as the event pump's)."""
        ...

    def named_tuples(
        self, sql: str, params: Params = ()
    ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        """The columns' names, and the rows as tuples: for rows made into records at once
        (``rows.runs_from_tuples``), whose dicts would be thrown away."""
        ...


class Database(Protocol):
    dialect: str

    def transaction(self, *, write: bool = True, flat: bool = False) -> Any:
        """A context manager yielding ``Tx``. Opened inside one already open in this thread,
        a savepoint of it (its failure undoes only its own writes; the outer one commits
        them all at once) — unless the one it is opened in is ``flat``: then what is opened
        inside joins it, and any failure undoes it all (no savepoint round trips). A ``flat``
        savepoint is flat for what is opened inside it, as it would be on its own: a group
        of calls in one transaction (``coordinator/writer.py``) runs each as it runs alone."""
        ...

    def lock_rows(self, *, skip_locked: bool = False) -> str:
        """The clause that locks selected rows against other writers until commit ('' where
        the whole DB is locked). It does not block foreign-key checks that reference them."""
        ...

    def json_subset(self, column: str) -> str:
        """A condition: every element of the JSON list in ``column`` is in the JSON list
        bound to the condition's one ``?``."""
        ...

    def close(self) -> None: ...


# The column names of each statement's rows, by its text: ``cursor.description`` is made
# anew at each call (a tuple of seven for each column: 15 µs for a run's 37 columns, and
# ``RETURNING *`` reads a run's row several times in its life). Bounded: statements with
# lists of placeholders come in many lengths.
_NAMES: dict[str, tuple[str, ...]] = {}
_NAMES_KEPT = 1000


class _Described(Protocol):
    """A cursor: its ``description`` names the columns of its rows."""

    @property
    def description(self) -> Sequence[Sequence[Any]] | None: ...


def _dicts(
    kept: dict[str, tuple[str, ...]], sql: str, rows: list[Any], cursor: _Described
) -> list[Row]:
    """Rows (tuples) as dicts, the statement's column names kept by its text in ``kept``:
    a cursor's ``description`` builds them anew at every statement."""
    names = _names(kept, sql, rows, cursor)
    return [dict(zip(names, row, strict=True)) for row in rows]


def _names(
    kept: dict[str, tuple[str, ...]], sql: str, rows: list[Any], cursor: _Described
) -> tuple[str, ...]:
    """The names of the columns of ``rows`` (not empty), kept by the statement's text. The
    cursor's ``description`` is read only when they are not kept: psycopg makes a Column
    of each column at every read (a run's 37: ~40 µs, twice a dispatch)."""
    names = kept.get(sql)
    if names is None or len(names) != len(rows[0]):  # a column added since (a migration)
        if len(kept) >= _NAMES_KEPT:
            kept.clear()
        names = kept[sql] = tuple(column[0] for column in cursor.description or ())
    return names


class _SqliteTx:
    lock = ""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Params = ()) -> list[Row]:
        cur = self._run(sql, params)
        rows = cur.fetchall()  # none for a statement that returns no rows
        return _dicts(_NAMES, sql, rows, cur) if rows else []

    def tuples(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return self._run(sql, params).fetchall()

    def named_tuples(
        self, sql: str, params: Params = ()
    ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        cur = self._run(sql, params)
        rows = cur.fetchall()
        return (_names(_NAMES, sql, rows, cur) if rows else ()), rows

    def _run(self, sql: str, params: Params) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, tuple(params))
        except (OverflowError, UnicodeEncodeError) as exc:
            raise _unstorable(exc) from exc

    def many(self, sql: str, rows: Sequence[Params]) -> None:
        if rows:
            try:
                self._conn.executemany(sql, [tuple(r) for r in rows])
            except (OverflowError, UnicodeEncodeError) as exc:
                raise _unstorable(exc) from exc

    def one(self, sql: str, params: Params = ()) -> Row | None:
        rows = self.execute(sql, params)
        return rows[0] if rows else None


class SqliteDatabase:
    """One connection per thread. Writers take the lock up front (BEGIN IMMEDIATE) so a
    read-then-write transaction never fails half-way with SQLITE_BUSY on upgrade."""

    dialect = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_s: float = 30.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._writer = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Transactions under way in any thread, and ``close`` waiting for them to end.
        self._open = 0
        self._settled = threading.Condition(self._lock)
        self._closing = False

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL
            conn.execute("PRAGMA foreign_keys=ON")
            # Savepoints and multi-row statements keep the pages they change in a journal of
            # their own: past 64 KiB a temporary file, written page by page (two thirds of
            # the writes a run cost). In memory: what they hold is bounded (batches).
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def transaction(self, *, write: bool = True, flat: bool = False) -> Iterator[Tx]:
        if getattr(self._local, "depth", 0):
            if write and not self._local.writing:
                raise RuntimeError("a write transaction inside a read-only one")
            if self._local.flat:
                with _joined(self._local):
                    yield _SqliteTx(self._conn())
                return
            with self._savepoint(flat) as tx:
                yield tx
            return
        if not write:
            with self._transaction(write=False, flat=flat) as tx:
                yield tx
            return
        # Writers of this process queue on a lock: SQLite's own busy handler waits by
        # sleeping (1, 2, 5 … ms), which under many threads costs far more than the work.
        # Other processes are still kept out by the database lock and the busy timeout.
        with self._writer, self._transaction(write=True, flat=flat) as tx:
            yield tx

    @contextmanager
    def _transaction(self, *, write: bool, flat: bool) -> Iterator[Tx]:
        with self._lock:
            if self._closing:
                raise Unavailable("the database is being closed")
            self._open += 1
        try:
            with self._counted_transaction(write=write, flat=flat) as tx:
                yield tx
        finally:
            with self._lock:
                self._open -= 1
                if not self._open:
                    self._settled.notify_all()

    @contextmanager
    def _counted_transaction(self, *, write: bool, flat: bool) -> Iterator[Tx]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:
            raise Unavailable(f"database busy: {exc}") from exc
        self._local.depth, self._local.writing, self._local.flat = 1, write, flat
        self._local.spoilt = False
        try:
            yield _SqliteTx(conn)
            _check_not_spoilt(self._local)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        finally:
            self._local.depth = 0
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            conn.execute("ROLLBACK")
            raise Unavailable(f"commit failed: {exc}") from exc

    @contextmanager
    def _savepoint(self, flat: bool) -> Iterator[Tx]:
        """A transaction inside this thread's open one: undone alone if it fails."""
        local = self._local
        conn, depth, outer_flat, outer_spoilt = self._conn(), local.depth, local.flat, local.spoilt
        name = f"corral_sp{depth}"
        conn.execute(f"SAVEPOINT {name}")
        local.depth, local.flat, local.spoilt = depth + 1, flat, False
        try:
            yield _SqliteTx(conn)
            _check_not_spoilt(local)
        except BaseException:
            conn.execute(f"ROLLBACK TO {name}")
            raise
        finally:
            local.depth, local.flat, local.spoilt = depth, outer_flat, outer_spoilt
            conn.execute(f"RELEASE {name}")

    def lock_rows(self, *, skip_locked: bool = False) -> str:
        return ""  # BEGIN IMMEDIATE already holds the database's single write lock

    def json_subset(self, column: str) -> str:
        return (
            f"NOT EXISTS (SELECT 1 FROM json_each({column}) AS e "
            "WHERE e.value NOT IN (SELECT value FROM json_each(?)))"
        )

    def close(self) -> None:
        # A worker thread may still be inside a transaction (a retention pass, or the event
        # pump's read, that the app stopped waiting for while its thread ran on): closing
        # its connection under a running statement crashes the process in sqlite3. So no
        # transaction starts from now on, and those under way are waited for (bounded:
        # never hang).
        with self._lock:
            self._closing = True
            try:
                self._settled.wait_for(lambda: not self._open, timeout=self._busy_timeout_s)
                for conn in self._all:
                    conn.close()
                self._all.clear()
                self._local = threading.local()
            finally:
                self._closing = False


# Rows come from psycopg as tuples, made dicts here with the names of ``_PG_NAMES`` (as
# ``_NAMES``, kept apart: a statement's text may name other columns on the other dialect):
# psycopg's dict_row takes them from ``cursor.description`` at every statement.
_PgConnection = psycopg.Connection[tuple[Any, ...]]
_PG_NAMES: dict[str, tuple[str, ...]] = {}

# Each statement's text as PostgreSQL takes it, by its text here (``?`` placeholders made
# ``$1``, ``$2``…, encoded): the claim's statement is 4 kB, made so at every claim otherwise.
# Sent as it is by a raw cursor: psycopg's own cursor parses a statement's ``%s`` again at
# every execution once it is longer than 4,096 bytes (``MAX_CACHED_STATEMENT_LENGTH``), as
# the claim's is since it stores the start commands (~100 µs of the coordinator's CPU a
# claim). No statement here holds a ``?`` or ``%`` but as a placeholder.
_PG_TEXTS: dict[str, bytes] = {}


def _numbered_placeholders(sql: str) -> bytes:
    parts = sql.split("?")
    return "".join(
        part if n == len(parts) else f"{part}${n}" for n, part in enumerate(parts, 1)
    ).encode()


class _PostgresTx:
    lock = "FOR NO KEY UPDATE"

    def __init__(self, conn: _PgConnection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Params = ()) -> list[Row]:
        cur = self._run(sql, params)
        # Whether rows came back, from the result's status: ``cur.description`` would build
        # a Column for each of them first (tens of µs a statement, several statements a run).
        result = cur.pgresult
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return []
        rows = cur.fetchall()
        return _dicts(_PG_NAMES, sql, rows, cur) if rows else []

    def tuples(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return self._run(sql, params).fetchall()

    def named_tuples(
        self, sql: str, params: Params = ()
    ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        cur = self._run(sql, params)
        result = cur.pgresult
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return (), []
        rows = cur.fetchall()
        return (_names(_PG_NAMES, sql, rows, cur) if rows else ()), rows

    def _run(self, sql: str, params: Params) -> psycopg.Cursor[tuple[Any, ...]]:
        text = _PG_TEXTS.get(sql)
        if text is None:
            if len(_PG_TEXTS) >= _NAMES_KEPT:
                _PG_TEXTS.clear()
            text = _PG_TEXTS[sql] = _numbered_placeholders(sql)
        try:
            return psycopg.RawCursor(self._conn).execute(text, tuple(params))
        except (psycopg.DataError, UnicodeEncodeError) as exc:
            raise _unstorable(exc) from exc

    def many(self, sql: str, rows: Sequence[Params]) -> None:
        if not rows:
            return
        if len(rows) == 1:
            # One round trip: psycopg's executemany pipelines the rows, and its pipeline's
            # sync costs a second (a run created, a command stored).
            self.execute(sql, rows[0])
            return
        with self._conn.cursor() as cur:
            try:
                cur.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])
            except (psycopg.DataError, UnicodeEncodeError) as exc:
                raise _unstorable(exc) from exc

    def one(self, sql: str, params: Params = ()) -> Row | None:
        rows = self.execute(sql, params)
        return rows[0] if rows else None


class PostgresDatabase:
    dialect = "postgres"

    def __init__(self, url: str, *, max_connections: int = 16) -> None:
        self.url = url
        # Who writes through this handle: the wake-up triggers name it in what they send,
        # so this process's listener can pass over its own (corral.store.wakeups).
        self.node = secrets.token_hex(8)
        self._local = threading.local()  # this thread's open transaction, if any
        self._used_at: weakref.WeakKeyDictionary[_PgConnection, float] = weakref.WeakKeyDictionary()
        self._pool: psycopg_pool.ConnectionPool[_PgConnection] = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            # Autocommit: a write transaction is a block psycopg begins and commits
            # (``transaction``); a read runs its statements as they come (``_reading``).
            kwargs={"row_factory": tuple_row, "autocommit": True},
            configure=self._name_node,
            check=self._check,
            # No ``reset``: with one, the pool returns every connection on a worker thread
            # of its own, so the caller's next transaction, a moment later, found none
            # ready and waited for that thread, or grew the pool (one thread's back-to-back
            # transactions took 4 connections). ``transaction`` notes when it was used.
            open=False,
        )
        _probe(url)
        try:
            self._pool.open(wait=True, timeout=10)
        except psycopg_pool.PoolTimeout as exc:
            raise Unavailable(f"cannot connect to PostgreSQL at {_redact(url)}") from exc

    def _name_node(self, conn: _PgConnection) -> None:
        # JIT off: every statement here is short, and on a table without statistics yet (a
        # new one, or one just migrated) the planner's guess can pass jit_above_cost: the
        # event numbering's compiled in 110 ms to run in 1.
        conn.execute(
            "SELECT set_config(%s, %s, false), set_config('jit', 'off', false)",
            (NODE_SETTING, self.node),
        )
        conn.commit()

    # A connection taken from the pool is checked with a round trip (an empty query) so that
    # one a restart of PostgreSQL broke is replaced, not used — unless it came back from a
    # transaction less than ``_FRESH_S`` ago: a restart that short is all that goes unseen,
    # and a busy coordinator saves a round trip a transaction. One a restart broke anyway
    # fails its transaction (Unavailable) and is discarded.
    _FRESH_S = 1.0

    def _check(self, conn: _PgConnection) -> None:
        if time.monotonic() - self._used_at.get(conn, -math.inf) >= self._FRESH_S:
            psycopg_pool.ConnectionPool.check_connection(conn)

    @contextmanager
    def transaction(self, *, write: bool = True, flat: bool = False) -> Iterator[Tx]:
        local = self._local
        current: _PgConnection | None = getattr(local, "conn", None)
        if current is not None and not local.writing:
            if write:
                raise RuntimeError("a write transaction inside a read-only one")
            yield _PostgresTx(current)  # a read in a read: its statements run as they come
            return
        if current is not None and local.flat:
            with _joined(local):
                yield _PostgresTx(current)
            return
        if current is not None:  # inside this thread's open transaction: a savepoint
            outer_flat, outer_spoilt = local.flat, local.spoilt
            local.flat, local.spoilt = flat, False
            try:
                with current.transaction():
                    yield _PostgresTx(current)
                    _check_not_spoilt(local)
            finally:
                local.flat, local.spoilt = outer_flat, outer_spoilt
            return
        try:
            with self._pool.connection(timeout=30) as conn:
                try:
                    with self._writing(conn, flat) if write else self._reading(conn) as tx:
                        yield tx
                finally:
                    self._used_at[conn] = time.monotonic()  # as it goes back to the pool
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            raise Unavailable(f"PostgreSQL unavailable: {exc}") from exc

    @contextmanager
    def _writing(self, conn: _PgConnection, flat: bool) -> Iterator[Tx]:
        """A write transaction: one block, begun first; this thread's open transaction."""
        local = self._local
        with conn.transaction():
            local.conn, local.writing, local.flat, local.spoilt = conn, True, flat, False
            try:
                yield _PostgresTx(conn)
                _check_not_spoilt(local)
            finally:
                local.conn = None

    @contextmanager
    def _reading(self, conn: _PgConnection) -> Iterator[Tx]:
        """A read-only transaction: its statements run one by one, each committed as it
        ends (autocommit), with no BEGIN before them nor COMMIT after, a round trip each
        that a read of one statement (most are) paid twice. Under READ COMMITTED (the
        default, which corral's transactions are written for) a transaction gives a read
        nothing more: each statement takes its own snapshot anyway, and a read takes no
        lock it would hold until the end."""
        local = self._local
        local.conn, local.writing = conn, False
        try:
            yield _PostgresTx(conn)
        finally:
            local.conn = None

    def lock_rows(self, *, skip_locked: bool = False) -> str:
        # NO KEY UPDATE: no primary key ever changes, and a plain FOR UPDATE would also
        # block the key-share locks that inserts referencing the row take (a finishing run's
        # session row references its runner), deadlocking the reconciler against a report.
        return "FOR NO KEY UPDATE SKIP LOCKED" if skip_locked else "FOR NO KEY UPDATE"

    def json_subset(self, column: str) -> str:
        return f"{column}::jsonb <@ ?::jsonb"

    def close(self) -> None:
        self._pool.close()


@contextmanager
def _joined(local: threading.local) -> Iterator[None]:
    """A part of this thread's open flat transaction: if it fails, the whole is spoilt."""
    try:
        yield
    except BaseException:
        local.spoilt = True
        raise


def _check_not_spoilt(local: threading.local) -> None:
    if local.spoilt:
        raise SpoiltTransaction("a part of a flat transaction failed, and its error was caught")


def _unstorable(exc: Exception) -> InvalidRequest:
    # The last line of defence: values are checked at the edge (``corral.wire``), but one
    # that slips through (NUL or a huge integer on PostgreSQL, a lone surrogate) is the
    # caller's bad input, not an outage.
    return InvalidRequest(f"a value cannot be stored: {exc}", code="unstorable_value")


def _probe(url: str) -> None:
    """One connection before the pool's, for the reason when there is none (the pool would
    retry in the background and only time out): ``Unavailable`` with what libpq said —
    the server is down, or it refused this role or database. ``corral serve`` waits and
    tries again, showing that reason: a server may come up, a database be created. A URL
    libpq cannot parse is ``invalid_db_url``: no wait can mend it."""
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.ProgrammingError as exc:
        raise InvalidRequest(
            f"not a PostgreSQL URL libpq accepts: {_redact(url)}: {exc}", code="invalid_db_url"
        ) from exc
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().split("\n", 1)[0] or type(exc).__name__
        raise Unavailable(f"cannot connect to PostgreSQL at {_redact(url)}: {reason}") from exc


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://…@{rest.split('@', 1)[1]}"
    return url


def redact_url(url: str) -> str:
    """``url`` fit to print: a password (in the user part or a ``password=`` parameter)
    becomes ``***``; the rest is left exactly as it was."""
    url = _URL_PASSWORD.sub(r"\1***@", url)
    return _PARAM_PASSWORD.sub(r"\1***", url)


_URL_PASSWORD = re.compile(r"(//[^/@:?#]*:)[^/@?#]*@")
_PARAM_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def sqlite_path(url: str) -> Path | None:
    """The SQLite file a database URL names; None for PostgreSQL."""
    if url.startswith(("postgresql://", "postgres://")):
        return None
    return Path(url.removeprefix("sqlite:///").removeprefix("sqlite://"))


def open_database(url: str) -> Database:
    """``postgresql://…`` opens PostgreSQL; anything else is a SQLite file path."""
    path = sqlite_path(url)
    db: Database = PostgresDatabase(url) if path is None else SqliteDatabase(path)
    migrate(db)
    return db


def migrate(db: Database) -> int:
    """Apply every migration not yet applied; safe when several processes start at once."""
    with db.transaction() as tx:
        if db.dialect == "postgres":
            tx.execute("SELECT pg_advisory_xact_lock(4242001)")  # one migrator at a time
        tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        done = {r["version"] for r in tx.execute("SELECT version FROM schema_migrations")}
        for version, sql in MIGRATIONS:
            if version in done:
                continue
            for statement in statements(render(sql, db.dialect)):
                tx.execute(statement)
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
                (version, datetime.now(UTC).isoformat()),
            )
        row = tx.one("SELECT MAX(version) AS v FROM schema_migrations")
    return int(row["v"]) if row and row["v"] is not None else 0
