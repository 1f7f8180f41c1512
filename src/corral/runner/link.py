"""The runner's link to the coordinator over the seed's HTTP long-poll protocol.

Transport failures (refused, reset, 5xx) raise ``LinkDown``: the caller retries with
backoff, forever. Answers the coordinator gives on purpose (4xx) raise the matching
``CorralError`` (``LeaseLost``, ``NotFound`` …) and are never retried.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import httpx

from corral import errors
from corral.credentials import auth_headers
from corral.http_transport import SetupSafeTransport
from corral.ids import RunId, RunnerId
from corral.protocol.messages import Indexed
from corral.runner.coordinators import Coordinators, Resolve, resolve_host
from corral.runners import Held


class LinkDown(Exception):
    """The coordinator could not be reached, or failed; try again later."""


class Leaving(LinkDown):
    """The coordinator said it is stopping (``coordinator_leaving``): the next call goes
    to the next coordinator, and may go at once."""


@dataclass(frozen=True)
class Registration:
    runner_id: RunnerId
    heartbeat_interval_s: float
    poll_timeout_s: float
    abandon: list[RunId]
    # After this long without hearing from the runner, the coordinator declares it lost
    # (None: an older coordinator that does not say).
    lost_after_s: float | None = None


class HttpLink:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        client: httpx.AsyncClient | None = None,
        resolve: Resolve = resolve_host,
        rng: random.Random | None = None,
    ) -> None:
        """``base_url``: one coordinator, or several separated by commas, a name possibly
        standing for several (``corral.runner.coordinators``): after a call that failed on
        one (``LinkDown``), the next call goes to the next."""
        self._coordinators = Coordinators(
            [url.strip() for url in base_url.split(",") if url.strip()], resolve=resolve, rng=rng
        )
        self._client = client or httpx.AsyncClient(
            headers=auth_headers(token),
            timeout=httpx.Timeout(30.0, connect=5.0),
            transport=SetupSafeTransport(
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16)
            ),
        )

    @property
    def coordinators(self) -> int:
        return len(self._coordinators)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        called = await self._coordinators.current()
        url = httpx.URL(called.url.rstrip("/") + path)
        headers: dict[str, str] = {}
        extensions: dict[str, Any] = {}
        if called.address is not None:
            # To that address, the request still names the coordinator: its Host header,
            # and for https the TLS server name, which the certificate is checked against.
            headers["Host"] = url.netloc.decode("ascii")
            extensions["sni_hostname"] = url.host
            url = url.copy_with(host=called.address)
        try:
            response = await self._client.request(
                method,
                url,
                json=json,
                params=params,
                headers=headers,
                extensions=extensions,
                timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
            )
        except httpx.TransportError as exc:
            self._coordinators.move_on(called)
            raise LinkDown(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code >= 500:
            self._coordinators.move_on(called)
            if _error_code(response) == errors.CoordinatorLeaving.code:
                raise Leaving(f"{method} {path}: coordinator {called} is stopping")
            raise LinkDown(f"{method} {path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise errors.from_wire(response.status_code, _json(response))
        return response

    async def register(
        self,
        *,
        name: str,
        hostname: str,
        labels: list[str],
        slots: int,
        version: str,
        runner_id: RunnerId | None,
        held: list[Held],
    ) -> Registration:
        body = {
            "name": name,
            "hostname": hostname,
            "labels": labels,
            "slots": slots,
            "version": version,
            "transport": "poll",
            "runner_id": runner_id,
            "held": [{"run_id": h.run_id, "attempt": h.attempt} for h in held],
        }
        data = (await self._call("POST", "/runner/register", json=body)).json()
        return Registration(
            runner_id=RunnerId(data["runner_id"]),
            heartbeat_interval_s=float(data["heartbeat_interval_s"]),
            poll_timeout_s=float(data["poll_timeout_s"]),
            abandon=[RunId(r) for r in data["abandon"]],
            lost_after_s=None if data.get("lost_after_s") is None else float(data["lost_after_s"]),
        )

    async def agent_token(self, runner_id: RunnerId, run_id: RunId, attempt: int) -> str:
        """A token minted for the agent of this attempt (``corral.coordinator.scope``)."""
        body = {"runner_id": runner_id, "attempt": attempt}
        response = await self._call("POST", f"/runner/runs/{run_id}/agent-token", json=body)
        token: str = response.json()["token"]
        return token

    async def poll(
        self, runner_id: RunnerId, max_runs: int, timeout_s: float
    ) -> list[dict[str, Any]]:
        response = await self._call(
            "GET",
            "/runner/runs",
            params={"runner_id": runner_id, "max_runs": max_runs, "timeout": timeout_s},
            timeout=timeout_s + 15.0,
        )
        if response.status_code == 204:
            return []
        runs: list[dict[str, Any]] = response.json()["runs"]
        return runs

    async def control(self, runner_id: RunnerId, after: int, timeout_s: float) -> list[Indexed]:
        """The runner's commands after ``after`` (the last one it handled: acknowledged)."""
        response = await self._call(
            "GET",
            "/runner/control",
            params={"runner_id": runner_id, "after": after, "timeout": timeout_s},
            timeout=timeout_s + 15.0,
        )
        if response.status_code == 204:
            return []
        return [Indexed(int(c["idx"]), dict(c["body"])) for c in response.json()["commands"]]

    async def heartbeat(
        self, runner_id: RunnerId, held: list[Held], timeout_s: float | None = None
    ) -> list[RunId]:
        """Tell what it holds; the answer: the runs of those that are no longer its own.
        ``timeout_s``: how long to wait for it (None: the client's default)."""
        body = {
            "runner_id": runner_id,
            "held": [{"run_id": h.run_id, "attempt": h.attempt} for h in held],
        }
        response = await self._call("POST", "/runner/heartbeat", json=body, timeout=timeout_s)
        data = response.json()
        return [RunId(r) for r in data["abandon"]]

    async def deregister(self, runner_id: RunnerId) -> None:
        await self._call("POST", "/runner/deregister", json={"runner_id": runner_id})

    async def events(
        self, runner_id: RunnerId, events: list[dict[str, Any]], timeout_s: float | None = None
    ) -> list[errors.CorralError | None]:
        """Send reports in one request; each answer is None (applied) or the refusal.
        ``timeout_s``: how long to wait for it (None: the client's default)."""
        response = await self._call(
            "POST",
            "/runner/events",
            json={"runner_id": runner_id, "events": events},
            timeout=timeout_s,
        )
        return [None if r["ok"] else errors.from_wire(409, r) for r in response.json()["results"]]


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _error_code(response: httpx.Response) -> str | None:
    body = _json(response)
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None
