"""Request bodies of the seed system's runner (claude-agent-orchestrator's agent-runner),
as it sends them; ``compat_ao`` translates them into corral's operations."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from corral import runners
from corral.coordinator.schemas import RegisterRunner, ReportBody, one_line
from corral.wire import WireModel


class AoRegister(WireModel):
    """``POST /runner/register``: the runner's identity is (hostname, project_dir,
    executor_profile, executor command); tags are the capabilities it offers."""

    hostname: str = Field(min_length=1, max_length=255)
    project_dir: str = Field(max_length=4096)
    executor_profile: str = Field(min_length=1, max_length=200)
    executor: dict[str, Any] | None = None
    tags: list[Annotated[str, Field(max_length=runners.LABEL_MAX_CHARS)]] | None = Field(
        None, max_length=runners.MAX_LABELS
    )
    require_matching_tags: bool = False
    agents: list[dict[str, Any]] | None = None

    # They become the corral runner's name and labels: the same limits (found by
    # tests/integration/test_openapi_fuzz.py: a hostname with a control character was a 500).
    @field_validator("hostname", "executor_profile", "tags")
    @classmethod
    def _one_line(cls, value: str | list[str] | None) -> str | list[str] | None:
        return one_line(value)


class AoCompleted(WireModel):
    """``POST /runner/runs/{id}/completed``: no result (it came as a ``result`` event)."""

    runner_id: str
    status: Literal["success"]
    session_status: Literal["idle", "finished"] | None = None


class AoStopped(WireModel):
    runner_id: str
    signal: str = Field("SIGTERM", max_length=32)


class AoSessionStatus(WireModel):
    runner_id: str
    status: Literal["finished", "failed", "stopped"]


class AoBind(WireModel):
    """``POST /sessions/{id}/bind``, as the runner's gateway forwards it."""

    executor_session_id: str = Field(min_length=1, max_length=200)
    hostname: str = Field(max_length=255)
    executor_profile: str = Field(max_length=200)
    project_dir: str | None = Field(None, max_length=4096)


class AoEvent(WireModel):
    """``POST /sessions/{id}/events``; the system's event kinds carry many more fields
    (messages, tool calls), which corral does not keep."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    event_type: str = Field(max_length=64)
    session_id: str
    timestamp: str | None = None
    result_text: str | None = None
    result_data: dict[str, Any] | None = None


class AoMetadata(WireModel):
    """``PATCH /sessions/{id}/metadata``."""

    project_dir: str | None = Field(None, max_length=4096)
    agent_name: str | None = Field(None, max_length=200)
    last_resumed_at: str | None = None
    executor_session_id: str | None = Field(None, min_length=1, max_length=200)
    executor_profile: str | None = None
    hostname: str | None = None


class AoTokenRequest(WireModel):
    """``POST /oauth/token``: the client-credentials request its runner sends to Auth0."""

    grant_type: Literal["client_credentials"]
    client_id: str = Field(max_length=200)
    client_secret: str = Field(min_length=1, max_length=512)
    audience: str | None = Field(None, max_length=500)


class AoTokenRefusal(BaseModel):
    """An OAuth error body (RFC 6749 §5.2), the shape its runner reads a refusal in."""

    error: Literal["access_denied"]
    error_description: str


# One endpoint, two wires: the body says which (corral's register has a ``name``; that
# system's completion a ``status: "success"``), so a bad body is told about its own fields.
def _register_wire(body: Any) -> str:
    if isinstance(body, dict) and "name" not in body and "executor_profile" in body:
        return "ao"
    return "corral"


def _completed_wire(body: Any) -> str:
    return "ao" if isinstance(body, dict) and body.get("status") == "success" else "corral"


RegisterBody = Annotated[
    Annotated[RegisterRunner, Tag("corral")] | Annotated[AoRegister, Tag("ao")],
    Discriminator(_register_wire),
]
CompletedBody = Annotated[
    Annotated[ReportBody, Tag("corral")] | Annotated[AoCompleted, Tag("ao")],
    Discriminator(_completed_wire),
]
