"""Callback latency: from an async_callback child's end to its parent's resume run.

A ``corral serve`` on SQLite and a runner made of HTTP calls. A parent session ends; then,
``--samples`` times: a child naming it (``callback: async_callback``) is claimed, started
and completed; the parent's resume run that carries its result is claimed and completed,
so the parent is idle for the next child. The figure is the resume's ``created_at`` less
the child's ``finished_at`` (both written by the coordinator's clock), p50 and p99.

    python benchmarks/callbacks.py [--samples 100]
"""

from __future__ import annotations

import argparse
import statistics
from datetime import datetime
from typing import Any

import httpx
from served import corral_serve

TOKEN = "crl_bench-admin-token"


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


class Runner:
    """The calls a runner makes, over HTTP, for runs that end at once."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        answer = http.post("/runner/register", json={"name": "bench", "hostname": "bench"})
        answer.raise_for_status()
        self.id: str = answer.json()["runner_id"]

    def claim(self, timeout: float) -> dict[str, Any]:
        answer = self.http.get(
            "/runner/runs", params={"runner_id": self.id, "max_runs": 1, "timeout": timeout}
        )
        assert answer.status_code == 200, f"nothing claimed within {timeout} s: {answer.text}"
        run: dict[str, Any] = answer.json()["runs"][0]
        return run

    def finish(self, run: dict[str, Any], session_id: str) -> None:
        body = {"runner_id": self.id, "attempt": run["attempts"]}
        self.http.post(f"/runner/runs/{run['run_id']}/started", json=body).raise_for_status()
        self.http.post(
            f"/runner/runs/{run['run_id']}/completed",
            json={**body, "exit_code": 0, "session_id": session_id, "result": "done"},
        ).raise_for_status()


def sample(http: httpx.Client, runner: Runner, n: int) -> float:
    """Seconds from child ``n``'s end to the creation of the parent's resume run."""
    child = {"type": "start_session", "prompt": "work", "session_name": f"kid-{n}"}
    child.update(parent_session="lead", callback="async_callback")
    http.post("/runs", json=child).raise_for_status()
    claimed = runner.claim(timeout=5)
    runner.finish(claimed, f"sess-kid-{n}")
    resume = runner.claim(timeout=30)  # the parent's resume, once it exists
    assert resume["type"] == "resume_session", resume
    runner.finish(resume, "sess-lead")
    ended = http.get(f"/runs/{claimed['run_id']}").json()["finished_at"]
    created = http.get(f"/runs/{resume['run_id']}").json()["created_at"]
    return _ts(created) - _ts(ended)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    with corral_serve("callbacks.db", env={"CORRAL_TOKEN": TOKEN}) as (url, _pid):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            runner = Runner(http)
            lead = {"type": "start_session", "prompt": "plan", "session_name": "lead"}
            http.post("/runs", json=lead).raise_for_status()
            runner.finish(runner.claim(timeout=5), "sess-lead")
            latencies = sorted(sample(http, runner, n) for n in range(args.samples))
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"child end -> parent resume created, {len(latencies)} samples: "
        f"p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
