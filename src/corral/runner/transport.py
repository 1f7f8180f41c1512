"""How a runner talks to its coordinator: one interface, a long-poll and a WebSocket kind.

The runner's core owns the slots and the attempts; a transport gets runs in, carries
reports out and brings orders (cancel, abandon, drain) back. Both kinds survive the
coordinator's absence and come back without starting anything twice.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from corral.ids import RunId
from corral.runners import Held

if TYPE_CHECKING:
    from corral.runner.actors import ActorHost


class ReportSink(Protocol):
    def send(self, event: dict[str, Any]) -> asyncio.Future[None]:
        """Queue a report; the future ends when the coordinator applied (or refused) it."""
        ...


class Host(Protocol):
    """What a transport may ask of the runner's core."""

    @property
    def actors(self) -> ActorHost: ...

    @property
    def free_slots(self) -> int: ...

    def held(self) -> list[Held]: ...

    def start(self, assignment: dict[str, Any]) -> None: ...

    def cancel(self, run_id: RunId) -> None: ...

    def abandon(self, run_id: RunId) -> None: ...

    def stop_all_work(self) -> None: ...

    def drain(self, grace_s: float | None = None) -> None: ...

    async def slot_freed(self) -> None: ...

    async def port_when_started(self, actor_id: str, generation: int) -> int | None:
        """The local port of that generation of an actor this runner hosts (the tunnel's
        target), once it accepts connections (waiting while it starts); None if it has no
        such actor, or its start failed."""
        ...


class Transport(Protocol):
    kind: str  # "poll" or "websocket"

    @property
    def reports(self) -> ReportSink: ...

    async def open(self) -> None:
        """Register (retrying until the coordinator answers)."""
        ...

    async def serve(self) -> None:
        """Bring in runs and orders until cancelled."""
        ...

    def stop_claiming(self) -> None: ...

    async def close(self) -> None:
        """Say goodbye (best effort) and release the connection."""
        ...
