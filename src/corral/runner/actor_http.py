"""HTTP/1.1 to an actor's local port: a small client over asyncio streams and httptools.

The tunnel forwards every gateway request to an actor on loopback, so this sits in the warm
path of each one. httpx did it for ~1.4 ms of CPU a request on a loaded 2-core machine (its
pool, anyio and cookie layers); h11 then took ~70 µs a request, most of what was left in
Python; a request head written here and the response parsed by httptools (llhttp, in C,
which uvicorn already uses) take a tenth of that.

    send(port, method, target, headers, body) ──▶ ActorResponse(status, headers)
        .chunks(size) streams the body · aclose() keeps the connection for the next request
        when both sides finished cleanly and the actor keeps connections alive

Failures say whether the actor may have seen the request: ``ActorRefused`` (its port
refused the connection: it did not) and ``ActorBroke`` (the connection failed once it may
have). A pooled connection the actor has closed meanwhile is noticed before reuse (its end
of file has been read by the event loop) and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Sequence

import httptools

CONNECT_TIMEOUT_S = 5.0
READ_BYTES = 64 * 1024
IDLE_PER_PORT = 8  # kept-alive connections per actor port
PRUNE_EVERY_S = 1.0  # how often kept connections the actors closed are let go

# What may go in a request head (RFC 9110 §5.1, §5.5; RFC 9112 §3): never a line break
# that would let a header value start another header, or another request.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(r"[\x21-\x7e\x80-\xff]+")
_FIELD_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")
_BLANKS = " \t"  # around a header value: not part of it


class ActorRefused(Exception):
    """The actor's port refused the connection: it never saw the request."""


class ActorBroke(Exception):
    """The connection to the actor failed once the actor may have seen the request."""


