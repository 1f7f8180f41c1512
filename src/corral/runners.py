"""Runners: the hosts that claim and execute runs, and their lifecycle.

active ──(no heartbeat for lost_after)──▶ lost ──(heartbeat)──▶ active
active ──drain──▶ draining ──(exits)──▶ stopped
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from corral.ids import RunnerId


class RunnerState(enum.StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    LOST = "lost"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Runner:
    id: RunnerId
    name: str
    hostname: str
    labels: tuple[str, ...]
    slots: int
    version: str
    transport: str
    state: RunnerState
    registered_at: float
    last_heartbeat_at: float
    slots_used: int = 0
