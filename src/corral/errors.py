"""The one error hierarchy: every error corral raises on purpose has a stable code.

    CorralError                       code               HTTP  exit
    ├── InvalidRequest                invalid_request     422     2
    │   │                            (unstorable_value: a value the database refused)
    │   ├── MalformedJson             malformed_json      400     2
    │   ├── UnknownAgent              unknown_agent       422     2
    │   └── PayloadTooLarge           payload_too_large   413     2
    ├── NotFound                      <kind>_not_found    404     3
    ├── Conflict                      conflict            409     4
    │   ├── IllegalTransition         illegal_transition  409     4
    │   ├── LeaseLost                 lease_lost          409     4
    │   ├── SessionNotReady           session_not_ready   409     4
    │   └── Gone                      gone                410     4
    │                                (events_expired: deleted by retention)
    ├── Unavailable                   unavailable         503     5
    │   │                            (the gateway: actor_not_ready, tunnel_lost;
    │   │                             a client: outcome_unknown, a write cut after
    │   │                             it was sent, not sent to another coordinator)
    │   └── CoordinatorLeaving        coordinator_leaving 503     5
    ├── Unauthorized                  unauthorized        401     6
    │                                (invalid_token: unknown or revoked)
    └── Forbidden                     forbidden           403     7
                                     (runner_not_yours, host_not_allowed,
                                      origin_not_allowed)

The code travels on the wire as ``{"error": {"code", "message"}}`` and the CLI exits
with the error's exit status. Driver errors are translated at the edge (``raise … from``).
"""

from __future__ import annotations

from typing import Any, ClassVar


class CorralError(Exception):
    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        if code is not None:
            self.code = code  # type: ignore[misc]  # per-instance override of the class code

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return {"error": body}


class InvalidRequest(CorralError):
    code = "invalid_request"
    http_status = 422
    exit_code = 2


class MalformedJson(InvalidRequest):
    code = "malformed_json"
    http_status = 400


class UnknownAgent(InvalidRequest):
    code = "unknown_agent"


class PayloadTooLarge(InvalidRequest):
    code = "payload_too_large"
    http_status = 413


class NotFound(CorralError):
    code = "not_found"
    http_status = 404
    exit_code = 3

    @classmethod
    def of(cls, kind: str, key: str) -> NotFound:
        return cls(f"{kind} {key!r} not found", code=f"{kind}_not_found")


class Conflict(CorralError):
    code = "conflict"
    http_status = 409
    exit_code = 4


class IllegalTransition(Conflict):
    code = "illegal_transition"


class LeaseLost(Conflict):
    code = "lease_lost"


class SessionNotReady(Conflict):
    code = "session_not_ready"


class Gone(Conflict):
    """What was asked for existed, and retention has deleted it."""

    code = "gone"
    http_status = 410


class Unavailable(CorralError):
    code = "unavailable"
    http_status = 503
    exit_code = 5


class CoordinatorLeaving(Unavailable):
    """The coordinator is stopping (SIGTERM, a deploy): a runner moves to another one at
    once, keeping its runs, or tries this one again soon."""

    code = "coordinator_leaving"


class Unauthorized(CorralError):
    """No token, or one the coordinator does not know (or has revoked)."""

    code = "unauthorized"
    http_status = 401
    exit_code = 6


class Forbidden(CorralError):
    """A known token whose role may not do this, or a request from where none may come."""

    code = "forbidden"
    http_status = 403
    exit_code = 7


def from_wire(status: int, body: Any) -> CorralError:
    """Rebuild an error from a coordinator's JSON error body (used by clients)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return CorralError(f"coordinator answered HTTP {status}", code="http_error")
    code = str(error.get("code", "http_error"))
    message = str(error.get("message", f"HTTP {status}"))
    for cls in (
        UnknownAgent,
        PayloadTooLarge,
        InvalidRequest,
        IllegalTransition,
        LeaseLost,
        SessionNotReady,
        Conflict,
        CoordinatorLeaving,
        Unavailable,
    ):
        if cls.code == code:
            return cls(message)
    if status == 410:  # what was deleted, and up to where (events_expired: deleted_through)
        details = error.get("details")
        return Gone(message, code=code, **(details if isinstance(details, dict) else {}))
    if code == "runner_lost":  # a LeaseLost of its own code: the runner must register again
        return LeaseLost(message, code=code)
    if code.endswith("_not_found"):
        return NotFound(message, code=code)
    if status in (401, 403):
        return (Unauthorized if status == 401 else Forbidden)(message, code=code)
    # A code of its own (invalid_branch, budget_exceeded, …): the status says which kind,
    # so the CLI still exits with that kind's status.
    kind = _KIND_OF_STATUS.get(status, CorralError)
    return kind(message, code=code)


_KIND_OF_STATUS: dict[int, type[CorralError]] = {
    400: InvalidRequest,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    503: Unavailable,
}
