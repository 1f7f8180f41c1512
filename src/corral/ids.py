"""Typed identifiers, so a run id can never be passed where a runner id is expected."""

from __future__ import annotations

import secrets
from typing import NewType

RunId = NewType("RunId", str)
RunnerId = NewType("RunnerId", str)
ActorId = NewType("ActorId", str)


def _new(prefix: str, nbytes: int = 6) -> str:
    return f"{prefix}_{secrets.token_hex(nbytes)}"


def new_run_id() -> RunId:
    return RunId(_new("run"))


def new_runner_id() -> RunnerId:
    return RunnerId(_new("rnr"))


def new_actor_id() -> ActorId:
    return ActorId(_new("act"))


def new_project_id() -> str:
    return _new("prj")


def new_task_id() -> str:
    return _new("tsk")


def new_token_id() -> str:
    return _new("tok")


def new_coordinator_id() -> str:
    """A coordinator process's own id (the autoscaler holds pool leases under it)."""
    return _new("crd")


def new_request_id() -> str:
    """A request through a runner's tunnel."""
    return _new("req", 8)
