"""Processes dying and going away: a runner SIGKILLed mid-run, a coordinator SIGKILLed
mid-workload, a runner draining on SIGTERM, a runner started before its coordinator."""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from e2e_support import TERMINAL, Cluster, free_port, pid_alive, wait_until


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def test_kill_runner_mid_run_reclaims(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_coordinator()
    runners = {name: cluster.start_runner(name, slots=1, wait=False) for name in ("a", "b")}
    ids = {name: cluster.wait_runner(name) for name in runners}
    starts = tmp_path / "starts"
    script = f'echo "$$" >> "{starts}"; sleep 3; echo done'
    run_id = cluster.client.create_run(type="command", command=["sh", "-c", script])["run_id"]

    running = cluster.wait_run(run_id, {"running"})
    holder = next(name for name, rid in ids.items() if rid == running["runner_id"])
    other = next(name for name in ids if name != holder)
    wait_until(lambda: starts.exists() and starts.read_text().strip(), what="the run to start")
    first_shell = int(starts.read_text())

    runners[holder].send(signal.SIGKILL)
    assert runners[holder].wait(10) == -signal.SIGKILL
    # The kernel kills the runner's child with it (PDEATHSIG): no orphan keeps running it.
    wait_until(lambda: not pid_alive(first_shell), 5, what="the orphaned shell to die")

    run = cluster.wait_run(run_id, timeout=30)
    assert run["status"] == "completed", run
    assert run["attempts"] == 2
    assert run["runner_id"] == ids[other]
    assert cluster.runner_by_id(ids[holder])["state"] == "lost"
    lines = [line["text"] for line in cluster.client.logs(run_id)["lines"]]
    assert lines == ["done"]  # the first attempt printed nothing
    assert len(starts.read_text().split()) == 2


def test_kill_coordinator_mid_workload(cluster: Cluster, tmp_path: Path) -> None:
    # lost_after well above the outage and the runners' retry backoff: this test is about
    # the crash itself (see the next test for an outage longer than lost_after).
    coordinator = cluster.start_coordinator(lost_after_s=10.0)
    runners = [cluster.start_runner(name, slots=4, wait=False) for name in ("a", "b")]
    for r in runners:
        cluster.wait_runner(r.name)
    markers = tmp_path / "markers"
    markers.mkdir()
    specs: list[dict[str, Any]] = []
    for i in range(60):
        pause = "sleep 0.2; " if i % 3 == 0 else ""
        # Each run appends its name to its own marker file: one line per execution.
        script = f'{pause}echo "$0" >> "$1"; echo "$0"'
        specs.append(
            {
                "type": "command",
                "command": ["sh", "-c", script, f"run-{i:02d}", str(markers / f"run-{i:02d}")],
            }
        )
    run_ids = [r["run_id"] for r in cluster.client.create_runs(specs)]
    names = {run_id: f"run-{i:02d}" for i, run_id in enumerate(run_ids)}

    def runs() -> list[dict[str, Any]]:
        found = cluster.client.list_runs(limit=500)["runs"]
        assert len(found) == 60
        return found

    wait_until(
        lambda: sum(r["status"] == "completed" for r in runs()) >= 10,
        30,
        interval=0.02,
        what="10 runs completed",
    )
    killed_at = time.time()
    coordinator.send(signal.SIGKILL)
    assert coordinator.wait(10) == -signal.SIGKILL
    assert all(r.alive() for r in runners)

    cluster.restart_coordinator()  # same port, same SQLite file

    def all_finished() -> list[dict[str, Any]] | None:
        found = runs()
        return found if all(r["status"] in TERMINAL for r in found) else None

    final = wait_until(all_finished, 60, interval=0.2, what="all 60 runs to finish")
    assert {r["run_id"]: r["status"] for r in final} == dict.fromkeys(run_ids, "completed")
    # Each ran exactly once: nothing lost, nothing executed twice.
    for run_id, name in names.items():
        assert (markers / name).read_text().splitlines() == [name], run_id
    # The workload really spanned the crash: runs claimed before it finished after it.
    assert any(_ts(r["claimed_at"]) < killed_at < _ts(r["finished_at"]) for r in final), (
        "no run was in flight when the coordinator was killed"
    )
    assert all(r.alive() for r in runners)
    for r in runners:
        cluster.wait_runner(r.name)  # still (or again) active


def test_coordinator_outage_longer_than_lost_after(cluster: Cluster, tmp_path: Path) -> None:
    """Runners cannot heartbeat while no coordinator is up: a restarted coordinator must
    not declare them lost for that (and run again what they ran in the meantime)."""
    lost_after = 3.0
    coordinator = cluster.start_coordinator(lost_after_s=lost_after)
    runner = cluster.start_runner("runner-a", slots=4)
    runner_id = cluster.wait_runner("runner-a")
    markers = tmp_path / "markers"
    markers.mkdir()
    script = 'echo "$0" >> "$1"; sleep 0.5'
    specs = [
        {"type": "command", "command": ["sh", "-c", script, f"m{i}", str(markers / f"m{i}")]}
        for i in range(4)
    ]
    run_ids = [r["run_id"] for r in cluster.client.create_runs(specs)]
    for run_id in run_ids:
        cluster.wait_run(run_id, {"running"})

    # Freeze the runner (so its retry backoff does not grow), then kill the coordinator.
    # The runs finish meanwhile; their reports wait in the runner.
    runner.send(signal.SIGSTOP)
    frozen_at = time.time()
    coordinator.send(signal.SIGKILL)
    coordinator.wait(10)
    wait_until(
        lambda: time.time() - frozen_at > lost_after + 1,
        lost_after + 5,
        interval=0.1,
        what="the outage to outlast lost_after",
    )
    assert sorted(p.name for p in markers.iterdir()) == [f"m{i}" for i in range(4)]
    cluster.restart_coordinator()
    runner.send(signal.SIGCONT)

    for run_id in run_ids:
        run = cluster.wait_run(run_id)
        assert run["status"] == "completed", run
        assert run["attempts"] == 1, run
        assert run["runner_id"] == runner_id
    for i in range(4):
        assert (markers / f"m{i}").read_text().splitlines() == [f"m{i}"]
    assert cluster.runner_by_id(runner_id)["state"] == "active"
    assert runner.log().count("registered") == 1  # never told it was lost


def test_runner_declared_lost_comes_back(cluster: Cluster) -> None:
    """A runner silent past lost_after (paused, cut off) is declared lost; once it can talk
    again it is told so, registers again under its id and takes work."""
    cluster.start_coordinator()
    runner = cluster.start_runner("runner-a", slots=1)
    runner_id = cluster.wait_runner("runner-a")

    runner.send(signal.SIGSTOP)
    cluster.wait_runner("runner-a", state="lost", timeout=15)
    runner.send(signal.SIGCONT)

    assert cluster.wait_runner("runner-a", timeout=15) == runner_id
    run_id = cluster.client.create_run(type="command", command=["echo", "again"])["run_id"]
    run = cluster.wait_run(run_id, timeout=15)
    assert run["status"] == "completed", run
    assert run["runner_id"] == runner_id
    assert runner.alive()


def test_runner_sigterm_drains(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_coordinator()
    runner = cluster.start_runner("runner-a", slots=2)
    runner_id = cluster.wait_runner("runner-a")
    gate = tmp_path / "gate"
    script = f'while [ ! -e "{gate}" ]; do sleep 0.05; done; echo finished'
    first = cluster.client.create_run(type="command", command=["sh", "-c", script])["run_id"]
    cluster.wait_run(first, {"running"})

    runner.send(signal.SIGTERM)
    wait_until(lambda: "draining" in runner.log(), 10, what="the runner to start draining")
    assert runner.alive()
    # Created while it drains, with a slot free: it must not be claimed by this runner
    # (a claim it never receives would cost the run its one attempt when the runner leaves).
    late = cluster.client.create_run(type="command", command=["echo", "late"], max_attempts=1)[
        "run_id"
    ]
    gate.touch()

    assert runner.wait(30) == 0
    run = cluster.client.get_run(first)
    assert run["status"] == "completed", run
    assert run["runner_id"] == runner_id
    assert [line["text"] for line in cluster.client.logs(first)["lines"]] == ["finished"]
    late_run = cluster.client.get_run(late)
    assert late_run["status"] == "pending", late_run
    assert late_run["attempts"] == 0 and late_run["claimed_at"] is None, late_run
    assert cluster.runner_by_id(runner_id)["state"] == "stopped"


def test_runner_survives_coordinator_absence(cluster: Cluster) -> None:
    port = free_port()
    runner = cluster.start_runner("runner-a", url=f"http://127.0.0.1:{port}", wait=False)
    wait_until(
        lambda: runner.log().count("coordinator unreachable") >= 2,
        20,
        what="the runner to retry its registration",
    )
    assert runner.alive()

    cluster.start_coordinator(port=port)
    runner_id = cluster.wait_runner("runner-a", timeout=30)
    run_id = cluster.client.create_run(type="command", command=["echo", "back"])["run_id"]
    run = cluster.wait_run(run_id)
    assert run["status"] == "completed", run
    assert run["runner_id"] == runner_id
    assert runner.alive()
