"""The runner sockets one coordinator process holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.coordinator.socket import SocketLink


class Connections:
    """The runner sockets this coordinator process holds, by runner id."""

    def __init__(self) -> None:
        self.by_runner: dict[str, SocketLink] = {}
        self.pinged: set[str] = set()  # runners that pinged since the last heartbeat write
        self.open = 0  # sockets being served, registered or not (none may outlive its peer)

    def take_pinged(self) -> list[str]:
        pinged, self.pinged = list(self.pinged), set()
        return pinged
