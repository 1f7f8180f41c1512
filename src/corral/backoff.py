"""Retry delays as pure functions: exponential, capped, with jitter drawn by the caller."""

from __future__ import annotations

import random


def backoff_delay(
    attempt: int,
    *,
    base: float = 0.5,
    cap: float = 30.0,
    jitter: float = 0.25,
    rng: random.Random | None = None,
) -> float:
    """Delay before retry number ``attempt`` (0-based): min(base·2^n, cap) plus 0–jitter of it."""
    delay = min(base * 2.0 ** min(attempt, 30), cap)
    draw: float = (rng or random).random()
    return delay * (1.0 + jitter * draw)
