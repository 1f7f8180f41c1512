"""The runner's replay buffer: events numbered per runner, kept until the coordinator
acknowledges them, and replayed on every reconnect (seed 000, "resendUnacknowledgedEvents").

    append ──▶ [idx 1 · 2 · 3 · 4]  ──acknowledge(2)──▶ [3 · 4] ──replay──▶ ToServerEvents
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from typing import Any

from corral.protocol.limits import MAX_BATCH_BYTES, MAX_BATCH_EVENTS
from corral.protocol.messages import Indexed, ToServerEvents

_INDEXED_OVERHEAD = 32  # {"idx":…,"body":…}, around each body


class ReplayBuffer:
    def __init__(
        self, *, max_batch: int = MAX_BATCH_EVENTS, max_batch_bytes: int = MAX_BATCH_BYTES
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._next_idx = 1
        self._pending: deque[Indexed] = deque()  # in idx order
        self._sizes: dict[int, int] = {}  # encoded size of each pending event, by idx

    @property
    def pending(self) -> tuple[Indexed, ...]:
        return tuple(self._pending)

    def append(self, bodies: Iterable[dict[str, Any]]) -> list[Indexed]:
        """Number ``bodies`` in order; all or none (a bad body raises and changes nothing)."""
        bodies = list(bodies)
        for body in bodies:
            # Checked here, not at the coordinator: a bad event would be replayed forever.
            if not isinstance(body, dict) or not isinstance(body.get("type"), str):
                raise ValueError(f"an event body needs a string 'type': {body!r}")
        # Encoded once, here: for its size, and as its frame will carry it (``encode``). A
        # body that is not JSON (NaN, an object) raises here too, before anything changed.
        encoded = [json.dumps(body, separators=(",", ":"), allow_nan=False) for body in bodies]
        events = [
            Indexed(self._next_idx + i, body, text)
            for i, (body, text) in enumerate(zip(bodies, encoded, strict=True))
        ]
        self._next_idx += len(events)
        self._pending.extend(events)
        for event, text in zip(events, encoded, strict=True):
            self._sizes[event.idx] = len(text) + _INDEXED_OVERHEAD
        return events

    def acknowledge(self, last_idx: int) -> None:
        while self._pending and self._pending[0].idx <= last_idx:
            del self._sizes[self._pending.popleft().idx]

    def skip_past(self, applied_idx: int) -> None:
        """Never number a new event at or below what the coordinator has applied: it would
        drop the event as a duplicate of an old one."""
        self._next_idx = max(self._next_idx, applied_idx + 1)

    def reset(self) -> None:
        """A new identity: forget every event and number from 1 again."""
        self._pending.clear()
        self._sizes.clear()
        self._next_idx = 1

    def frames(self, events: Iterable[Indexed] | None = None) -> list[ToServerEvents]:
        """``events`` (default: all pending) as messages of at most ``max_batch`` events and
        ``max_batch_bytes`` (one event at least), so that neither a long disconnection nor a
        busy run makes a frame larger than the coordinator accepts."""
        frames: list[ToServerEvents] = []
        frame: list[Indexed] = []
        size = 0
        for event in self._pending if events is None else events:
            event_size = self._sizes.get(event.idx, 0)
            if frame and (
                len(frame) >= self._max_batch or size + event_size > self._max_batch_bytes
            ):
                frames.append(ToServerEvents(tuple(frame)))
                frame, size = [], 0
            frame.append(event)
            size += event_size
        if frame:
            frames.append(ToServerEvents(tuple(frame)))
        return frames
