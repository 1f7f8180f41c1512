"""The Python client of a coordinator: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both send the same requests (``calls.py``) and return the same typed models
(``models.py``); a refusal raises the API's error (``corral.errors``), whose ``.code`` is
the stable code of the JSON error body.
"""

from corral.client.asyncio import AsyncClient
from corral.client.calls import DEFAULT_URL
from corral.client.models import (
    Actor,
    ActorPage,
    Agent,
    AgentProfiles,
    CreatedToken,
    LogLine,
    LogPage,
    NewTask,
    PlanStatus,
    Project,
    Run,
    RunCreated,
    Runner,
    RunPage,
    Session,
    SessionResult,
    Stats,
    Task,
    TasksAdded,
    Token,
)
from corral.client.sync import Client

__all__ = [
    "DEFAULT_URL",
    "Actor",
    "ActorPage",
    "Agent",
    "AgentProfiles",
    "AsyncClient",
    "Client",
    "CreatedToken",
    "LogLine",
    "LogPage",
    "NewTask",
    "PlanStatus",
    "Project",
    "Run",
    "RunCreated",
    "RunPage",
    "Runner",
    "Session",
    "SessionResult",
    "Stats",
    "Task",
    "TasksAdded",
    "Token",
]
