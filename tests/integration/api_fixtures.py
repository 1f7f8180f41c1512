"""Helpers shared by the coordinator API tests.

* ``backend_url``: a fresh database on SQLite (a file) or PostgreSQL (a new schema,
  dropped afterwards); ``conftest.py``'s ``db_url`` fixture gives one on each of ``BACKENDS``.
* ``running_api``: the app in process, its lifespan entered by hand, and an
  ``httpx.AsyncClient`` over ``ASGITransport`` wrapped in ``Api`` (runner and client calls).
* ``live_server``: the same app served by uvicorn on a free local port in a thread, for
  responses that must really stream (``ASGITransport`` buffers a whole response), or
  with ``ws=`` a WebSocket implementation, for the runner socket.
* ``wait_until``: wait for a condition instead of sleeping and hoping.

Every request needs a token: ``running_api`` gives its app the admin token ``TOKEN`` (unless
the settings name one) and its client sends it. An app built by hand takes
``with_token(settings)``, and its clients send ``HEADERS`` (runners: ``token=TOKEN``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI

from corral.clock import Clock
from corral.coordinator.app import create_app
from corral.coordinator.service import Coordinator
from corral.coordinator.settings import CoordinatorSettings

PG_URL = os.environ.get("CORRAL_TEST_PG") or "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def auth_headers() -> dict[str, str]:
    """The credential the fuzz tests (test_openapi_fuzz, test_socket_fuzz) send with every
    request and WebSocket upgrade: the admin token ``TOKEN``. A new dict each call:
    schemathesis adds its own headers to the one it is given."""
    return dict(HEADERS)


RUN_ID = r"run_[0-9a-f]{12}"
TOKEN = "crl_test-admin-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def with_token(settings: CoordinatorSettings) -> CoordinatorSettings:
    """``settings`` whose admin token is ``TOKEN`` (unless they name one)."""
    return settings if settings.token else replace(settings, token=TOKEN)


@contextlib.contextmanager
def backend_url(kind: str, tmp_path: Path) -> Iterator[str]:
    """A database URL for ``kind`` that nothing else uses; PostgreSQL schemas are dropped."""
    if kind == "sqlite":
        yield str(tmp_path / "corral.db")
        return
    schema = f"api_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is unreachable at {PG_URL!r}: {exc}")
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def wait_until(
    condition: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    """Check ``condition`` every few milliseconds; fail the test if it stays false."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await anyio.sleep(0.005)


