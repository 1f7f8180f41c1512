"""Pools of runners, and serverless ones: how many runners a pool's actors want.

A serverless pool has an endpoint (``url``) that runs a runner for the life of each
``GET {url}/start`` stream the coordinator's autoscaler opens (seed 002). The actors
placed in the pool and those queued for it are the slots it wants; from them:

    desired runners = clamp(ceil(slots / slots_per_runner) + margin, min_runners, max_runners)
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

MAX_RUNNERS = 1000
MAX_LIFESPAN_S = 24 * 3600.0


class PoolError(enum.StrEnum):
    """What went wrong with a pool's endpoint, as ``GET /pools/{name}`` shows it."""

    HTTP_ERROR = "http_error"  # refused the stream (not 200), or could not be reached
    STREAM_ENDED_EARLY = "stream_ended_early"  # closed before its lifespan, unasked
    BAD_PAYLOAD = "bad_payload"  # its first event did not name the runner


@dataclass(frozen=True)
class Serverless:
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    request_lifespan_s: float = 300.0  # how long one /start stream may last
    slots_per_runner: int = 1
    min_runners: int = 0
    max_runners: int = 10
    margin: int = 0  # runners kept beyond what the slots need (warm capacity)


def desired_runners(slots: int, config: Serverless) -> int:
    """How many runners the pool should have for ``slots`` wanted actor slots."""
    wanted = math.ceil(max(slots, 0) / config.slots_per_runner) + config.margin
    return max(config.min_runners, min(wanted, config.max_runners))
