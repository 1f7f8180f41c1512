"""``corral run --wait`` (``cli.follow.Follower``) on a run whose last attempt's runner was
lost: it says what the run waits for, and follows it to the end its runner's late report
gives it. A fake client: no coordinator, no sockets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from corral.cli.follow import Follower
from corral.client import Run


class FakeClient:
    """Answers ``get_run`` from a list of states, one a call (the last one repeats), and
    streams the next state's event."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs

    def get_run(self, run_id: str) -> Run:
        return self.runs.pop(0) if len(self.runs) > 1 else self.runs[0]

    def events(self, **_: Any) -> Iterator[dict[str, Any]]:
        yield {"event": "run", "data": {"data": {"status": self.runs[0].status}}}


def run(status: str, **fields: Any) -> Run:
    return Run(run_id="run_1", type="command", status=status, **fields)


def test_a_lost_run_is_said_to_wait_for_its_runner_and_followed_to_its_end() -> None:
    said: list[str] = []
    lost = run(
        "lost", error="runner rnr_1 was lost", attempts=1, lost_until="2026-11-27T10:12:03+00:00"
    )
    completed = run("completed", exit_code=0, attempts=1)
    follower = Follower(FakeClient([lost, completed]), "run_1", stream=False, say=said.append)  # type: ignore[arg-type]

    assert follower.run() == completed
    assert said == [
        "run_1 lost (runner rnr_1 was lost): waiting until 10:12:03 UTC for its runner to "
        "report the attempt, "
        "else it fails"
    ]
