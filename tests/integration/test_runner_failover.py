"""A long-poll runner given several coordinator URLs moves to the next when one fails.

A real server (uvicorn on a local port) and an address where nothing listens: the call
that fails on the dead one raises ``LinkDown`` (the runner retries it), and the retry goes
to the next URL."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest
from api_fixtures import TOKEN, live_server, with_token

from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.runner.link import HttpLink, LinkDown


def nothing_listens() -> str:
    """The URL of a local port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def register(link: HttpLink) -> str:
    registration = await link.register(
        name="runner-a", hostname="a", labels=[], slots=1, version="0", runner_id=None, held=[]
    )
    return registration.runner_id


def test_a_runner_moves_to_the_next_coordinator_when_one_fails(tmp_path: Path) -> None:
    app = create_app(with_token(CoordinatorSettings(db_url=str(tmp_path / "corral.db"))))
    with live_server(app) as live:

        async def scenario() -> None:
            link = HttpLink(f"{nothing_listens()},{live}", token=TOKEN)
            try:
                with pytest.raises(LinkDown):
                    await register(link)  # the first URL: nobody there
                runner_id = await register(link)  # the retry goes to the next one
                assert await link.poll(runner_id, 1, 0) == []
            finally:
                await link.aclose()

        anyio.run(scenario, backend="asyncio")
