"""``corral tasks run``'s progress follows the event stream, not a timer (``PlanChanges``,
on a real coordinator over a socket): it says "changed" when its plan's tasks change and
at no other time, never for another plan, and closing it ends its stream at once."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_fixtures import HEADERS, TOKEN, live_server, with_token
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from corral.cli.plan_progress import PlanChanges
from corral.client import Client, NewTask
from corral.coordinator.app import create_app
from corral.coordinator.settings import CoordinatorSettings

STEP_S = 10.0  # the bound on anything expected (correctness, not speed)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    settings = with_token(CoordinatorSettings(db_url=f"sqlite:///{tmp_path}/c.db"))
    with live_server(create_app(settings, reconcile=False)) as found:
        yield found


def test_a_plan_change_and_only_its_own_says_changed(url: str) -> None:
    with Client(url, token=TOKEN) as client:
        mine = client.ensure_project("/repo", "main").project_id
        other = client.ensure_project("/repo", "other").project_id
        with PlanChanges(url, TOKEN, mine) as changes:
            assert changes.caught_up.wait(STEP_S)
            changes.wait(0)  # what opening the stream said
            assert not changes.wait(0.3)  # nothing changed: nothing said (no timer)
            client.add_tasks(other, [NewTask(id="theirs", title="theirs")])
            client.add_tasks(mine, [NewTask(id="a", title="a")])
            assert changes.wait(STEP_S)
            seen = {(e["kind"], e["plan_id"], e["data"].get("key")) for e in changes.recent}
            assert seen == {("task", mine, "a")}


def test_closing_it_ends_its_stream_at_once(url: str) -> None:
    with Client(url, token=TOKEN) as client:
        plan = client.ensure_project("/repo", "main").project_id

        def subscribers() -> float:
            text = httpx.get(f"{url}/metrics", headers=HEADERS).text
            line = next(x for x in text.splitlines() if x.startswith("corral_event_subscribers "))
            return float(line.split()[1])

        with PlanChanges(url, TOKEN, plan) as changes:
            assert changes.caught_up.wait(STEP_S)
            assert subscribers() == 1
        assert not changes._thread.is_alive()  # joined: its read ended when it closed
        end = time.monotonic() + STEP_S
        while subscribers() != 0:
            assert time.monotonic() < end, "the stream stayed open"
            time.sleep(0.02)


def test_without_a_working_stream_it_still_says_changed_now_and_then() -> None:
    """A coordinator without GET /events (404: asked on a timer) or whose stream fails
    (500: asked at each attempt to open it again): the watch goes on either way."""
    app = FastAPI()

    @app.get("/events")
    async def broken() -> PlainTextResponse:
        return PlainTextResponse("no", status_code=500)

    with live_server(app) as broken_url, live_server(FastAPI()) as bare_url:
        for url in (broken_url, bare_url):
            with PlanChanges(url, TOKEN, "prj_000000000000") as changes:
                for _ in range(3):
                    assert changes.wait(STEP_S), url


def test_of_several_coordinators_it_follows_one_that_answers(url: str) -> None:
    """``corral tasks run --url A,B`` with A down: the watch opens its stream at B."""
    with socket.socket() as s:  # a local port nobody listens on (bound, then released)
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with Client([dead, url], token=TOKEN) as client:
        plan = client.ensure_project("/repo", "main").project_id
        with PlanChanges([dead, url], TOKEN, plan) as changes:
            assert changes.caught_up.wait(STEP_S)
            changes.wait(0)  # what opening the stream said
            client.add_tasks(plan, [NewTask(id="a", title="a")])
            assert changes.wait(STEP_S)
            assert {(e["kind"], e["data"].get("key")) for e in changes.recent} == {("task", "a")}
