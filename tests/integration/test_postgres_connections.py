"""PostgreSQL's connection pool after a restart broke its connections (``db.py``): one idle
past the check's threshold is replaced before it is used; one used just before fails the
transaction it is taken for (``Unavailable``), and the next one gets a new connection.
Every connection, a replacement too, has JIT compilation off. A coordinator starting while
the database is away waits for it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit

import anyio
import psycopg
import pytest
from api_fixtures import PG_URL, with_token

from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import Unavailable
from corral.store import Store
from corral.store.db import PostgresDatabase

pytestmark = pytest.mark.parametrize(
    "dialect", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def backend_pid(db: PostgresDatabase) -> int:
    with db.transaction(write=False) as tx:
        row = tx.one("SELECT pg_backend_pid() AS pid")
    assert row is not None
    return int(row["pid"])


def terminate(pid: int) -> None:
    """As a restart of PostgreSQL does to the pool's connection (the pool keeps one), and
    wait until its server process has exited: the call returns at once otherwise, and on a
    loaded machine the next query ran on the connection before it was cut (as it did once
    past the call's own wait, 10 s, on a machine at load 17)."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 120
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, f"server process {pid} still there after 120 s"
            time.sleep(0.01)


def pooled(db: PostgresDatabase) -> int:
    """How many connections the pool holds (in use or not)."""
    return int(db._pool.get_stats()["pool_size"])


def test_a_threads_transactions_one_after_another_take_one_connection(store: Store) -> None:
    """A connection is back in the pool as its transaction ends: the pool handed it back
    on a worker thread of its own (a ``reset`` callback), so the next transaction a moment
    later found none ready and grew the pool (to 4 in 600 transactions), each return a
    thread hop."""
    db = store.db
    assert isinstance(db, PostgresDatabase)
    for _ in range(100):
        with db.transaction(write=False) as tx:
            tx.one("SELECT 1 AS x")
        with db.transaction() as tx:
            tx.one("SELECT 1 AS x")
        assert db._pool.get_stats()["pool_available"] == 1
    assert pooled(db) == 1


def test_a_connection_idle_past_the_threshold_is_checked_and_replaced(store: Store) -> None:
    db = store.db
    assert isinstance(db, PostgresDatabase)
    db._FRESH_S = 0.0  # every connection taken is idle past it
    broken = backend_pid(db)
    terminate(broken)
    assert backend_pid(db) != broken


def test_a_connection_used_just_before_fails_one_transaction_then_is_replaced(
    store: Store,
) -> None:
    db = store.db
    assert isinstance(db, PostgresDatabase)
    db._FRESH_S = 3600.0  # every connection taken was used just before: not checked
    broken = backend_pid(db)
    assert pooled(db) == 1  # the next transaction takes the one broken
    terminate(broken)
    with pytest.raises(Unavailable):
        backend_pid(db)
    assert backend_pid(db) != broken


def test_no_connection_compiles_statements_just_in_time(store: Store) -> None:
    """A planner's guess on a table without statistics had made the event numbering
    compile for 110 ms (jit_above_cost) to run for 1: every connection turns JIT off."""
    db = store.db
    assert isinstance(db, PostgresDatabase)
    db._FRESH_S = 0.0
    for _ in range(2):  # the pool's first connection, then its replacement
        with db.transaction(write=False) as tx:
            row = tx.one("SELECT current_setting('jit') AS jit, pg_backend_pid() AS pid")
        assert row is not None and row["jit"] == "off"
        terminate(int(row["pid"]))


def test_a_read_runs_its_statements_with_no_begin_nor_commit(store: Store) -> None:
    """A read transaction's statements each commit as they end (``_reading``): in a block
    begun before, a statement's transaction would have started before the statement."""
    with store.db.transaction(write=False) as tx:
        rows = [tx.one("SELECT now() = statement_timestamp() AS alone") for _ in range(2)]
    assert rows == [{"alone": True}, {"alone": True}]
    with store.db.transaction() as tx:
        row = tx.one("SELECT now() = statement_timestamp() AS alone")
    assert row == {"alone": False}  # a write is one block, begun first


def test_a_write_inside_a_read_is_refused(store: Store) -> None:
    with store.db.transaction(write=False), pytest.raises(RuntimeError):  # noqa: SIM117
        with store.db.transaction():
            pass


class Relay:
    """A TCP relay to ``target`` (PostgreSQL), listening on ``port`` once ``start`` is
    called; ``close`` closes every socket it opened, and any it opens after."""

    def __init__(self, target: tuple[str, int], port: int) -> None:
        self.target, self.port = target, port
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()  # a connection accepted as it closes is closed too
        self.closed = False

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        if self._keep(listener):
            threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            sockets, self.sockets = self.sockets, []
        for sock in sockets:
            _close(sock)

    def _keep(self, *sockets: socket.socket) -> bool:
        """Keep ``sockets`` to close with the relay; closed now (False) if it is closed."""
        with self.lock:
            if not self.closed:
                self.sockets += sockets
                return True
        for sock in sockets:
            _close(sock)
        return False

    def _accept(self, listener: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                if not self._keep(client):
                    return
                upstream = socket.create_connection(self.target)
                if not self._keep(upstream):
                    return
                for ends in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=ends, daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def test_a_coordinator_starting_while_postgresql_is_away_waits_for_it(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``corral serve`` waits for its PostgreSQL before it starts the server; should the
    database go away again before the app opens its store (the chaos soak saw a coordinator
    exit there), the app tries again until it answers, and starts."""
    parts = urlsplit(store_url)
    with socket.socket() as probe:  # a port nobody listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    away = parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}").geturl()
    app = create_app(with_token(CoordinatorSettings(db_url=away)), reconcile=False)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432), port)
    back = threading.Timer(1.0, relay.start)  # the database answers again in a second

    async def start() -> int:
        async with app.router.lifespan_context(app):
            return app.state.coordinator.store.schema_version()  # type: ignore[no-any-return]

    back.start()
    try:
        assert anyio.run(start) > 0  # started, its schema migrated through the relay
    finally:
        back.cancel()
        back.join()
        relay.close()
    assert "trying again in" in caplog.text  # it found the database away first
