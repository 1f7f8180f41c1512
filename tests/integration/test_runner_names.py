"""A runner given a name with two addresses connects to each, and names the coordinator,
not the address: in the Host header, and over TLS as the server name the certificate is
checked against (a certificate for the name alone: checked against the address, the
handshake fails and the request never comes).

Real sockets, both transports: a bare TLS server at one port on 127.0.0.1 and 127.0.0.2
(both loopback on Linux) answers every request 503, so the runner moves on to the other
address, and notes where each request came and what it named. The name resolves by a
table given to the runner (this machine's /etc/hosts is not the tests' to change)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from corral.ids import RunnerId
from corral.runner.core import RunnerCore
from corral.runner.link import HttpLink, LinkDown
from corral.runner.settings import RunnerSettings

pytestmark = pytest.mark.anyio
NAME = "corral.test"
ADDRESSES = ["127.0.0.1", "127.0.0.2"]
WAIT_S = 20.0


async def resolve(host: str) -> Sequence[str]:
    if host != NAME:
        raise OSError(f"{host}: unknown name")
    return ADDRESSES


def certificate(root: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``NAME`` alone, and its key."""
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", f"/CN={NAME}",
         "-addext", f"subjectAltName=DNS:{NAME}"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


class Seen:
    """The requests that came: (the address they came to, their path, their Host)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        except (OSError, asyncio.IncompleteReadError):
            writer.close()
            return
        host = [line.split(":", 1)[1].strip() for line in head if line.lower().startswith("host:")]
        address = writer.get_extra_info("sockname")[0]
        self.requests.append((address, head[0].split()[1], ",".join(host)))
        self.changed.set()
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        writer.close()

    async def until(self, path: str, count: int) -> list[tuple[str, str]]:
        """(address, Host) of the first ``count`` requests for ``path``, once they came."""

        async def came() -> list[tuple[str, str]]:
            while len(found := [(a, h) for a, p, h in self.requests if p == path]) < count:
                self.changed.clear()
                await self.changed.wait()
            return found[:count]

        return await asyncio.wait_for(came(), WAIT_S)


@asynccontextmanager
async def coordinators_of_the_name(root: Path) -> AsyncIterator[tuple[Seen, int]]:
    cert, key = certificate(root)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with socket.socket() as probe:
        probe.bind((ADDRESSES[0], 0))
        port = probe.getsockname()[1]
    seen = Seen()
    servers = [
        await asyncio.start_server(seen.answer, address, port, ssl=context) for address in ADDRESSES
    ]
    try:
        yield seen, port
    finally:
        for server in servers:
            server.close()


async def test_the_long_poll_link_names_the_coordinator_at_each_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))  # trusted by httpx
    async with coordinators_of_the_name(tmp_path) as (seen, port):
        link = HttpLink(f"https://{NAME}:{port}", resolve=resolve)
        try:
            for _ in ADDRESSES:
                with pytest.raises(LinkDown, match="HTTP 503"):
                    await link.heartbeat(RunnerId("rnr_1"), [])
        finally:
            await link.aclose()
        came = await seen.until("/runner/heartbeat", len(ADDRESSES))
    assert sorted(came) == [(address, f"{NAME}:{port}") for address in ADDRESSES]


async def test_the_websocket_names_the_coordinator_at_each_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))  # trusted by OpenSSL
    async with coordinators_of_the_name(tmp_path) as (seen, port):
        settings = RunnerSettings(coordinator_url=f"https://{NAME}:{port}", transport="websocket")
        transport = RunnerCore(settings, resolve=resolve).transport
        opening = asyncio.create_task(transport.open())
        try:
            came = await seen.until("/runner/socket", len(ADDRESSES))
        finally:
            opening.cancel()
            await transport.close()
    assert sorted(came) == [(address, f"{NAME}:{port}") for address in ADDRESSES]
