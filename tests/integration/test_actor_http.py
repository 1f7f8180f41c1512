"""The runner's HTTP/1.1 client to actors (``runner/actor_http.py``) against real loopback
servers: connections are kept alive and reused, one the actor closed is not reused, a
refused port and a response that breaks off are told apart (the gateway retries only the
first), bodies stream both ways, responses end where HTTP says (a length, chunks, the
connection's end, none for HEAD, 204 or 304), and a request head that a header would break
is never sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from api_fixtures import wait_until

from corral.runner.actor_http import ActorBroke, ActorClient, ActorRefused

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback server that counts the connections it accepted."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            finally:
                writer.close()

        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()


async def read_head(reader: asyncio.StreamReader) -> list[bytes]:
    return (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1, bodiless requests: answers each with its request line, on one connection."""
    while True:
        try:
            head = await read_head(reader)
        except asyncio.IncompleteReadError:
            return
        body = head[0]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


async def read_all(client: ActorClient, port: int, target: str) -> tuple[int, bytes]:
    response = await client.send(port, "GET", target, [], None)
    try:
        return response.status, b"".join([part async for part in response.chunks(1024)])
    finally:
        await response.aclose()


async def test_a_kept_alive_connection_is_reused() -> None:
    client = ActorClient()
    server = Server(keep_alive)
    async with server as port:
        for n in range(3):
            assert await read_all(client, port, f"/n/{n}") == (200, f"GET /n/{n} HTTP/1.1".encode())
    assert server.connections == 1
    await client.aclose()


async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers as HTTP/1.1 (keep-alive), then closes anyway (as an actor that exits)."""
    await read_head(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    await writer.drain()


async def test_a_connection_the_actor_closed_is_not_reused() -> None:
    client = ActorClient()
    server = Server(once)
    async with server as port:
        assert await read_all(client, port, "/a") == (200, b"ok")
        (kept,) = client._idle[port]  # it said keep-alive
        await wait_until(lambda: not kept.usable(), what="the actor's close read")
        assert await read_all(client, port, "/b") == (200, b"ok")
    assert server.connections == 2
    await client.aclose()


async def test_a_refused_port_and_a_broken_response_are_told_apart() -> None:
    async with Server(keep_alive) as port:
        pass  # closed: nobody listens on it now
    with pytest.raises(ActorRefused):
        await ActorClient().send(port, "GET", "/", [], None)

    async def breaks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()

    client = ActorClient()
    async with Server(breaks) as port:
        response = await client.send(port, "GET", "/", [], None)
        assert response.status == 200
        with pytest.raises(ActorBroke):
            async for _ in response.chunks(1024):
                pass
        await response.aclose()
        assert not client._idle.get(port)  # never reused


async def test_a_body_of_unknown_length_goes_chunked_and_the_answer_streams_back() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_head(reader)
        assert b"transfer-encoding: chunked" in [line.lower() for line in head]
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while (size := int((await reader.readline()).strip(), 16)) > 0:
            data = await reader.readexactly(size + 2)
            writer.write(b"%x\r\n%s" % (size, data))  # data ends with its CRLF
            await writer.drain()
        await reader.readline()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def parts() -> AsyncIterator[bytes]:
        for i in range(20):
            yield bytes([i]) * 10_000

    client = ActorClient()
    async with Server(echo) as port:
        response = await client.send(port, "POST", "/echo", [], parts())
        received = b"".join([part async for part in response.chunks(4096)])
        await response.aclose()
    assert received == b"".join(bytes([i]) * 10_000 for i in range(20))
    await client.aclose()


async def test_connections_an_actor_closed_are_let_go_when_another_is_asked() -> None:
    """An actor that went to sleep is never asked on its port again: its kept connection
    must not hold a file descriptor for ever."""
    client = ActorClient(prune_every_s=0.0)
    async with Server(once) as gone_port:
        assert (await read_all(client, gone_port, "/a"))[0] == 200
        (kept,) = client._idle[gone_port]
        await wait_until(lambda: not kept.usable(), what="the actor's close read")
    async with Server(keep_alive) as port:
        assert (await read_all(client, port, "/b"))[0] == 200
    assert gone_port not in client._idle and kept.writer.is_closing()
    await client.aclose()


def answers(raw: bytes) -> Handler:
    """Reads a request head, answers ``raw``, then closes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(raw)
        await writer.drain()

    return handler


@pytest.mark.parametrize(
    ("raw", "body"),
    [
        # HTTP/1.0 without a length: the body ends with the connection.
        (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", b"until the end"),
        # An interim 100 Continue, then the response.
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
)
async def test_responses_end_where_http_says(raw: bytes, body: bytes) -> None:
    client = ActorClient()
    async with Server(answers(raw)) as port:
        assert await read_all(client, port, "/") == (200 if body else 204, body)
    await client.aclose()


async def test_the_answer_to_head_has_no_body_whatever_its_length_says() -> None:
    client = ActorClient()
    async with Server(answers(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")) as port:
        response = await client.send(port, "HEAD", "/", [], None)
        assert response.length == 0 and [part async for part in response.chunks(1024)] == []
        assert ("content-length", "100") in response.headers
        await response.aclose()
    await client.aclose()


async def test_a_header_that_would_break_the_request_head_is_never_sent() -> None:
    server = Server(keep_alive)
    async with server as port:
        for headers in ([("x-a", "1\r\nx-b: 2")], [("x a", "1")]):
            with pytest.raises(ActorBroke):
                await ActorClient().send(port, "GET", "/", headers, None)
        with pytest.raises(ActorBroke):
            await ActorClient().send(port, "GET", "/a b", [], None)
    assert server.connections == 0


async def test_a_body_shorter_than_its_declared_length_breaks_the_request() -> None:
    async def short() -> AsyncIterator[bytes]:
        yield b"abc"

    async with Server(keep_alive) as port:
        with pytest.raises(ActorBroke):
            await ActorClient().send(port, "POST", "/", [("content-length", "10")], short())
