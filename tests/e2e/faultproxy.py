"""A fault-injecting TCP proxy for the end-to-end tests: 127.0.0.1 only, in a thread.

    runner ──▶ FaultProxy (127.0.0.1:port) ──▶ coordinator (127.0.0.1:target)

It forwards each connection's bytes both ways, each chunk held for ``delay_s`` (plus up
to ``jitter_s``; order is kept), and cuts connections on demand or at random
(``start_chaos``). It works on the TCP stream under the WebSocket, so it cannot drop or
repeat single frames without corrupting the stream: a lost or duplicated frame is
modelled the way it happens in practice, by cutting the connection mid-stream. Whatever
was in flight is lost, and the protocol's replay (unacknowledged events and commands sent
again after the reconnect) and its duplicate drops (by index) must make up for it.

A cut is one of:

* ``both``: both sockets are reset (RST) at once: a crashed link;
* ``client``: only the runner's side is reset; the coordinator's socket stays open and
  silent until the runner's next socket evicts it (or the coordinator's lost timer fires);
* ``server``: only the coordinator's side is reset; the runner's socket stays open and
  silent until its keepalive notices.

Bytes that arrive for a side already cut are discarded, like packets to a dead peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

CutMode = Literal["both", "client", "server"]
CUT_MODES: tuple[CutMode, ...] = ("both", "client", "server")
CHUNK = 64 * 1024
T = TypeVar("T")


@dataclass
class ProxyStats:
    accepted: int = 0  # connections from clients
    refused: int = 0  # connections refused while ``refusing``
    upstream_failed: int = 0  # the target did not accept the connection
    cuts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CUT_MODES, 0))
    bytes_up: int = 0  # client → target
    bytes_down: int = 0  # target → client
    dropped_bytes: int = 0  # in flight when their connection was cut

    @property
    def total_cuts(self) -> int:
        return sum(self.cuts.values())


class _Pair:
    """One proxied connection: the client's socket, the target's, and the pumps between."""

    def __init__(
        self,
        proxy: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.up_reader, self.up_writer = upstream
        self.opened_at = time.monotonic()
        self.client_cut = False
        self.server_cut = False
        self.tasks: list[asyncio.Task[None]] = []
        self._ended = 0  # directions that ended with a FIN

    @property
    def done(self) -> bool:
        return self.client_cut and self.server_cut

    def start(self) -> None:
        self.tasks = [
            *self._direction(self.client_reader, self.up_writer, "up"),
            *self._direction(self.up_reader, self.client_writer, "down"),
        ]

    def _direction(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: str
    ) -> list[asyncio.Task[None]]:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        return [
            asyncio.create_task(self._read(reader, queue, way)),
            asyncio.create_task(self._write(writer, queue, way)),
        ]

    def _side_cut(self, way: str, reading: bool) -> bool:
        # "up": read from the client, written to the server; "down": the other way round.
        client_side = (way == "up") == reading
        return self.client_cut if client_side else self.server_cut

    async def _read(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        way: str,
    ) -> None:
        try:
            while data := await reader.read(CHUNK):
                if self._side_cut(way, reading=True):
                    break
                queue.put_nowait((time.monotonic() + self.proxy.next_delay(), data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait(None)

    async def _write(
        self,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        way: str,
    ) -> None:
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                if self._side_cut(way, reading=False):
                    self.proxy.stats.dropped_bytes += len(data)
                    continue
                writer.write(data)
                await writer.drain()
                if way == "up":
                    self.proxy.stats.bytes_up += len(data)
                else:
                    self.proxy.stats.bytes_down += len(data)
        except (ConnectionError, OSError):
            self.cut("both")  # the destination is gone: so is the connection
            return
        if self._side_cut(way, reading=True):
            return  # our own cut ended the source: the other side stays open and silent
        if self._side_cut(way, reading=False):
            self.cut("both")  # the uncut side hung up on its own: the connection is over
            return
        # The source ended cleanly (FIN): pass the half-close on.
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()
        self._ended += 1
        if self._ended == 2:  # both ways closed cleanly
            for w in (self.client_writer, self.up_writer):
                w.close()
            self.client_cut = self.server_cut = True
            self.proxy._pairs.discard(self)

    def cut(self, mode: CutMode) -> None:
        if mode in ("both", "client") and not self.client_cut:
            self.client_cut = True
            _reset(self.client_writer)
        if mode in ("both", "server") and not self.server_cut:
            self.server_cut = True
            _reset(self.up_writer)
        if self.done:
            for task in self.tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            self.proxy._pairs.discard(self)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN: the peer sees a connection reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """``with FaultProxy(target_port) as proxy:`` forwards ``proxy.port`` to the target."""

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        delay_s: float = 0.0,
        jitter_s: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.rng = random.Random(seed)
        self.stats = ProxyStats()
        self.refusing = False  # refuse new connections (reset them at once)
        self.port = 0
        self._pairs: set[_Pair] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._chaos: asyncio.Task[None] | None = None

    # ---- lifetime (called from the test's thread) ----------------------------------------

    def start(self) -> FaultProxy:
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._open())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def close(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- faults (thread-safe) ------------------------------------------------------------

    def cut_all(self, mode: CutMode = "both") -> int:
        """Cut every open connection now; how many were cut."""
        return self._call(self._cut_all, mode)

    def open_connections(self) -> int:
        return self._call(self._count_open)

    def start_chaos(
        self,
        interval_s: tuple[float, float] = (0.2, 0.6),
        modes: Sequence[CutMode] = ("both",),
        min_age_s: float = 0.0,
    ) -> None:
        """From now on, every ``interval_s`` (drawn uniformly) cut one open connection at
        random (at least ``min_age_s`` old), with a mode drawn from ``modes``."""

        async def start() -> None:
            if self._chaos is not None:
                self._chaos.cancel()
            self._chaos = asyncio.create_task(self._chaos_forever(interval_s, modes, min_age_s))

        self._call(start)

    def stop_chaos(self) -> None:
        async def stop() -> None:
            if self._chaos is not None:
                self._chaos.cancel()
                self._chaos = None

        self._call(stop)

    def next_delay(self) -> float:
        return self.delay_s + (self.rng.random() * self.jitter_s if self.jitter_s else 0.0)

    # ---- inside the proxy's loop ---------------------------------------------------------

    def _call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        assert self._loop is not None, "start() first"
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(10)

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._chaos is not None:
            self._chaos.cancel()
        if self._server is not None:
            self._server.close()
        await self._cut_all("both")
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            self.stats.refused += 1
            _reset(writer)
            return
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(*self.target), 5)
        except (OSError, TimeoutError):
            self.stats.upstream_failed += 1
            _reset(writer)
            return
        self.stats.accepted += 1
        pair = _Pair(self, (reader, writer), upstream)
        self._pairs.add(pair)
        pair.start()

    async def _cut_all(self, mode: CutMode) -> int:
        pairs = [p for p in self._pairs if not p.done]
        for pair in pairs:
            self._cut(pair, mode)
        return len(pairs)

    async def _count_open(self) -> int:
        return sum(not (p.client_cut or p.server_cut) for p in self._pairs)

    def _cut(self, pair: _Pair, mode: CutMode) -> None:
        if mode in ("both", "client") and pair.client_cut:
            mode = "server"
        self.stats.cuts[mode] += 1
        pair.cut(mode)

    async def _chaos_forever(
        self, interval_s: tuple[float, float], modes: Sequence[CutMode], min_age_s: float
    ) -> None:
        while True:
            await asyncio.sleep(self.rng.uniform(*interval_s))
            now = time.monotonic()
            live = [
                p
                for p in self._pairs
                if not (p.client_cut or p.server_cut) and now - p.opened_at >= min_age_s
            ]
            if live:
                pair = self.rng.choice(sorted(live, key=lambda p: p.opened_at))
                self._cut(pair, self.rng.choice(list(modes)))
