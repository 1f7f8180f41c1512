"""Processes dying and going away: a runner SIGKILLed mid-run, a coordinator SIGKILLed
mid-workload, a runner draining on SIGTERM, a runner started before its coordinator."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from e2e_support import (
    Cluster,
    free_port,
    kill_coordinator_mid_workload,
    kill_runner_mid_run,
    wait_until,
)
from faultproxy import FaultProxy


def test_kill_runner_mid_run_reclaims(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_coordinator()
    kill_runner_mid_run(cluster, tmp_path, sleep_s=3)


def test_kill_coordinator_mid_workload(cluster: Cluster, tmp_path: Path) -> None:
    # lost_after well above the outage and the runners' retry backoff: this test is about
    # the crash itself (see the next test for an outage longer than lost_after).
    cluster.start_coordinator(lost_after_s=10.0)
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

    kill_coordinator_mid_workload(cluster, runners, run_ids)

    # Each ran exactly once: nothing lost, nothing executed twice.
    for run_id, name in names.items():
        assert (markers / name).read_text().splitlines() == [name], run_id
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


def test_a_long_poll_runner_cut_off_stops_its_run_before_another_starts_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Cut off behind half-open sockets (its requests hang, unanswered), a long-poll runner
    stops its run before the coordinator, declaring it lost, gives the run to another
    runner: the two attempts never work at once. (Found by the chaos soak: the runner went
    on for as long as it could not reach the coordinator, beside the next attempt.)"""
    ticks, release = tmp_path / "ticks", tmp_path / "go"
    script = (
        f"while [ ! -e {release} ]; do "
        f'echo "$CORRAL_RUN_ATTEMPT $(date +%s.%N)" >> {ticks}; sleep 0.05; done'
    )
    coordinator = cluster.start_coordinator()
    with FaultProxy(coordinator.port) as proxy:
        cluster.start_runner("cut-off", slots=1, url=proxy.url)
        run_id = cluster.client.create_run("command", command=["sh", "-c", script])["run_id"]
        wait_until(lambda: attempt_ticks(ticks, 1), 30, what="attempt 1 to tick")
        cluster.start_runner("other", slots=1)
        proxy.refusing = True
        proxy.cut_all("server")  # the runner's sockets stay open, and silent

        # Long enough for an attempt 1 still alive to tick beside it.
        wait_until(lambda: len(attempt_ticks(ticks, 2)) >= 10, 30, what="attempt 2 to tick")
        release.touch()
        run = cluster.wait_run(run_id, timeout=30)
    assert (run["status"], run["attempts"]) == ("completed", 2), run
    assert max(attempt_ticks(ticks, 1)) < min(attempt_ticks(ticks, 2))


def attempt_ticks(path: Path, attempt: int) -> list[float]:
    """When the ticking command's attempt ``attempt`` ticked."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [float(t) for a, t in (line.split() for line in lines) if a == str(attempt)]
