"""What the MCP server adds to a call: tool-call latency over stdio and streamable HTTP
against the same call made with ``corral.AsyncClient`` directly.

One ``corral serve`` (SQLite, no runner: the calls read, or queue runs that stay pending).
For each way of calling it makes ``--samples`` sequential calls of a read
(``list_agents``) and of a write (start an agent session, ``async_poll``), and prints the
median and 95th percentile; then how long ``corral mcp`` takes from spawn to an answered
``initialize`` over stdio.

    python benchmarks/mcp_calls.py [--samples 200]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import count

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from served import CORRAL, corral_serve, free_port

from corral import AsyncClient

TOKEN = "mcp-calls-benchmark"
names = count()


def summary(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return f"  {name:<54} median {statistics.median(ms):7.2f} ms   p95 {p95:7.2f} ms"


async def timed(samples: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    found = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await call()
        found.append(time.perf_counter() - t0)
    return found


@contextlib.asynccontextmanager
async def stdio_session(url: str) -> AsyncIterator[ClientSession]:
    env = {**os.environ, "CORRAL_TOKEN": TOKEN}
    params = StdioServerParameters(command=CORRAL, args=["mcp", "--url", url], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_session(port: int) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def over_mcp(session: ClientSession, label: str, samples: int) -> None:
    async def read() -> None:
        assert not (await session.call_tool("list_agents", {})).is_error

    async def write() -> None:
        name = f"bench-{next(names)}"
        arguments = {"session_name": name, "prompt": "hi", "execution_mode": "async_poll"}
        assert not (await session.call_tool("start_agent_session", arguments)).is_error

    print(summary(f"{label}: list_agents", await timed(samples, read)))
    print(summary(f"{label}: start_agent_session (async_poll)", await timed(samples, write)))


async def bench(url: str, port: int, samples: int) -> None:
    async with AsyncClient(url, token=TOKEN) as corral:

        async def read() -> None:
            await corral.list_agents()

        async def write() -> None:
            await corral.start_session("hi", session_name=f"bench-{next(names)}")

        print(summary("AsyncClient: list_agents", await timed(samples, read)))
        print(summary("AsyncClient: start_session", await timed(samples, write)))
    async with stdio_session(url) as session:
        await over_mcp(session, "MCP stdio", samples)
    async with http_session(port) as session:
        await over_mcp(session, "MCP streamable HTTP", samples)
    starts = []
    for _ in range(5):
        t0 = time.perf_counter()
        async with stdio_session(url):
            starts.append(time.perf_counter() - t0)
    print(summary("corral mcp (stdio): spawn to initialized", starts))


def wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end and proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("corral mcp --http did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    with corral_serve("mcp.db", {"CORRAL_TOKEN": TOKEN}) as (url, _pid):
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        server = subprocess.Popen(
            [CORRAL, "mcp", "--http", "--port", str(port), "--url", url],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for_port(port, server)
            print(f"one coordinator (SQLite), {args.samples} sequential calls each:")
            anyio.run(bench, url, port, args.samples)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)


if __name__ == "__main__":
    main()
