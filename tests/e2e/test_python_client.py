"""``corral.Client`` against a real coordinator and runner (the fake Claude CLI): a command
followed to its end, an agent session started and resumed, and refusals with their codes."""

from __future__ import annotations

import pytest
from e2e_support import TOKEN, Cluster

from corral import Client
from corral.client import LogLine, Run
from corral.errors import NotFound, Unavailable
from corral.runs import RunStatus


def test_a_command_is_followed_to_its_end(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_runner("runner-a")
    with Client(cluster.url, token=TOKEN) as corral:
        created = corral.run_command(["sh", "-c", "echo one; echo two >&2; exit 3"])
        items = list(corral.follow_logs(created.run_id))
        *lines, end = items
        assert all(isinstance(line, LogLine) for line in lines)
        assert sorted((line.stream, line.text) for line in lines if isinstance(line, LogLine)) == [
            ("stderr", "two"),
            ("stdout", "one"),
        ]
        assert isinstance(end, Run) and end.status is RunStatus.FAILED and end.exit_code == 3
        waited = corral.wait_run(created.run_id)  # already ended: answers at once
        assert (waited.status, waited.exit_code, waited.finished) == (RunStatus.FAILED, 3, True)


def test_an_agent_session_started_resumed_and_read(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_runner("runner-a")
    with Client(cluster.url, token=TOKEN) as corral:
        first = corral.wait_run(corral.start_session("hello", session_name="py").run_id)
        assert first.status is RunStatus.COMPLETED and first.result == "turn 1: hello"
        assert corral.session_result("py").result == "turn 1: hello"
        second = corral.wait_run(corral.resume_session("py", "again").run_id)
        assert (second.session_id, second.result) == (first.session_id, "turn 2: again")
        (session,) = corral.list_sessions()
        assert (session.session_name, session.runs, session.last_run_id) == (
            "py",
            2,
            second.run_id,
        )
        with pytest.raises(NotFound) as missing:
            corral.resume_session("nobody", "hi")
        assert missing.value.code == "session_not_found"


def test_an_unreachable_coordinator_is_unavailable(cluster: Cluster) -> None:
    coordinator = cluster.start_coordinator()
    coordinator.kill()
    with Client(coordinator.url, token=TOKEN) as corral, pytest.raises(Unavailable) as down:
        corral.list_runs()
    assert down.value.code == "unavailable" and coordinator.url in down.value.message
