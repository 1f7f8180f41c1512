"""Wake-ups from the other coordinators on the same PostgreSQL database.

One connection per coordinator ``LISTEN``s on its schema's channel; the triggers of
``corral.store.wakeups`` send the notifier topic of every change another process commits,
and the listener notifies it here, as if the change had been made in this process.

A notification sent while the listener was not connected (PostgreSQL restarted, the link
broke) is lost: so after every connect the listener asks for a bounded re-scan, not a
polling loop (``rescan``; by default ``Notifier.notify_all``: every waiter looks at the
store again, once). The coordinator's (``Coordinator.rescan``) wakes its runner sockets
only where one read of their runners' rows shows something they have not passed on: woken
all at once, 10,000 sockets each claimed and read their runner's row together. The
connection sends TCP keepalives, so a link that died silently is noticed within seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import sql

from corral.backoff import backoff_delay
from corral.coordinator.notifier import Notifier
from corral.store.wakeups import channel

log = logging.getLogger("corral.coordinator")


class Listener:
    def __init__(
        self,
        url: str,
        node: str,
        notifier: Notifier,
        rescan: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.url = url
        self.node = node  # our own writes' name: their notifications were handled here
        self.notifier = notifier
        self.rescan = rescan or self._wake_all
        self._rescanning: asyncio.Task[None] | None = None
        self.connects = 0  # how many times it has connected (and re-scanned)
        self.listening = asyncio.Event()  # set while connected
        self.application_name = f"corral listener {node}"  # its name in pg_stat_activity

    async def run_forever(self) -> None:
        failures = 0  # connects failed in a row
        try:
            while True:
                connects = self.connects
                try:
                    await self._listen()
                except (psycopg.OperationalError, OSError) as exc:
                    log.warning("wake-up listener disconnected: %s", exc)
                self.listening.clear()
                failures = 0 if self.connects > connects else failures + 1
                await asyncio.sleep(backoff_delay(failures, base=0.1, cap=2.0))
        finally:
            if self._rescanning is not None:
                self._rescanning.cancel()

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=5,
            application_name=self.application_name,
            # A silent link is declared dead after idle + interval·count seconds.
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
        ) as conn:
            cursor = await conn.execute("SELECT current_schema()")
            row = await cursor.fetchone()
            assert row is not None
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(row[0]))))
            self.connects += 1
            self.listening.set()
            # Whatever was sent while nobody listened is looked for again, beside the
            # notifications that come from now on.
            self._rescanning = asyncio.create_task(self._rescan())
            async for note in conn.notifies():
                origin, _, topic = note.payload.partition(" ")
                if origin != self.node:
                    self.notifier.notify(topic)

    async def _rescan(self) -> None:
        try:
            await self.rescan()
        except Exception:  # the database went away again: the next connect re-scans
            log.exception("re-scan after the listener connected failed")

    async def _wake_all(self) -> None:
        self.notifier.notify_all()
