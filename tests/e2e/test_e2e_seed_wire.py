"""A runner written from the seed document alone (``seed_runner.py``: the seed's poll,
reports and heartbeat bodies, nothing of corral's own runner protocol) runs command and
agent runs to completion against a real coordinator, including across a kill -9 of it."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import httpx
from e2e_support import (
    FAKE_CLAUDE,
    TOKEN,
    Cluster,
    Proc,
    kill_coordinator_mid_workload,
    wait_until,
)

SEED_RUNNER = str(Path(__file__).with_name("seed_runner.py"))
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def start_seed_runner(cluster: Cluster, name: str) -> Proc:
    env = {**cluster.env, "SEED_CLAUDE": FAKE_CLAUDE}
    runner = Proc(name, [sys.executable, SEED_RUNNER, cluster.url, name], env, cluster.root)
    cluster.procs.append(runner)
    runner.start()
    cluster.wait_runner(name)
    return runner


def test_a_seed_runner_survives_a_coordinator_kill(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_coordinator(lost_after_s=5.0)
    runner = start_seed_runner(cluster, "seed")
    markers = tmp_path / "markers"
    markers.mkdir()
    specs: list[dict[str, Any]] = []
    for i in range(40):
        # Each run appends its name to its own marker file: one line per execution.
        script = 'sleep 0.2; echo "$0" >> "$1"'
        marker = str(markers / f"run-{i:02d}")
        specs.append({"type": "command", "command": ["sh", "-c", script, f"run-{i:02d}", marker]})
    prompts = [f"agent task {i} [fake:sleep=0.2]" for i in range(10)]
    specs += [
        {"type": "start_session", "prompt": p, "session_name": f"s{i}"}
        for i, p in enumerate(prompts)
    ]
    run_ids = [r["run_id"] for r in cluster.client.create_runs(specs)]

    final = kill_coordinator_mid_workload(cluster, [runner], run_ids)

    # Nothing lost, nothing executed twice: one line per command, one start per prompt.
    for i in range(40):
        assert (markers / f"run-{i:02d}").read_text().splitlines() == [f"run-{i:02d}"]
    starts = [e["prompt"] for e in cluster.ledger() if e.get("event") == "start"]
    assert sorted(starts) == sorted(prompts)
    assert all(r["attempts"] >= 1 for r in final)
    assert runner.alive()


def test_an_abandoned_seed_poll_does_not_swallow_a_run(cluster: Cluster) -> None:
    cluster.start_coordinator()
    registered = cluster.client.call("POST", "/runner/register", json={"name": "seed"})
    runner_id = registered["runner_id"]
    # The runner gives up on its long-poll long before the coordinator would answer.
    with contextlib.suppress(httpx.ReadTimeout):
        httpx.get(
            f"{cluster.url}/runner/runs",
            params={"runner_id": runner_id},
            headers=AUTH,
            timeout=0.3,
        )
    run_id = cluster.client.create_run(type="command", command=["true"])["run_id"]

    def answered() -> dict[str, Any] | None:
        response = httpx.get(
            f"{cluster.url}/runner/runs", params={"runner_id": runner_id}, headers=AUTH, timeout=10
        )
        return response.json()["run"] if response.status_code == 200 else None

    run = wait_until(answered, 20, what="the next poll to get the run")
    assert run["run_id"] == run_id
    assert cluster.client.get_run(run_id)["attempts"] == 1  # no claim went to the lost poll
