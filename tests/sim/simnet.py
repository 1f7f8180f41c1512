"""The simulated network: one ``Socket`` per WebSocket connection, a queue each way.

A WebSocket is ordered and does not duplicate, so within one socket frames arrive in the
order they were sent; the scheduler only chooses *when*. What the real network can do,
the world does to sockets:

- delay: a frame waits in its queue while other steps happen;
- cut: the connection breaks; frames in flight are lost (or arrive "late", after the
  socket is dead: its pumps are gone and nobody reads them); the runner notices at once,
  the coordinator when its read loop next looks (now, a little later, or never: then its
  session's lost timer closes the link);
- duplicate: a frame delivered again (what a buggy proxy or a replay would do) — the
  state machines must drop it or close the link with a protocol error;
- close: either end closes; the other end reads what was sent before, then the close.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simcoordinator import SimPump
    from simrunner import RunnerProcess

CLOSE = "<close>"  # the closing handshake, read after the frames sent before it


@dataclass(eq=False)
class Socket:
    id: int
    runner: RunnerProcess
    link: SimPump | None = None
    up: deque[str] = field(default_factory=deque)  # runner → coordinator
    down: deque[str] = field(default_factory=deque)  # coordinator → runner
    last_up: str | None = None  # the last frame delivered each way, to duplicate
    last_down: str | None = None
    runner_done: bool = False  # the runner's end reads nothing more
    server_done: bool = False  # the coordinator's end reads nothing more
    runner_reason: str = ""  # the reason of the runner's close (1000 and this: it left)
    cut: bool = False
    notice_at: float = float("inf")  # when the coordinator's read loop sees a cut

    @property
    def name(self) -> str:
        return f"s{self.id}"

    def send_up(self, text: str) -> None:
        if not self.cut and not self.runner_done:
            self.up.append(text)

    def send_down(self, text: str) -> None:
        if not self.cut and not self.server_done:
            self.down.append(text)

    def close_from_runner(self, reason: str) -> None:
        """The runner closes: the coordinator reads what is in flight, then the close."""
        if not self.runner_done:
            self.runner_done = True
            self.runner_reason = reason
            self.down.clear()
            self.send_up_close()

    def send_up_close(self) -> None:
        if not self.cut:
            self.up.append(CLOSE)

    def close_from_server(self) -> None:
        if not self.server_done:
            self.server_done = True
            self.up.clear()
            if not self.cut and not self.runner_done:
                self.down.append(CLOSE)

    def break_off(self, rng: Any, late: list[tuple[Socket, str, str]]) -> None:
        """The connection breaks: in-flight frames are lost, a few arrive too late."""
        self.cut = True
        for direction, queue in (("up", self.up), ("down", self.down)):
            for frame in queue:
                if frame is not CLOSE and rng.random() < 0.3:
                    late.append((self, direction, frame))
            queue.clear()
