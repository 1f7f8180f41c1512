"""A connection closed while httpcore sets it up (uvloop's closed transport makes anyio fail
with AttributeError before the request is sent) is a connect failure, which callers retry;
any other AttributeError is not hidden."""

from __future__ import annotations

import httpcore
import httpx
import pytest

from corral.http_transport import SetupSafeTransport

pytestmark = pytest.mark.anyio
REQUEST = httpx.Request("GET", "http://127.0.0.1:9/runner/runs")


class Pool:
    """In place of httpcore's connection pool: fails with ``error``, or answers 204."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        if self.error is not None:
            raise self.error
        return httpcore.Response(204)


def transport(pool: Pool) -> SetupSafeTransport:
    made = SetupSafeTransport()
    made._pool = pool  # type: ignore[assignment]
    return made


async def test_a_connection_closed_during_its_setup_is_a_connect_error() -> None:
    error = AttributeError("'NoneType' object has no attribute 'getpeername'")
    with pytest.raises(httpx.ConnectError, match="closed while it was being set up"):
        await transport(Pool(error)).handle_async_request(REQUEST)


async def test_any_other_attribute_error_is_raised_as_it_is() -> None:
    error = AttributeError("'Run' object has no attribute 'oops'")
    with pytest.raises(AttributeError, match="oops"):
        await transport(Pool(error)).handle_async_request(REQUEST)


async def test_an_answer_passes_through() -> None:
    assert (await transport(Pool()).handle_async_request(REQUEST)).status_code == 204
