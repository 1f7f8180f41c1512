"""Named agent profiles, read from the ``[agents.<name>]`` tables of a TOML config.

[agents.researcher]
executor = "claude"          # which executor runs it
model = "sonnet"
allowed_tools = ["Read", "Grep", "WebSearch"]
system_prompt = "You research things carefully."
max_turns = 20
budget_usd = 2.5             # refuse further runs of a session past this cost
extra_args = []              # passed to the agent CLI as they are
env = { MY_SETTING = "1" }   # set in the agent's process (the runner's own environment
                             # is not passed on: see ``corral.runner.environment``)
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from corral.errors import InvalidRequest, UnknownAgent
from corral.runs import AgentSpec

EXECUTORS = frozenset({"claude"})
BUILTIN = {"claude": AgentSpec(name="claude", executor="claude")}
_FIELDS = {
    "executor",
    "model",
    "allowed_tools",
    "system_prompt",
    "max_turns",
    "budget_usd",
    "extra_args",
    "env",
}


def load_profiles(path: Path | None) -> dict[str, AgentSpec]:
    """The built-in ``claude`` profile plus those in the config file, if there is one."""
    profiles = dict(BUILTIN)
    if path is None or not path.exists():
        return profiles
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidRequest(f"cannot read config {path}: {exc}") from exc
    agents = data.get("agents", {})
    if not isinstance(agents, dict):
        raise InvalidRequest(f"{path}: [agents] must be a table")
    for name, table in agents.items():
        profiles[name] = _parse_profile(path, name, table)
    return profiles


def _parse_profile(path: Path, name: str, table: Any) -> AgentSpec:
    where = f"{path}: [agents.{name}]"
    if not isinstance(table, dict):
        raise InvalidRequest(f"{where} must be a table")
    unknown = set(table) - _FIELDS
    if unknown:
        raise InvalidRequest(f"{where}: unknown keys {sorted(unknown)}")
    for key in ("model", "system_prompt"):
        if key in table and not isinstance(table[key], str):
            raise InvalidRequest(f"{where}: {key} must be a string")
    for key in ("allowed_tools", "extra_args"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidRequest(f"{where}: {key} must be a list of strings")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise InvalidRequest(f"{where}: env must be a table of strings")
    for key, types, kind in (
        ("max_turns", int, "an integer"),
        ("budget_usd", int | float, "a number"),
    ):
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise InvalidRequest(f"{where}: {key} must be {kind}")
    executor = table.get("executor", "claude")
    if executor not in EXECUTORS:
        raise InvalidRequest(f"{where}: unknown executor {executor!r}")
    try:
        return AgentSpec.from_dict({"name": name, **table, "executor": executor})
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{where}: {exc}") from exc


def resolve(profiles: dict[str, AgentSpec], name: str | None) -> AgentSpec:
    key = name or "claude"
    try:
        return profiles[key]
    except KeyError:
        raise UnknownAgent(
            f"unknown agent {key!r}; known agents: {', '.join(sorted(profiles))}"
        ) from None
