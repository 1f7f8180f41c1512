"""The HTTP transport of corral's own clients between its processes (runner → coordinator,
coordinator → peer, coordinator → serverless endpoint).

Under uvloop, a connection the other end closes while it is being set up has no socket any
more, and anyio's stream then fails to read its address with ``AttributeError: 'NoneType'
object has no attribute 'getpeername'`` inside httpcore's connection setup (uvloop issue
560), before any byte of the request is sent. The chaos soak saw it end a long-poll runner:
the error is no ``httpx.TransportError``, so the runner's retry loop did not take it. Here it
is the connect failure it is (``httpx.ConnectError``), which every caller already retries —
the gateway's peer forwarding included, which may: the peer never saw the request.
"""

from __future__ import annotations

import httpx


class SetupSafeTransport(httpx.AsyncHTTPTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except AttributeError as exc:
            if "getpeername" not in str(exc):
                raise  # a bug of ours or a library's: not to be retried
            raise httpx.ConnectError(
                f"the connection closed while it was being set up ({exc})", request=request
            ) from exc