def request_head(
    method: str, target: str, port: int, headers: Sequence[tuple[str, str]], chunked: bool
) -> bytes:
    """The request line and headers; ``ActorBroke`` for anything HTTP/1.1 cannot carry."""
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
        raise ActorBroke(f"not a request line: {method!r} {target!r}")
    lines = [f"{method} {target} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise ActorBroke(f"not a header: {name!r}")
        lines.append(f"{name}: {value.strip(_BLANKS)}\r\n")
    if chunked:
        lines.append("transfer-encoding: chunked\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ActorBroke(f"not a header: {exc}") from exc


class _Parsed:
    """httptools' callbacks: the response's head and the body parts not taken yet."""

    def __init__(self, head_only: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only  # a response to HEAD: no body, whatever it declares
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.head_done = False
        self.body: list[bytes] = []
        self.done = False
        self.keep_alive = False
        self.more = False  # a message began after this one: the connection is not reusable
        self._fields: list[tuple[str, str]] = []

    def on_message_begin(self) -> None:
        self.more = self.done

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        fields, self._fields = self._fields, []
        if 100 <= status < 200:
            return  # 100 Continue and the like: the response comes after
        self.status, self.headers, self.head_done = status, fields, True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it at the end
        if self.head_only:
            self.done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.done = True

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self.done:  # what follows a HEAD's response is not ours to parse
                raise ActorBroke(repr(exc)) from exc
            self.more = True

    def ended(self) -> None:
        """The actor closed the connection: the end of a body sent until then."""
        if self.head_done and not self.done and self._until_closed():
            self.done = True
        if not self.done:
            raise ActorBroke("the actor closed the connection before its response's end")

    def _until_closed(self) -> bool:
        for name, value in self.headers:
            if name == "content-length" or (name == "transfer-encoding" and "chunked" in value):
                return False
        return self.status not in (204, 304)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        """Idle and still open at the actor's end (no end of file read meanwhile)."""
        return not self.reader.at_eof() and not self.writer.is_closing()

    async def write(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError as exc:
            raise ActorBroke(repr(exc)) from exc

    async def read_into(self, parsed: _Parsed) -> None:
        try:
            data = await self.reader.read(READ_BYTES)
        except OSError as exc:
            raise ActorBroke(repr(exc)) from exc
        if data:
            parsed.feed(data)
        else:
            parsed.ended()

    def close(self) -> None:
        self.writer.close()


class ActorResponse:
    """A response whose body is read as it comes (``chunks``); ``aclose`` when done."""

    def __init__(self, client: ActorClient, port: int, conn: _Connection, parsed: _Parsed) -> None:
        self._client = client
        self._port = port
        self._conn: _Connection | None = conn
        self._parsed = parsed
        self.status = parsed.status
        self.headers = parsed.headers  # names in lower case
        # The body's length, if the actor declared it (llhttp checked it).
        self.length = next((int(v) for n, v in self.headers if n == "content-length"), None)
        if parsed.head_only or self.status in (204, 304):
            self.length = 0

    async def chunks(self, size: int) -> AsyncIterator[bytes]:
        """The body, in parts of at most ``size`` bytes; ``ActorBroke`` if it breaks off."""
        conn, parsed = self._conn, self._parsed
        assert conn is not None
        while True:
            parts, parsed.body = parsed.body, []
            for data in parts:
                for at in range(0, len(data), size):
                    yield data[at : at + size]
            if parsed.done:
                return
            await conn.read_into(parsed)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        parsed = self._parsed
        if parsed.done and parsed.keep_alive and not parsed.more and not parsed.head_only:
            self._client._keep(self._port, conn)
        else:  # unfinished, or the actor closes after each response (HTTP/1.0)
            conn.close()


class ActorClient:
    def __init__(self, *, prune_every_s: float = PRUNE_EVERY_S) -> None:
        self._idle: dict[int, list[_Connection]] = {}  # by port, the newest last
        self._prune_every_s = prune_every_s
        self._pruned_at = time.monotonic()

    async def send(
        self,
        port: int,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: AsyncIterator[bytes] | None,
    ) -> ActorResponse:
        """Send the request (its body streamed from ``body``) and read the response's head."""
        length = next((v for n, v in headers if n.lower() == "content-length"), None)
        chunked = body is not None and length is None  # a body of unknown length
        head = request_head(method, target, port, headers, chunked)
        conn = await self._connection(port)
        try:
            await conn.write(head)
            if body is not None:
                await _write_body(conn, body, chunked, length)
            parsed = _Parsed(head_only=method == "HEAD")
            while not parsed.head_done:
                await conn.read_into(parsed)
            return ActorResponse(self, port, conn, parsed)
        except BaseException:
            conn.close()
            raise

    async def _connection(self, port: int) -> _Connection:
        idle = self._idle.pop(port, [])
        while idle:
            conn = idle.pop()
            if conn.usable():
                if idle:
                    self._idle[port] = idle
                return conn
            conn.close()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):  # no task of its own, as wait_for
                reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=READ_BYTES)
        except (OSError, TimeoutError) as exc:
            raise ActorRefused(repr(exc)) from exc
        return _Connection(reader, writer)

    def _keep(self, port: int, conn: _Connection) -> None:
        idle = self._idle.setdefault(port, [])
        if len(idle) < IDLE_PER_PORT and conn.usable():
            idle.append(conn)
        else:
            conn.close()
        if time.monotonic() - self._pruned_at >= self._prune_every_s:
            self._prune()

    def _prune(self) -> None:
        """Close kept connections their actor closed (it slept or stopped, and its port may
        never be asked again): they would hold a file descriptor each until then."""
        self._pruned_at = time.monotonic()
        for port, idle in list(self._idle.items()):
            for conn in [c for c in idle if not c.usable()]:
                idle.remove(conn)
                conn.close()
            if not idle:
                del self._idle[port]

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
                with contextlib.suppress(OSError):
                    await conn.writer.wait_closed()
        self._idle.clear()


async def _write_body(
    conn: _Connection, body: AsyncIterator[bytes], chunked: bool, length: str | None
) -> None:
    """The body as it comes: in chunks, or as declared (``ActorBroke`` if it is not)."""
    sent = 0
    async for data in body:
        if not data:
            continue
        sent += len(data)
        await conn.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
    if chunked:
        await conn.write(b"0\r\n\r\n")
    elif length is None or not length.strip().isdigit() or sent != int(length):
        raise ActorBroke(f"the request body was {sent} bytes, not its content-length {length}")
