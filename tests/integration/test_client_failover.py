"""A client given several coordinator URLs, against real coordinators (uvicorn on local
ports): it moves on from one it cannot reach, and stays with the one that answered; a
POST whose answer was lost is not sent again; a followed log goes on at the next one.

Failures between client and coordinator come from ``Relay``, a TCP relay on 127.0.0.1 in
front of a coordinator: cut, it resets every connection and refuses new ones (the
coordinator is gone); with ``lose_answers``, a request reaches the coordinator, which
does it, and the connection is reset as its answer comes (the client never hears).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from api_fixtures import HEADERS, TOKEN, backend_url, live_server, with_token

from corral.client import AsyncClient, Client, LogLine, Run
from corral.coordinator.app import CorralServer, create_app
from corral.coordinator.settings import CoordinatorSettings
from corral.errors import Unavailable


def nothing_listens() -> str:
    """The URL of a local port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _reset(sock: socket.socket) -> None:
    """Close with a RST (not a FIN), waking a thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    sock.close()


class Relay:
    def __init__(self, target: str) -> None:
        self._target = ("127.0.0.1", int(target.rsplit(":", 1)[1]))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.lose_answers = False
        self.answers_lost = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._open:
                _reset(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # cut
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._open += [client, upstream]
            for args in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if answers and data and self.lose_answers:
                with self._lock:
                    self.answers_lost += 1
                data = b""
            try:
                if not data:
                    break
                sink.sendall(data)
            except OSError:
                break
        _reset(source)
        _reset(sink)


def sqlite_app(tmp_path: Path) -> Any:
    return create_app(with_token(CoordinatorSettings(db_url=str(tmp_path / "corral.db"))))


@contextlib.contextmanager
def one_coordinator(tmp_path: Path) -> Iterator[str]:
    with live_server(sqlite_app(tmp_path)) as url:
        yield url


def test_a_client_given_a_dead_coordinator_and_a_live_one_works(tmp_path: Path) -> None:
    with one_coordinator(tmp_path) as live:
        with Client([nothing_listens(), live], token=TOKEN) as corral:
            run_id = corral.run_command(["true"]).run_id  # a POST: it never left
            assert corral.url == live  # and it stays there
            assert corral.get_run(run_id).run_id == run_id

        async def scenario() -> None:
            async with AsyncClient(f"{nothing_listens()},{live}", token=TOKEN) as corral:
                assert (await corral.get_run(run_id)).run_id == run_id
                assert corral.url == live

        anyio.run(scenario, backend="asyncio")


def test_a_client_fails_once_no_coordinator_answers() -> None:
    dead = [nothing_listens(), nothing_listens()]
    with Client(dead, token=TOKEN) as corral, pytest.raises(Unavailable) as failed:
        corral.list_runs()
    assert failed.value.message.startswith(f"cannot reach any coordinator ({dead[0]}: ")
    assert f"; {dead[1]}: " in failed.value.message


@pytest.mark.postgres
def test_a_client_whose_coordinator_dies_between_two_calls_moves_on(tmp_path: Path) -> None:
    with (
        backend_url("postgres", tmp_path) as db,
        contextlib.ExitStack() as first,
        live_server(create_app(with_token(CoordinatorSettings(db_url=db)))) as b,
    ):
        a = first.enter_context(live_server(create_app(with_token(CoordinatorSettings(db_url=db)))))
        with Client([a, b], token=TOKEN) as corral:
            created = corral.run_command(["true"])
            assert corral.url == a
            first.close()  # a stops
            assert corral.get_run(created.run_id).run_id == created.run_id
            assert corral.url == b
            again = corral.run_command(["true"])  # a POST refused by a: it never left
            assert {r.run_id for r in corral.list_runs().runs} == {
                created.run_id,
                again.run_id,
            }


def test_a_create_whose_answer_was_lost_gets_its_run_once_at_the_next(tmp_path: Path) -> None:
    """The first coordinator created the run and its answer was lost: sent again to the
    next with its idempotency key, the request gets that run, and no second one is made.
    A cancel whose answer was lost goes to the next too (sent again, it changes nothing);
    a write that would do more sent twice is not sent again: its outcome is unknown."""
    with one_coordinator(tmp_path) as live:
        relay = Relay(live)
        relay.lose_answers = True
        with Client([relay.url, live], token=TOKEN) as corral:
            created = corral.run_command(["sleep", "60"])
            assert relay.answers_lost == 1 and corral.url == live
            with Client(live, token=TOKEN) as direct:
                (only,) = direct.list_runs().runs  # created by the first coordinator, once
            assert only.run_id == created.run_id
            corral.coordinators.answered(relay.url)
            assert corral.cancel_run(created.run_id).status == "cancelled"
            assert relay.answers_lost == 2 and corral.url == live
            corral.coordinators.answered(relay.url)
            with pytest.raises(Unavailable) as lost:
                corral.retry_task("prj_000000000000", "a")
            assert lost.value.code == "outcome_unknown"
            assert f"lost the coordinator at {relay.url} after sending POST /projects/" in (
                lost.value.message
            )
            assert relay.answers_lost == 3
            # A read whose answer was lost goes to the next one: it changes nothing.
            assert corral.get_run(created.run_id).status == "cancelled"
            assert relay.answers_lost == 4
            assert corral.url == live
        relay.cut()


def test_plan_writes_whose_answers_were_lost_are_done_once_at_the_next(tmp_path: Path) -> None:
    """A plan ensured, its tasks added, started, paused, resumed and stopped, every answer
    lost on the way back from the first coordinator (which did each): each goes to the
    next, does nothing more there, and the plan ends as one set of calls would leave it."""
    tasks = [{"id": "a", "title": "A"}, {"id": "b", "title": "B", "after": ["a"]}]
    with one_coordinator(tmp_path) as live:
        relay = Relay(live)
        relay.lose_answers = True
        with Client([relay.url, live], token=TOKEN) as corral, Client(live, token=TOKEN) as direct:
            steps: list[Any] = [
                lambda: corral.ensure_project("/repo", "main"),
                lambda: corral.add_tasks(project_id, tasks),
                lambda: corral.start_plan(project_id, 1),
                lambda: corral.pause_plan(project_id),
                lambda: corral.resume_plan(project_id),
                lambda: corral.stop_plan(project_id),
            ]
            answers = []
            for n, step in enumerate(steps, 1):
                corral.coordinators.answered(relay.url)
                answers.append(step())
                if n == 1:
                    project_id = answers[0].project_id
                assert relay.answers_lost == n and corral.url == live
            (project,) = direct.list_projects()  # ensured once
            assert project.project_id == project_id
            added = answers[1]
            assert (added.created, added.unchanged) == ([], ["a", "b"])  # the first made them
            assert answers[2] == []  # the first sending scheduled "a", once
            assert answers[3:5] == [True, False]
            status = direct.plan_status(project_id)
            assert sorted(t.id for t in status.tasks) == ["a", "b"]
            (run,) = direct.list_runs().runs  # "a" scheduled, once
            assert run.task_id == next(t.task_id for t in status.tasks if t.id == "a")
            assert answers[5].workers == 0 == direct.get_project(project_id).workers
        relay.cut()


def test_a_create_called_again_with_its_key_gets_its_runs(tmp_path: Path) -> None:
    """A caller's own key (a job's id): a call again after an error whose outcome was
    unknown — in this process or a restarted one — gets the runs, never second ones."""
    batch = [{"type": "command", "command": ["true"]}, {"type": "command", "command": ["false"]}]
    with one_coordinator(tmp_path) as live:
        with Client(live, token=TOKEN) as corral:
            first = corral.run_command(["true"], idempotency_key="job-7")
            assert corral.run_command(["true"], idempotency_key="job-7") == first
            assert corral.create_runs(batch, idempotency_key="b1") == corral.create_runs(
                batch, idempotency_key="b1"
            )
            assert corral.run_command(["true"]) != corral.run_command(["true"])  # keys of their own

        async def scenario() -> None:
            async with AsyncClient(live, token=TOKEN) as corral:
                again = await corral.run_command(["true"], idempotency_key="job-7")
                assert again == first
                assert len((await corral.list_runs()).runs) == 1 + 2 + 2

        anyio.run(scenario, backend="asyncio")


def test_a_followed_log_goes_on_at_the_next_coordinator_after_its_last_line(
    tmp_path: Path,
) -> None:
    with one_coordinator(tmp_path) as live:
        relay = Relay(live)

        async def scenario() -> None:
            async with (
                httpx.AsyncClient(base_url=live, headers=HEADERS) as runner,
                AsyncClient([relay.url, live], token=TOKEN) as corral,
            ):
                run_id = (await corral.run_command(["true"])).run_id
                runner_id = await runner_call(runner, "/runner/register", name="r", hostname="r")
                claimed = await runner.get(
                    "/runner/runs", params={"runner_id": runner_id, "max_runs": 1}
                )
                assert claimed.status_code == 200, claimed.text
                said = RunnerSays(runner, run_id, runner_id)
                await said("started")
                await said.lines("one", "two")
                follow = corral.follow_logs(run_id)
                seen = [await anext(follow), await anext(follow)]
                relay.cut()  # the coordinator the stream came from is gone
                await said.lines("three")
                await said("completed", exit_code=0)
                seen += [item async for item in follow]
                texts = [item.text for item in seen if isinstance(item, LogLine)]
                assert texts == ["one", "two", "three"]  # each once, in order
                assert isinstance(seen[-1], Run) and seen[-1].status == "completed"
                assert corral.url == live

        anyio.run(scenario, backend="asyncio")


async def runner_call(runner: httpx.AsyncClient, path: str, **body: Any) -> Any:
    response = await runner.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json().get("runner_id")


class RunnerSays:
    """What a runner reports of the run it holds (attempt 1)."""

    def __init__(self, runner: httpx.AsyncClient, run_id: str, runner_id: str) -> None:
        self.runner, self.run_id, self.runner_id = runner, run_id, runner_id
        self.line_no = 0

    async def __call__(self, what: str, **body: Any) -> None:
        path = f"/runner/runs/{self.run_id}/{what}"
        await runner_call(self.runner, path, runner_id=self.runner_id, attempt=1, **body)

    async def lines(self, *texts: str) -> None:
        lines = []
        for text in texts:
            lines.append({"line_no": self.line_no, "stream": "stdout", "text": text, "ts": 0.0})
            self.line_no += 1
        await self("logs", lines=lines)


def test_the_event_stream_goes_on_at_the_next_coordinator_after_its_last_id(
    tmp_path: Path,
) -> None:
    with one_coordinator(tmp_path) as live:
        relay = Relay(live)
        with Client([relay.url, live], token=TOKEN) as corral:
            run_id = corral.run_command(["sleep", "60"]).run_id
            seen: list[dict[str, Any]] = []
            stream = corral.events(after=0, run_id=run_id, kind="run")
            for message in stream:
                seen.append(message)
                if message["event"] == "caught_up":
                    break
            relay.cut()  # the coordinator the stream came from is gone
            corral.cancel_run(run_id)  # refused by the relay: it never left
            for message in stream:
                seen.append(message)
                if message["event"] == "run" and message["data"]["data"]["status"] == "cancelled":
                    break
        runs = [(m["id"], m["data"]["data"]["status"]) for m in seen if m["event"] == "run"]
        assert [status for _, status in runs] == ["pending", "cancelled"], seen
        assert len({event_id for event_id, _ in runs}) == 2  # each once
        # It went on where it was: opened again after the last id it had passed on.
        ready = [m for m in seen if m["event"] == "ready"]
        caught_up = next(m for m in seen if m["event"] == "caught_up")
        assert [m["data"]["last_event_id"] for m in ready] == [0, caught_up["id"]], seen


@pytest.mark.postgres
def test_followed_streams_go_on_when_their_coordinator_stops(tmp_path: Path) -> None:
    """A coordinator stopping (as a deploy stops it) ends the streams it serves — the
    event stream cleanly, a log when its grace is over: a client of two goes on at the
    other after its last line or event, and a log ends with the run."""
    with (
        backend_url("postgres", tmp_path) as db,
        contextlib.ExitStack() as first,
        live_server(create_app(with_token(CoordinatorSettings(db_url=db)))) as b,
    ):
        # Served as corral serve serves it: stopping, it ends its streams.
        app = create_app(with_token(CoordinatorSettings(db_url=db)))
        a = first.enter_context(live_server(app, server_class=CorralServer, graceful_shutdown_s=1))
        with (
            Client([a, b], token=TOKEN) as corral,
            httpx.Client(base_url=b, headers=HEADERS) as runner,
        ):
            run_id = corral.run_command(["true"]).run_id
            runner_id = runner.post("/runner/register", json={"name": "r", "hostname": "r"})
            said = SyncRunner(runner, run_id, runner_id.json()["runner_id"])
            said("started")
            said("logs", lines=[line(0, "one")])
            follow = corral.follow_logs(run_id)
            seen: list[LogLine | Run] = [next(follow)]
            events = corral.events(after=0, run_id=run_id, kind="run")
            statuses = [m["data"]["data"]["status"] for m in until(events, "caught_up")]
            first.close()  # a stops
            said("logs", lines=[line(1, "two")])
            said("completed", exit_code=0)
            seen += list(follow)
            statuses += [m["data"]["data"]["status"] for m in until(events, "completed")]
        assert [item.text for item in seen if isinstance(item, LogLine)] == ["one", "two"]
        assert isinstance(seen[-1], Run) and seen[-1].status == "completed"
        assert statuses == ["pending", "claimed", "running", "completed"]  # each once


def until(events: Iterator[dict[str, Any]], last: str) -> list[dict[str, Any]]:
    """The run events of the stream up to the message ``last`` (an event or a status)."""
    found = []
    for message in events:
        if message["event"] == "run":
            found.append(message)
            if message["data"]["data"]["status"] == last:
                return found
        elif message["event"] == last:
            return found
    raise AssertionError(f"the stream ended before {last}: {found}")


def line(line_no: int, text: str) -> dict[str, Any]:
    return {"line_no": line_no, "stream": "stdout", "text": text, "ts": 0.0}


class SyncRunner:
    """What a runner reports of the run it holds (attempt 1), claimed first."""

    def __init__(self, runner: httpx.Client, run_id: str, runner_id: str) -> None:
        self.runner, self.run_id, self.runner_id = runner, run_id, runner_id
        claimed = runner.get("/runner/runs", params={"runner_id": runner_id, "max_runs": 1})
        assert claimed.status_code == 200, claimed.text

    def __call__(self, what: str, **body: Any) -> None:
        response = self.runner.post(
            f"/runner/runs/{self.run_id}/{what}",
            json={"runner_id": self.runner_id, "attempt": 1, **body},
        )
        assert response.status_code == 200, response.text
