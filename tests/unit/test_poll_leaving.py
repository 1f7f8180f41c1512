"""A long-poll runner told that its coordinator stops (``coordinator_leaving``, 503): the
link sends the next call to the next coordinator — once, however many calls were cut at
once — and the transport makes it at once, not after a backoff; with no other coordinator
it tries again every ``HOLD_ON_RETRY_S`` until one answers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from corral.ids import RunId, RunnerId
from corral.protocol.runner import HOLD_ON_RETRY_S
from corral.runner import poll
from corral.runner.link import HttpLink, Leaving, LinkDown
from corral.runner.poll import PollTransport
from corral.runner.settings import RunnerSettings

pytestmark = pytest.mark.anyio
LEAVING = {"error": {"code": "coordinator_leaving", "message": "stopping"}}


async def one_host_each(host: str) -> list[str]:
    """The names' resolver: no addresses, so each name is one coordinator (and the test
    does not ask this machine's DNS)."""
    return []


async def test_calls_cut_by_a_leaving_coordinator_move_to_the_next_one_once() -> None:
    asked: list[str] = []
    both_in = asyncio.Event()

    async def coordinators(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host == "a":
            if len(asked) == 2:
                both_in.set()
            await both_in.wait()  # a poll and a control call waiting there, cut at once
            return httpx.Response(503, json=LEAVING)
        if request.url.host == "b":
            return httpx.Response(200, json={"abandon": []})
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "?"}})

    client = httpx.AsyncClient(transport=httpx.MockTransport(coordinators), base_url="http://a")
    link = HttpLink("http://a,http://b,http://c", client=client, resolve=one_host_each)
    rid = RunnerId("rnr_1")
    cut = await asyncio.gather(
        link.heartbeat(rid, []), link.heartbeat(rid, []), return_exceptions=True
    )
    assert [type(error) for error in cut] == [Leaving, Leaving]
    assert await link.heartbeat(rid, []) == []  # on B, not C (nor back to A)
    assert asked == ["a", "a", "b"]
    await client.aclose()


class LeavingLink:
    """Answers a heartbeat after ``leaving`` calls were answered coordinator_leaving and
    ``down`` more found nobody."""

    def __init__(self, coordinators: int, leaving: int, down: int = 0) -> None:
        self.coordinators = coordinators
        self.leaving, self.down = leaving, down

    async def heartbeat(self, *_: Any, **__: Any) -> list[RunId]:
        if self.leaving:
            self.leaving -= 1
            raise Leaving("coordinator a is stopping")
        if self.down:
            self.down -= 1
            raise LinkDown("connection refused")
        return []


@pytest.mark.parametrize(
    ("coordinators", "leaving", "down", "holding_on", "waits"),
    [
        (2, 1, 0, False, [0.0]),  # the next coordinator at once
        (2, 1, 0, True, [0.0]),  # so too when another call was told first
        (2, 2, 0, False, [0.0, HOLD_ON_RETRY_S]),  # it stops too: often, not at once again
        (1, 1, 2, False, [HOLD_ON_RETRY_S] * 3),  # the only one: often until it is back
    ],
)
async def test_a_call_cut_by_a_leaving_coordinator_is_made_again_soon(
    monkeypatch: pytest.MonkeyPatch,
    coordinators: int,
    leaving: int,
    down: int,
    holding_on: bool,
    waits: list[float],
) -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    link = LeavingLink(coordinators, leaving, down)
    transport = PollTransport(None, RunnerSettings(), link=link)  # type: ignore[arg-type]
    transport.holding_on = holding_on
    monkeypatch.setattr(poll.asyncio, "sleep", sleep)
    assert await transport._retry("heartbeat", lambda: link.heartbeat()) == []
    assert slept == waits
    assert not transport.holding_on  # answered: back to the backoff for the next failure
