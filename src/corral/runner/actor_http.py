"""HTTP/1.1 to an actor's local port: a small client over asyncio streams and h11.

The tunnel forwards every gateway request to an actor on loopback, so this sits in the warm
path of each one. httpx did it for ~1.4 ms of CPU a request on a loaded 2-core machine (its
pool, anyio and cookie layers); h11 over a stream does the same exchange for a fraction.

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
import time
from collections.abc import AsyncIterator, Sequence

import h11

CONNECT_TIMEOUT_S = 5.0
READ_BYTES = 64 * 1024
IDLE_PER_PORT = 8  # kept-alive connections per actor port
PRUNE_EVERY_S = 1.0  # how often kept connections the actors closed are let go


class ActorRefused(Exception):
    """The actor's port refused the connection: it never saw the request."""


class ActorBroke(Exception):
    """The connection to the actor failed once the actor may have seen the request."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)

    def usable(self) -> bool:
        """Idle and still open at the actor's end (no end of file read meanwhile)."""
        return not self.reader.at_eof() and not self.writer.is_closing()

    async def send(self, event: h11.Event) -> None:
        try:
            data = self.h11.send(event)
            if data:
                self.writer.write(data)
                await self.writer.drain()
        except (OSError, h11.LocalProtocolError) as exc:
            raise ActorBroke(repr(exc)) from exc

    async def next_event(self) -> h11.Event | type[h11.PAUSED]:
        try:
            while True:
                event = self.h11.next_event()
                if event is not h11.NEED_DATA:
                    return event  # type: ignore[return-value]
                self.h11.receive_data(await self.reader.read(READ_BYTES))  # b"": the end
        except (OSError, h11.RemoteProtocolError) as exc:
            raise ActorBroke(repr(exc)) from exc

    def close(self) -> None:
        self.writer.close()


class ActorResponse:
    """A response whose body is read as it comes (``chunks``); ``aclose`` when done."""

    def __init__(
        self, client: ActorClient, port: int, conn: _Connection, response: h11.Response
    ) -> None:
        self._client = client
        self._port = port
        self._conn: _Connection | None = conn
        self.status = response.status_code
        self.headers = [
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in response.headers
        ]
        # The body's length, if the actor declared it (h11 checks it and lowercases names).
        self.length = next((int(v) for n, v in self.headers if n == "content-length"), None)

    async def chunks(self, size: int) -> AsyncIterator[bytes]:
        """The body, in parts of at most ``size`` bytes; ``ActorBroke`` if it breaks off."""
        conn = self._conn
        assert conn is not None
        while True:
            event = await conn.next_event()
            if isinstance(event, h11.Data):
                data = bytes(event.data)
                for at in range(0, len(data), size):
                    yield data[at : at + size]
            elif isinstance(event, h11.EndOfMessage):
                return
            else:  # the connection closed before the body's end
                raise ActorBroke(f"the actor's response broke off: {event!r}")

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
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
        conn = await self._connection(port)
        try:
            sent = [("host", f"127.0.0.1:{port}"), *headers]
            if body is not None and not any(n.lower() == "content-length" for n, _ in headers):
                sent.append(("transfer-encoding", "chunked"))  # a body of unknown length
            await conn.send(h11.Request(method=method, target=target, headers=sent))
            if body is not None:
                async for data in body:
                    await conn.send(h11.Data(data=data))
            await conn.send(h11.EndOfMessage())
            while True:
                event = await conn.next_event()
                if isinstance(event, h11.Response):
                    return ActorResponse(self, port, conn, event)
                if not isinstance(event, h11.InformationalResponse):  # 100 Continue: more
                    raise ActorBroke(f"the actor closed before answering: {event!r}")
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
