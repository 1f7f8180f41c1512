"""The executor interface: build a process for a run, read its output, judge how it ended.

An executor is pure: it never spawns or reads a process itself. The runner's supervisor
spawns ``ProcessSpec``, feeds every stdout line to the ``OutputObserver`` and asks it for
the ``RunReport`` when the process has exited (or was stopped).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from corral.assignment import Assignment
from corral.runs import RunReport


@dataclass(frozen=True)
class ProcessSpec:
    argv: tuple[str, ...]
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the complete environment
    # Seconds to wait for the process to exit on its own once its final result was seen.
    exit_grace_after_result_s: float | None = None


class StopReason(enum.StrEnum):
    """Why the supervisor stopped a process before it exited on its own."""

    TIMEOUT = "timeout"
    IDLE_TIMEOUT = "idle_timeout"
    CANCELLED = "cancelled"
    LINGERED_AFTER_RESULT = "lingered_after_result"
    RUNNER_SHUTDOWN = "runner_shutdown"


@dataclass(frozen=True)
class SessionSeen:
    session_id: str


@dataclass(frozen=True)
class ResultSeen:
    """The final result line arrived; the process should exit shortly."""


Observation = SessionSeen | ResultSeen


class OutputObserver(Protocol):
    def feed(self, line: str) -> list[Observation]:
        """Take one stdout line (without its newline); say what it revealed."""
        ...

    def outcome(self, exit_code: int | None, stopped: StopReason | None) -> RunReport:
        """How the attempt ended, once the process is gone."""
        ...


class Executor(Protocol):
    # Names (``fnmatch`` patterns) this executor needs from the runner's own environment
    # (an agent CLI's API key): given to its runs only, see ``corral.runner.environment``.
    host_env: tuple[str, ...]
    # What to tell a user whose runner cannot find the program (how to point at it).
    missing_program_hint: str

    def prepare(self, run: Assignment, base_env: dict[str, str]) -> ProcessSpec:
        """``base_env``: what the run may see of the runner's environment; the executor
        adds the agent profile's and the run's ``env``."""
        ...

    def observer(self, run: Assignment) -> OutputObserver: ...