def error_code(response: httpx.Response) -> str:
    """The stable code of an error answer, after checking the error body's shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    code: str = body["error"]["code"]
    return code


@dataclass
class Api:
    """The app under test and a client for it, with the calls clients and runners make."""

    app: FastAPI
    client: httpx.AsyncClient

    @property
    def coordinator(self) -> Coordinator:
        coordinator: Coordinator = self.app.state.coordinator
        return coordinator

    # ---- clients ------------------------------------------------------------------------

    async def create(self, **body: Any) -> str:
        response = await self.client.post("/runs", json=body)
        assert response.status_code == 201, response.text
        run_id: str = response.json()["run_id"]
        return run_id

    async def create_command(self, *argv: str, **body: Any) -> str:
        return await self.create(type="command", command=list(argv or ("echo", "hi")), **body)

    async def run(self, run_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    # ---- runners ------------------------------------------------------------------------

    async def register(self, name: str = "runner-a", **body: Any) -> str:
        response = await self.client.post(
            "/runner/register", json={"name": name, "hostname": f"{name}.local", **body}
        )
        assert response.status_code == 200, response.text
        runner_id: str = response.json()["runner_id"]
        return runner_id

    async def poll(
        self, runner_id: str, *, max_runs: int = 1, timeout: float = 0
    ) -> httpx.Response:
        return await self.client.get(
            "/runner/runs",
            params={"runner_id": runner_id, "max_runs": max_runs, "timeout": timeout},
        )

    async def claim(self, runner_id: str, *, max_runs: int = 1) -> list[dict[str, Any]]:
        """Claim without waiting; an empty list when there is nothing to claim."""
        response = await self.poll(runner_id, max_runs=max_runs, timeout=0)
        if response.status_code == 204:
            return []
        assert response.status_code == 200, response.text
        runs: list[dict[str, Any]] = response.json()["runs"]
        return runs

    async def claim_one(self, runner_id: str) -> dict[str, Any]:
        runs = await self.claim(runner_id)
        assert len(runs) == 1, runs
        return runs[0]

    async def runner_post(
        self, run_id: str, what: str, runner_id: str, attempt: int, **body: Any
    ) -> httpx.Response:
        return await self.client.post(
            f"/runner/runs/{run_id}/{what}",
            json={"runner_id": runner_id, "attempt": attempt, **body},
        )

    async def started(self, run_id: str, runner_id: str, attempt: int = 1) -> None:
        response = await self.runner_post(run_id, "started", runner_id, attempt)
        assert response.status_code == 200, response.text

    async def log(
        self, run_id: str, runner_id: str, attempt: int, *texts: str, first_line: int = 0
    ) -> None:
        lines = [
            {"line_no": first_line + i, "stream": "stdout", "text": t, "ts": time.time()}
            for i, t in enumerate(texts)
        ]
        response = await self.runner_post(run_id, "logs", runner_id, attempt, lines=lines)
        assert response.status_code == 200, response.text

    async def complete(
        self, run_id: str, runner_id: str, attempt: int = 1, **body: Any
    ) -> httpx.Response:
        return await self.runner_post(run_id, "completed", runner_id, attempt, **body)

    async def fail(
        self, run_id: str, runner_id: str, attempt: int = 1, **body: Any
    ) -> httpx.Response:
        return await self.runner_post(run_id, "failed", runner_id, attempt, **body)

    async def heartbeat(self, runner_id: str, held: list[dict[str, Any]] | None = None) -> Any:
        return await self.client.post(
            "/runner/heartbeat", json={"runner_id": runner_id, "held": held or []}
        )

    # ---- the store underneath -----------------------------------------------------------

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """Every stored row, to show that a refused request changed nothing."""
        tables = {
            "runs": "SELECT * FROM runs ORDER BY id",
            "runners": "SELECT * FROM runners ORDER BY id",
            "sessions": "SELECT * FROM sessions ORDER BY id",
            "run_logs": "SELECT * FROM run_logs ORDER BY id",
            "run_callbacks": "SELECT * FROM run_callbacks ORDER BY child_run_id",
        }
        with self.coordinator.store.db.transaction(write=False) as tx:
            return {name: tx.execute(sql) for name, sql in tables.items()}


@contextlib.asynccontextmanager
async def running_api(
    settings: CoordinatorSettings, *, clock: Clock | None = None, reconcile: bool = False
) -> AsyncIterator[Api]:
    """The app in this event loop, with its lifespan (store, coordinator) entered; its
    client sends the admin token."""
    app = create_app(with_token(settings), clock=clock, reconcile=reconcile)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://localhost",
            headers={"Authorization": f"Bearer {with_token(settings).token}"},
        ) as client,
    ):
        yield Api(app, client)


# For a module whose hypothesis tests send their cases to a ``live_server``: hypothesis warns
# when the global ``random``'s state moves while it draws a case, taking it for a strategy's
# own use (an error here: pytest's filterwarnings), and the server, a thread of this process,
# moves it — psycopg_pool's jitter as it opens a connection, a WebSocket ping's payload. That
# failed a case at random ("unreliable results"). Set as the module's ``pytestmark``.
SERVER_BESIDE_HYPOTHESIS = pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies:"
    "hypothesis.errors.HypothesisDeprecationWarning"
)


@contextlib.contextmanager
def live_server(
    app: FastAPI,
    *,
    ws: str = "none",
    graceful_shutdown_s: int = 5,
    server_class: type[uvicorn.Server] = uvicorn.Server,
    keep_alive_s: int = 5,
) -> Iterator[str]:
    """Serve ``app`` with uvicorn (lifespan included) in a thread; yields its base URL.

    ``ws`` is uvicorn's WebSocket implementation (``"none"``: plain HTTP only);
    ``server_class``: corral's own (``CorralServer``) to test how it stops;
    ``keep_alive_s``: how long an idle connection is kept (uvicorn's default, 5 s)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        ws=ws,
        timeout_graceful_shutdown=graceful_shutdown_s,
        timeout_keep_alive=keep_alive_s,
    )
    server = server_class(config)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # SystemExit on a failed startup, too
            errors.append(exc)

    thread = threading.Thread(target=serve, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if errors or not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail(f"uvicorn did not start: {errors}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
        assert not errors, errors
