"""The runner sockets one coordinator process holds, and what the rest of it may ask of one.

Imports run one way: the socket pump (``socket.py``) knows the coordinator
(``service.py``), which knows this registry and the ``LiveLink`` protocol — never the pump.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from corral.protocol import messages as wire
    from corral.store.runners import Head


class LiveLink(Protocol):
    """A runner's open socket, as the coordinator reaches it from outside its pump."""

    @property
    def seq(self) -> int:
        """Sockets in the order they opened: of two of the same runner, the newer wins."""
        ...

    @property
    def token_id(self) -> str | None:
        """The token the socket was opened with."""
        ...

    @property
    def runner_id(self) -> str | None:
        """The runner it registered as (None before)."""
        ...

    @property
    def closed(self) -> asyncio.Event:
        """Set once the socket is closed."""
        ...

    def behind(self, head: Head) -> bool:
        """Its runner's row holds something the socket has not passed on (commands, a
        state other than active): after a lost notification it must look again."""
        ...

    async def drain(self, grace_s: float) -> None:
        """No new work; ask the runner to finish within ``grace_s`` and leave."""

    async def stop(self) -> None:
        """Tell the runner it is stopped (it must not reconnect), and close."""

    async def evict(self) -> None:
        """A newer socket of the runner took over: tell this one not to reconnect."""

    async def leave(self) -> None:
        """This coordinator stops: tell the runner to move to another at once, and close."""

    async def close(self, code: int, reason: str) -> None:
        """Close the socket at once."""

    async def send_message(self, message: wire.ToClientMessage) -> None:
        """Send one message outside the protocol session's own (the tunnel's)."""

    async def protocol_error(self, error: wire.ProtocolError) -> None:
        """The runner broke the protocol (the tunnel found a gap): close as the session does."""


class Connections:
    """The runner sockets this coordinator process holds, by runner id."""

    def __init__(self) -> None:
        self.by_runner: dict[str, LiveLink] = {}
        # Runners that pinged since the last heartbeat write (in order: the simulation replays).
        self._pinged: dict[str, None] = {}
        self.open = 0  # sockets being served, registered or not (none may outlive its peer)
        self._accepted = itertools.count(1)

    def accepted(self) -> int:
        """A socket opened: its ``seq``."""
        return next(self._accepted)

    def take_over(self, runner_id: str, link: LiveLink) -> LiveLink | None:
        """``link`` registered as ``runner_id``: it becomes the runner's socket, unless a
        newer one registered while it waited on the store. Returns the socket to evict:
        the one it replaced, or ``link`` itself when it is the stale one (the runner has
        left it, and it must not evict the newer)."""
        previous = self.by_runner.get(runner_id)
        if previous is link:
            return None
        if previous is not None and previous.seq > link.seq:
            return link
        self.by_runner[runner_id] = link
        return previous

    def forget(self, runner_id: str | None, link: LiveLink) -> bool:
        """``link`` closed: True if it was the runner's socket (now it has none)."""
        if runner_id is None or self.by_runner.get(runner_id) is not link:
            return False
        del self.by_runner[runner_id]
        return True

    def note_ping(self, runner_id: str) -> None:
        self._pinged[runner_id] = None

    def take_pinged(self) -> list[str]:
        pinged, self._pinged = list(self._pinged), {}
        return pinged

    def not_written(self, pinged: list[str]) -> None:
        """Pings taken whose write failed: taken again with the next."""
        self._pinged = {**dict.fromkeys(pinged), **self._pinged}
