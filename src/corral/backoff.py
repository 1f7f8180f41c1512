"""Retry delays as pure functions: exponential, capped, with jitter drawn by the caller."""

from __future__ import annotations

import random

# Draws of the callers that pass no ``rng``: a generator of this module's own, not the
# process-wide one, so that a retry loop in a background thread leaves the global state alone
# (a property test's generator notices any change of it as misuse, and fails).
_DRAWS = random.Random()


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
    draw: float = (rng or _DRAWS).random()
    return delay * (1.0 + jitter * draw)
