"""Runners: the hosts that claim and execute runs, and the one table of their states.

    (registers) ──▶ active ──drain──▶ draining ──(leaves, or is stopped)──▶ stopped
    active ──stop──▶ stopped          lost ──stop──▶ stopped
    active | draining ──(no heartbeat for lost_after)──▶ lost
    draining ──(registers again)──▶ active
    lost | stopped ──(registers again, over HTTP)──▶ active

A lost runner's heartbeat is refused (runner_lost): it must register again. Over the
WebSocket link a lost or stopped one comes back as a new runner instead (its old id's
commands are void), and a drain asked of it stays asked when it registers again (it is
told on its new socket, whichever coordinator holds it).
Draining a runner that is lost or stopped leaves it so: it is gone, there is nothing to
drain. Any other move not in ``TRANSITIONS`` raises ``IllegalTransition``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from corral.errors import IllegalTransition
from corral.ids import RunId, RunnerId


class RunnerState(enum.StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    LOST = "lost"
    STOPPED = "stopped"


R = RunnerState
TRANSITIONS: dict[RunnerState, frozenset[RunnerState]] = {
    R.ACTIVE: frozenset({R.DRAINING, R.STOPPED, R.LOST}),
    R.DRAINING: frozenset({R.STOPPED, R.LOST, R.ACTIVE}),
    R.LOST: frozenset({R.STOPPED, R.ACTIVE}),
    R.STOPPED: frozenset({R.ACTIVE}),
}
del R

# The states in which a runner may still run work: its heartbeats count, and its silence
# makes it lost (active, draining).
ALIVE = frozenset(state for state, targets in TRANSITIONS.items() if RunnerState.LOST in targets)


def check_runner_transition(runner_id: str, old: RunnerState, new: RunnerState) -> None:
    if new is not old and new not in TRANSITIONS[old]:
        raise IllegalTransition(
            f"runner {runner_id} cannot go from {old} to {new}", status=str(old)
        )


def state_after(runner_id: str, old: RunnerState, asked: RunnerState) -> RunnerState:
    """The state a runner in ``old`` is left in when asked to be ``asked`` (drained,
    stopped): ``asked``, or ``old`` for a drain of a runner that is already gone."""
    if asked is RunnerState.DRAINING and old not in ALIVE:
        return old
    check_runner_transition(runner_id, old, asked)
    return asked


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
    # The coordinator its WebSocket registered with last (its URL); None over HTTP.
    coordinator_url: str | None = None


@dataclass(frozen=True)
class Held:
    """A run a runner says it is working on."""

    run_id: RunId
    attempt: int


@dataclass(frozen=True)
class RunnerSync:
    """What a runner must do after telling the store what it holds."""

    abandon: list[RunId] = field(default_factory=list)  # no longer yours: stop it, report nothing


# What a runner may say about itself, the same through ``POST /runner/register`` and a
# WebSocket Init: it is stored, listed by ``GET /runners`` and written into logs.
NAME_MAX_CHARS = 200
HOSTNAME_MAX_CHARS = 255
VERSION_MAX_CHARS = 64
LABEL_MAX_CHARS = 200
MAX_LABELS = 64
MAX_SLOTS = 1024
RUNNER_ID_MAX_CHARS = 64
METADATA_MAX_BYTES = 4096
# One line of text: no control characters (newlines above all), no line separators, no
# lone surrogates (they cannot be read back as UTF-8).
_NOT_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def text_problem(value: str, max_chars: int, *, required: bool = False) -> str | None:
    """Why ``value`` is not a runner's name, hostname, label … (None if it is)."""
    if required and not value:
        return "must not be empty"
    if len(value) > max_chars:
        return f"is {len(value)} characters; at most {max_chars}"
    if _NOT_ONE_LINE.search(value):
        return "must be one line of printable text"
    return None
