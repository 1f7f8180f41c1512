"""The long-poll runner's outbox against the real coordinator app (in process, SQLite and
PostgreSQL): a report the coordinator refuses is a failure of that report only.

A batch holding one report the coordinator refuses (422: a ``logs`` event over the line
limit) is sent again in halves until that report is alone; it is dropped — its future
fails with the refusal, and it is logged — while every other report is applied, and the
outbox goes on sending. (It used to raise out of ``Outbox.run``: the runner's outbox task
died, the run stayed ``running`` and every later report waited for ever.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import pytest
from api_fixtures import TOKEN, Api, live_server, running_api, with_token

from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import InvalidRequest
from corral.ids import RunnerId
from corral.protocol.limits import MAX_LOG_LINES
from corral.runner.link import HttpLink
from corral.runner.outbox import Outbox

pytestmark = pytest.mark.anyio
STEP_S = 20.0  # a bound on each wait, for correctness, not speed


def _logs(run_id: str, first: int, count: int) -> dict[str, Any]:
    lines = [
        {"line_no": n, "stream": "stdout", "text": f"line {n}", "ts": time.time()}
        for n in range(first, first + count)
    ]
    return {"type": "logs", "run_id": run_id, "attempt": 1, "lines": lines}


async def test_a_refused_report_is_dropped_and_the_outbox_goes_on(db_url: str) -> None:
    settings = CoordinatorSettings(db_url=db_url, poll_timeout_s=5.0)
    async with running_api(settings) as api:
        runner_id = RunnerId(await api.register())
        run_id = await api.create_command("seq", "3")
        await api.claim_one(runner_id)
        outbox = Outbox(HttpLink(str(api.client.base_url), client=api.client), lambda: runner_id)
        sending = asyncio.create_task(outbox.run())
        try:
            reports = [
                {"type": "started", "run_id": run_id, "attempt": 1},
                _logs(run_id, 0, 2),
                _logs(run_id, 2, MAX_LOG_LINES + 1),  # more than one event may hold
                _logs(run_id, 2, 1),
                {"type": "finished", "run_id": run_id, "attempt": 1, "status": "completed"},
            ]
            futures = [outbox.send(report) for report in reports]
            done, _ = await asyncio.wait(futures, timeout=STEP_S)
            assert len(done) == len(futures), f"the outbox stopped: {sending}"
            refusals = [type(f.exception()).__name__ for f in futures]
            assert refusals == [
                "NoneType",
                "NoneType",
                InvalidRequest.__name__,
                "NoneType",
                "NoneType",
            ]
            assert not sending.done()

            run = await api.run(run_id)
            assert run["status"] == "completed", run
            page = (await api.client.get(f"/runs/{run_id}/logs")).json()
            assert [line["text"] for line in page["lines"]] == ["line 0", "line 1", "line 2"]

            # Still sending: a later report goes through.
            await asyncio.wait_for(outbox.send(_logs(run_id, 3, 1)), STEP_S)
            page = (await api.client.get(f"/runs/{run_id}/logs")).json()
            assert len(page["lines"]) == 4
            assert not sending.done()
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending


async def test_a_report_sent_to_a_coordinator_gone_silent_goes_to_the_next_in_time(
    db_url: str,
) -> None:
    """The connection its report went on leads nowhere (a coordinator dropped without a word:
    the socket stays open and silent). The report goes to the next coordinator once half
    the lease has passed without an answer (``Lease.answer_wait_s``), not after the
    client's 30 s — the run's end is not left unrecorded that long."""
    answered_nothing: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered_nothing.append(writer)  # read nothing, answer nothing, keep it open

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    silent_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    settings = with_token(CoordinatorSettings(db_url=db_url, poll_timeout_s=5.0))
    app = create_app(settings)
    try:
        with live_server(app) as url:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers) as client:
                api = Api(app, client)
                runner_id = RunnerId(await api.register())
                run_id = await api.create_command("true")
                await api.claim_one(runner_id)
                link = HttpLink(f"{silent_url},{url}", token=TOKEN)
                outbox = Outbox(link, lambda: runner_id, answer_wait_s=lambda: 1.0)
                sending = asyncio.create_task(outbox.run())
                try:
                    started = {"type": "started", "run_id": run_id, "attempt": 1}
                    await asyncio.wait_for(outbox.send(started), STEP_S)
                    assert answered_nothing, "the report went to the silent one first"
                    assert (await api.run(run_id))["status"] == "running"
                finally:
                    sending.cancel()
                    await link.aclose()
    finally:
        for writer in answered_nothing:
            writer.close()
        server.close()
