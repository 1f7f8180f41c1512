"""What an actor is to its users: ``Actor`` (as the API shows it), ``NewActor`` and the limits.

An actor has a *name* (its kind: which ``[actors.NAME]`` command a runner starts), an
optional *key* (one actor per name and key), an *input* its process reads, a crash policy
and a *pool* (the runners that may host it). Its lifecycle is ``lifecycle.Life``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from corral.actors.lifecycle import ActorState, CrashPolicy, Life
from corral.ids import ActorId

NAME_MAX_CHARS = 100
KEY_MAX_BYTES = 1024
INPUT_MAX_BYTES = 4 * 1024 * 1024
POOL_MAX_CHARS = 100
DEFAULT_POOL = "default"
# An actor name is a TOML table name and part of an environment: plain characters only.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class NewActor:
    name: str
    key: str | None = None
    input: str | None = None
    pool: str = DEFAULT_POOL
    crash_policy: CrashPolicy = CrashPolicy.SLEEP


@dataclass(frozen=True)
class Placement:
    """Where an actor runs now: the single truth that fences commands, events and KV."""

    actor_id: ActorId
    runner_id: str
    generation: int


@dataclass(frozen=True)
class Actor:
    id: ActorId
    name: str
    key: str | None
    input: str | None
    pool: str
    created_at: float
    life: Life = field(repr=False)

    @property
    def state(self) -> ActorState:
        return self.life.state

    @property
    def generation(self) -> int:
        return self.life.generation

    @property
    def runner_id(self) -> str | None:
        return self.life.runner_id

    @property
    def crash_policy(self) -> CrashPolicy:
        return self.life.crash_policy

    @property
    def placement(self) -> Placement | None:
        """Where to reach it: only once it is connectable."""
        if not self.life.connectable or self.life.runner_id is None:
            return None
        return Placement(self.id, self.life.runner_id, self.life.generation)
