"""The other coordinators on the same database, as the gateway reaches them.

A runner's socket is on one coordinator; the store records which (``runners.coordinator_url``,
written when the socket registers, so a runner that moved away from a dead coordinator is
re-owned by the next one it connects to). A gateway request for an actor whose runner is
connected elsewhere is forwarded there over HTTP, streamed both ways, and marked
(``FORWARDED_HEADER``) so that the peer never forwards it again: if the runner is not
there either (it moved meanwhile), the peer answers 503 with ``x-corral-error`` and this
coordinator looks again.

    client ──▶ A /gateway/… ──(runner on B)──▶ B /gateway/{actor_id}/… ──tunnel──▶ runner
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

# On a forwarded request: the coordinator that forwarded it (it is not forwarded again).
FORWARDED_HEADER = "x-corral-forwarded-by"
CONNECT_TIMEOUT_S = 2.0


class Peers:
    def __init__(self, own_url: str, owner: Callable[[str], Awaitable[str | None]]) -> None:
        self.own_url = own_url
        self._owner = owner  # runner id → the URL of the coordinator holding its socket
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """Made at the first forward (most coordinators never forward)."""
        if self._client is None:
            # No read timeout: an actor may take its time to answer, or stream for long.
            timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
            self._client = httpx.AsyncClient(timeout=timeout)
        return self._client

    async def holding(self, runner_id: str) -> str | None:
        """The other coordinator holding the runner's socket; None if it is this one, or
        the store knows of none (the runner is away: it may come back here)."""
        url = await self._owner(runner_id)
        return None if url is None or url == self.own_url else url

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
