"""Actor kinds a runner can host, read from the ``[actors.<name>]`` tables of its TOML config.

[actors.triage]
command = ["python", "examples/agent_actor.py"]   # or one string, split like a shell does
working_dir = "/srv/triage"     # default: where the runner runs
env = { MODEL = "sonnet" }      # set in the actor's process (beside the runner's allow-list)
sleep_after = 300               # idle seconds without a request before it is put to sleep
start_threshold = 30            # seconds to accept connections on PORT, else it is stopped
stop_threshold = 30             # seconds between SIGTERM and SIGKILL when it is stopped

The runner advertises the names in its Init; the coordinator places actors of those names
on it. The process gets ``PORT``, ``CORRAL_ACTOR_ID``, ``CORRAL_ACTOR_KEY``,
``CORRAL_ACTOR_GENERATION``, ``CORRAL_ACTOR_INPUT`` and ``CORRAL_ACTOR_API``
(``runner/actors.py``).
"""

from __future__ import annotations

import math
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.actors.model import NAME_PATTERN
from corral.errors import InvalidRequest

_FIELDS = {"command", "working_dir", "env", "sleep_after", "start_threshold", "stop_threshold"}


@dataclass(frozen=True)
class ActorKind:
    name: str
    command: tuple[str, ...]
    working_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    sleep_after_s: float | None = None  # None: never put to sleep for idleness
    start_threshold_s: float = 30.0
    stop_threshold_s: float = 30.0


def load_kinds(path: Path | None) -> dict[str, ActorKind]:
    """The ``[actors.*]`` tables of the config file; none if there is no file."""
    if path is None or not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidRequest(f"cannot read config {path}: {exc}") from exc
    actors = data.get("actors", {})
    if not isinstance(actors, dict):
        raise InvalidRequest(f"{path}: [actors] must be a table")
    return {name: _parse_kind(path, name, table) for name, table in actors.items()}


def _seconds(where: str, table: dict[str, Any], key: str, default: float | None) -> float | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{where}: {key} must be a number of seconds")
    if value <= 0:
        raise InvalidRequest(f"{where}: {key} must be above 0")
    return float(value)


def _parse_kind(path: Path, name: str, table: Any) -> ActorKind:
    where = f"{path}: [actors.{name}]"
    if not NAME_PATTERN.match(name):
        raise InvalidRequest(f"{where}: a name is letters, digits, '.', '_' and '-'")
    if not isinstance(table, dict):
        raise InvalidRequest(f"{where} must be a table")
    if unknown := set(table) - _FIELDS:
        raise InvalidRequest(f"{where}: unknown keys {sorted(unknown)}")
    command = table.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise InvalidRequest(f"{where}: command must be a string or a list of strings")
    working_dir = table.get("working_dir")
    if working_dir is not None and not isinstance(working_dir, str):
        raise InvalidRequest(f"{where}: working_dir must be a string")
    if working_dir is not None:
        working_dir = str((path.parent / working_dir).resolve())
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise InvalidRequest(f"{where}: env must be a table of strings")
    start = _seconds(where, table, "start_threshold", 30.0)
    stop = _seconds(where, table, "stop_threshold", 30.0)
    assert start is not None and stop is not None
    return ActorKind(
        name=name,
        command=tuple(command),
        working_dir=working_dir,
        env=dict(env),
        sleep_after_s=_seconds(where, table, "sleep_after", None),
        start_threshold_s=start,
        stop_threshold_s=stop,
    )
