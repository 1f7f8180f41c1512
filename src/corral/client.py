"""A small Python client of the coordinator's REST API (the CLI is built on it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from corral import errors
from corral.credentials import auth_headers, client_token

DEFAULT_URL = "http://127.0.0.1:8765"


class CorralClient:
    def __init__(
        self, url: str = DEFAULT_URL, *, token: str | None = None, timeout_s: float = 30.0
    ) -> None:
        """``token``: the bearer token to send (default: ``.corral/credentials`` in the
        current directory, where a local coordinator writes its own)."""
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, headers=auth_headers(client_token(token)), timeout=timeout_s
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CorralClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Any endpoint: the decoded JSON answer, or the coordinator's error raised."""
        return self._call(method, path, **kwargs)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise errors.Unavailable(f"cannot reach the coordinator at {self.url}: {exc}") from exc
        return _decode(response)

    # ---- runs ----------------------------------------------------------------------------

    def create_run(self, **fields: Any) -> dict[str, Any]:
        body = {k: v for k, v in fields.items() if v is not None}
        result: dict[str, Any] = self._call("POST", "/runs", json=body)
        return result

    def create_runs(self, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("POST", "/runs:batch", json={"runs": runs})[
            "runs"
        ]
        return result

    def get_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/runs/{run_id}")
        return result

    def list_runs(self, **filters: Any) -> dict[str, Any]:
        params = {k: v for k, v in filters.items() if v is not None}
        result: dict[str, Any] = self._call("GET", "/runs", params=params)
        return result

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/runs/{run_id}/cancel")
        return result

    def logs(self, run_id: str, after: int = 0) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/runs/{run_id}/logs", params={"after": after})
        return result

    def follow_logs(self, run_id: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """Yield ``{"event": "line", …}`` items as they come, then ``{"event": "end", run}``."""
        params: dict[str, Any] = {"after": after, "follow": "true"}
        try:
            with self._http.stream(
                "GET", f"/runs/{run_id}/logs", params=params, timeout=None
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _decode(response)
                for line in response.iter_lines():
                    if line:
                        yield json.loads(line)
        except httpx.TransportError as exc:
            raise errors.Unavailable(f"lost the coordinator at {self.url}: {exc}") from exc

    # ---- sessions and runners ------------------------------------------------------------

    def session_result(self, session: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/sessions/{session}/result")
        return result

    def runners(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/runners")["runners"]
        return result


def _decode(response: httpx.Response) -> Any:
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise errors.from_wire(response.status_code, body)
    return body
