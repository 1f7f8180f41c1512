"""Errors rebuilt from the wire keep their code and their kind (so the CLI's exit status)."""

from __future__ import annotations

import pytest

from corral.errors import (
    Conflict,
    CorralError,
    InvalidRequest,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    from_wire,
)


def body(code: str) -> dict[str, object]:
    return {"error": {"code": code, "message": f"a {code}"}}


@pytest.mark.parametrize(
    ("status", "code", "kind", "exit_code"),
    [
        (422, "invalid_request", InvalidRequest, 2),
        (422, "invalid_branch", InvalidRequest, 2),
        (422, "unstorable_value", InvalidRequest, 2),
        (422, "plan_too_large", InvalidRequest, 2),
        (400, "malformed_json", InvalidRequest, 2),
        (413, "payload_too_large", PayloadTooLarge, 2),
        (409, "budget_exceeded", Conflict, 4),
        (409, "lease_lost", LeaseLost, 4),
        (404, "run_not_found", NotFound, 3),
        (503, "database_down", Unavailable, 5),
        (500, "internal", CorralError, 1),
    ],
)
def test_a_code_keeps_its_kind(
    status: int, code: str, kind: type[CorralError], exit_code: int
) -> None:
    error = from_wire(status, body(code))
    assert type(error) is kind
    assert (error.code, error.message, error.exit_code) == (code, f"a {code}", exit_code)


def test_a_body_without_an_error_is_an_http_error() -> None:
    error = from_wire(502, "<html>bad gateway</html>")
    assert (error.code, error.exit_code) == ("http_error", 1)
