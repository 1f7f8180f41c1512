"""schemathesis against the live OpenAPI document: every operation, a bounded number of
generated requests each (valid and invalid ones), on SQLite and PostgreSQL. No answer is
a server error, every status is one the document declares, and every body matches it.

Every request carries ``api_fixtures.auth_headers()`` (the admin token).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from api_fixtures import SERVER_BESIDE_HYPOTHESIS, auth_headers, live_server, with_token
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings

pytestmark = SERVER_BESIDE_HYPOTHESIS

EXAMPLES_PER_OPERATION = 12  # for each generation mode: CI's run stays in tens of seconds
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def can_be_invalid(operation: dict[str, Any]) -> bool:
    """Has the operation a body or a constrained parameter? (Free text cannot be invalid.)"""
    return "requestBody" in operation or any(
        parameter.get("schema", {}).keys() - {"type", "title", "description"}
        or parameter.get("schema", {}).get("type") != "string"
        for parameter in operation.get("parameters", [])
    )


# The operations are fuzzed in this many parts, each a test of its own: a whole pass (about
# 1,150 cases) took up to two minutes under CI's load, past the suite's timeout, whose
# exception hypothesis took for the case's own failure ("inconsistent results").
PARTS = 4


@pytest.mark.parametrize("part", range(PARTS))
def test_the_api_keeps_its_openapi_promises(db_url: str, part: int) -> None:
    app = create_app(
        with_token(CoordinatorSettings(db_url=db_url, poll_timeout_s=0.05)), reconcile=False
    )
    # One connection for all, as a client would, kept open however long a case takes to
    # draw: uvicorn closes a connection idle 5 s, and a request sent on it just then fails
    # in the client, once (my reading of a CI failure under load: hypothesis's
    # "unreliable results", on PUT /pools/{name}).
    with live_server(app, keep_alive_s=600) as url, requests.Session() as session:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=auth_headers())
        cases = 0
        failures: list[str] = []
        # GET /events streams until the client hangs up: a generated call would never end
        # (its refusals are tested in test_events_stream.py).
        operations = sorted(
            (
                operation
                for operation in (result.ok() for result in schema.get_all_operations())
                if operation.path != "/events"
            ),
            key=lambda operation: operation.label,
        )
        assert len(operations) > 50  # the document's operations were all found
        for operation in operations[part::PARTS]:
            modes = [GenerationMode.POSITIVE]
            if can_be_invalid(operation.definition.raw):
                modes.append(GenerationMode.NEGATIVE)
            for mode in modes:

                @settings(
                    max_examples=EXAMPLES_PER_OPERATION,
                    phases=[Phase.explicit, Phase.generate],
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy(generation_mode=mode))
                def call(case: schemathesis.Case) -> None:
                    nonlocal cases
                    cases += 1
                    case.call_and_validate(
                        base_url=url, session=session, headers=auth_headers(), checks=CHECKS
                    )

                try:
                    call()
                except BaseException as exc:  # schemathesis raises groups of failures
                    if isinstance(exc, KeyboardInterrupt | SystemExit):
                        raise
                    failures.append(f"{operation.label} [{mode.value}]: {described(exc)}")
        print(f"schemathesis: part {part}, {cases} cases, {len(failures)} failed")
        assert not failures, "\n\n".join(failures)


def described(exc: BaseException) -> str:
    """The failure and, for a group (hypothesis's "flaky" ones among them), the failures it
    holds: what the case's first call raised is the cause to read."""
    text = "".join(traceback.format_exception(exc))
    return text if len(text) < 6000 else f"{text[:1500]}\n…\n{text[-4500:]}"


def test_the_document_offers_only_what_is_accepted(tmp_path: Path) -> None:
    """Run types a client may not create are not advertised; every error answer is
    declared with the one error body."""
    document = create_app(CoordinatorSettings(db_url=str(tmp_path / "c.db"))).openapi()
    schemas = document["components"]["schemas"]
    assert schemas["CreateRun"]["properties"]["type"]["enum"] == [
        "start_session",
        "resume_session",
        "command",
    ]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            for status in ("400", "404", "409", "413", "422", "503"):
                body = operation["responses"][status]["content"]["application/json"]
                assert body["schema"] == {"$ref": "#/components/schemas/ErrorBody"}, (
                    path,
                    method,
                    status,
                )
