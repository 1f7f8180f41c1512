"""WebSocket runners end to end: real ``corral serve`` and ``corral runner --transport
websocket`` processes, and a fault-injecting TCP proxy (``faultproxy.py``) between them.

* 1,000 no-op runs through a proxy that cuts the runner's connection at random every few
  hundred ms: every run completes, and each ran exactly once (a marker file per run gets
  one line per execution).
* The coordinator SIGKILLed mid-workload and restarted on the same port and database: the
  runners reconnect, replay, and nothing runs twice.
* A runner SIGKILLed mid-run: its run is reclaimed after the runner-lost threshold and
  completes on the other runner (attempt 2).
* SIGTERM drains a runner; ``corral runners drain|stop`` force it; ``corral runners list
  --json`` shows the link.
* The link away longer than the runner-lost threshold: a half-open socket (the
  coordinator's end reset, the runner's silent: the runner drops it when no pong comes
  back and stops its work before the run is given away), and a coordinator outage: the
  runner stops its work and the run is given back, not stranded.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from e2e_support import (
    TERMINAL,
    TOKEN,
    Cluster,
    Coordinator,
    Runner,
    all_runs,
    free_port,
    kill_coordinator_mid_workload,
    kill_runner_mid_run,
    timestamp,
    wait_until,
)
from faultproxy import FaultProxy

from corral import __version__
from corral.client import Client

WS = ("--transport", "websocket")


def start_coordinator(
    cluster: Cluster,
    *,
    lost_threshold_s: float | None = None,
    ping_interval_s: float | None = None,
) -> Coordinator:
    """A coordinator on SQLite with the WebSocket link's flags (``Cluster`` has none)."""
    coordinator = Coordinator(
        "coordinator",
        cluster.env,
        cluster.root,
        port=free_port(),
        db=str(cluster.root / "corral.db"),
    )
    if lost_threshold_s is not None:
        coordinator.argv += ["--runner-lost-threshold", str(lost_threshold_s)]
    if ping_interval_s is not None:
        coordinator.argv += ["--ping-interval", str(ping_interval_s)]
    cluster.procs.append(coordinator)
    cluster.coordinator = coordinator
    coordinator.start()
    coordinator.wait_ready()
    return coordinator


def marker_specs(markers: Path, count: int, prefix: str = "run") -> list[dict[str, Any]]:
    """``count`` command runs; each appends its name to its own marker file when it runs."""
    markers.mkdir(exist_ok=True)
    return [
        {
            "type": "command",
            "command": ["sh", "-c", 'echo "$0" >> "$1"', name, str(markers / name)],
        }
        for name in (f"{prefix}-{i:04d}" for i in range(count))
    ]


def assert_each_ran_once(markers: Path, names: list[str]) -> None:
    twice = []
    for name in names:
        lines = (markers / name).read_text().splitlines() if (markers / name).exists() else []
        if lines != [name]:
            twice.append((name, len(lines)))
    assert not twice, f"runs not executed exactly once (name, executions): {twice[:20]}"
    assert sorted(p.name for p in markers.iterdir()) == sorted(names)


def counts(cluster: Cluster) -> dict[str, int]:
    result: dict[str, int] = cluster.client.call("GET", "/stats")["runs"]
    return result


# ---- the proxy itself -----------------------------------------------------------------------


def test_fault_proxy_forwards_delays_and_cuts(cluster: Cluster) -> None:
    coordinator = start_coordinator(cluster)
    with FaultProxy(coordinator.port, delay_s=0.05) as proxy:
        assert cluster.client.call("GET", "/health") == {"status": "ok"}  # direct
        with Client(proxy.url, token=TOKEN) as through:
            started = time.monotonic()
            assert through.request("GET", "/health") == {"status": "ok"}
            assert time.monotonic() - started >= 0.1  # 50 ms each way
            assert proxy.open_connections() == 1  # kept alive
            assert proxy.cut_all() == 1
            assert proxy.open_connections() == 0
            assert through.request("GET", "/health") == {"status": "ok"}  # a new connection
        assert proxy.stats.accepted == 2 and proxy.stats.cuts["both"] == 1


# ---- exactly once through random cuts -------------------------------------------------------


@pytest.mark.timeout(300)
def test_exactly_once_through_random_connection_cuts(cluster: Cluster, tmp_path: Path) -> None:
    runs_total = 1000
    coordinator = start_coordinator(cluster)
    with FaultProxy(coordinator.port, delay_s=0.002, jitter_s=0.008, seed=7) as proxy:
        runner = cluster.start_runner("runner-a", slots=8, url=proxy.url, extra=WS)
        runner_id = cluster.wait_runner("runner-a")
        markers = tmp_path / "markers"
        specs = marker_specs(markers, runs_total)
        names = [s["command"][3] for s in specs]
        # Every 0.2–0.6 s, cut the live connection if there is one: both ends reset, or
        # only the runner's (the coordinator keeps a silent socket until the runner's next
        # one evicts it). The runner reconnects 1–1.25 s after a cut, so a connection lives
        # for a few hundred ms, and the link is down most of the time.
        proxy.start_chaos(interval_s=(0.2, 0.6), modes=("both", "client"))
        started = time.monotonic()
        for offset in range(0, runs_total, 250):
            cluster.client.create_runs(specs[offset : offset + 250])

        def completed(at_least: int) -> bool:
            return counts(cluster).get("completed", 0) >= at_least

        # A guard against a hang, not a speed goal: a loaded machine needs twice the ~40 s.
        wait_until(lambda: completed(runs_total * 9 // 10), 150, interval=0.2, what="90% done")
        # The cuts stop before the end: whatever a cut had left unsent must now be sent
        # on the last connection, not on some later reconnect.
        proxy.stop_chaos()
        stats = replace(proxy.stats, cuts=dict(proxy.stats.cuts))  # before the teardown's

        def finished() -> bool:
            c = counts(cluster)
            return sum(c.get(s, 0) for s in TERMINAL) >= runs_total

        wait_until(finished, 20, interval=0.2, what="every run to finish")
        elapsed = time.monotonic() - started

    final = all_runs(cluster, runs_total)
    statuses = {r["status"] for r in final}
    assert statuses == {"completed"}, statuses
    assert all(r["attempts"] == 1 and r["runner_id"] == runner_id for r in final)
    assert_each_ran_once(markers, names)
    # The faults really happened, many times, while the runs went through.
    assert stats.total_cuts >= 10, stats
    assert stats.accepted >= 10, stats
    assert runner.alive()
    assert cluster.runner_by_id(runner_id)["state"] == "active"
    print(f"1000 runs in {elapsed:.1f}s through {stats.total_cuts} cuts: {stats}")


# ---- processes killed -----------------------------------------------------------------------


def test_coordinator_killed_mid_workload(cluster: Cluster, tmp_path: Path) -> None:
    start_coordinator(cluster)
    runners = [cluster.start_runner(n, slots=4, wait=False, extra=WS) for n in ("a", "b")]
    ids = {r.name: cluster.wait_runner(r.name) for r in runners}
    markers = tmp_path / "markers"
    specs = marker_specs(markers, 80)
    for i, spec in enumerate(specs):
        if i % 3 == 0:  # some runs are still going when the coordinator dies
            spec["command"][2] = 'sleep 0.3; echo "$0" >> "$1"'
    names = [s["command"][3] for s in specs]
    run_ids = [r["run_id"] for r in cluster.client.create_runs(specs)]

    final = kill_coordinator_mid_workload(cluster, runners, run_ids)

    assert all(r["attempts"] == 1 for r in final), [r for r in final if r["attempts"] != 1]
    assert_each_ran_once(markers, names)
    for r in runners:
        assert r.alive()
        assert cluster.wait_runner(r.name) == ids[r.name]  # the same identity, active again
        assert r.log().count("connected (") >= 2  # it reconnected
    assert {x["transport"] for x in cluster.client.runners()} == {"websocket"}


def test_runner_killed_mid_run_is_reclaimed(cluster: Cluster, tmp_path: Path) -> None:
    start_coordinator(cluster, lost_threshold_s=3.0, ping_interval_s=1.0)
    reclaimed_after = kill_runner_mid_run(cluster, tmp_path, sleep_s=2, extra=WS)
    # Reclaimed after the 3 s threshold (not at once, and not after the 15 s default).
    assert 3.0 <= reclaimed_after <= 15.0


# ---- draining and stopping ------------------------------------------------------------------


def gate_script(gate: Path, marker: Path) -> list[str]:
    """A run that waits for ``gate``; ``marker`` gets "start" and "end" lines."""
    script = (
        f'echo start >> "{marker}"; while [ ! -e "{gate}" ]; do sleep 0.05; done; '
        f'echo end >> "{marker}"; echo finished'
    )
    return ["sh", "-c", script]


class GatedRun(NamedTuple):
    """What ``start_gated_run`` started: the runner, and its run waiting at the gate."""

    runner: Runner
    runner_id: str
    run_id: str
    gate: Path
    marker: Path


def start_gated_run(cluster: Cluster, tmp_path: Path, *, slots: int) -> GatedRun:
    """WebSocket runner "runner-a" with ``slots`` slots, running a ``gate_script`` run."""
    runner = cluster.start_runner("runner-a", slots=slots, extra=WS)
    runner_id = cluster.wait_runner("runner-a")
    gate, marker = tmp_path / "gate", tmp_path / "marker"
    run_id = cluster.client.create_run(type="command", command=gate_script(gate, marker))["run_id"]
    cluster.wait_run(run_id, {"running"})
    return GatedRun(runner, runner_id, run_id, gate, marker)


def test_sigterm_drains_a_websocket_runner(cluster: Cluster, tmp_path: Path) -> None:
    start_coordinator(cluster)
    runner, runner_id, first, gate, marker = start_gated_run(cluster, tmp_path, slots=2)

    runner.send(signal.SIGTERM)
    cluster.wait_runner("runner-a", state="draining", timeout=10)
    assert runner.alive()
    # Created while it drains, with a slot free: not for this runner.
    late = cluster.client.create_run(type="command", command=["echo", "late"], max_attempts=1)
    gate.touch()

    assert runner.wait(30) == 0
    run = cluster.client.get_run(first)
    assert run["status"] == "completed" and run["runner_id"] == runner_id, run
    assert [line["text"] for line in cluster.client.logs(first)["lines"]] == ["finished"]
    late_run = cluster.client.get_run(late["run_id"])
    assert late_run["status"] == "pending" and late_run["attempts"] == 0, late_run
    wait_until(lambda: cluster.runner_by_id(runner_id)["state"] == "stopped", 10)
    assert marker.read_text().split() == ["start", "end"]


def test_cli_drain_lets_work_finish_then_the_runner_leaves(
    cluster: Cluster, tmp_path: Path
) -> None:
    start_coordinator(cluster)
    runner, runner_id, first, gate, marker = start_gated_run(cluster, tmp_path, slots=2)

    done = cluster.cli("runners", "drain", runner_id, "--grace", "60")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [runner_id, "draining"]
    late = cluster.client.create_run(type="command", command=["echo", "late"])["run_id"]
    assert runner.alive()
    gate.touch()

    assert runner.wait(30) == 0
    assert cluster.client.get_run(first)["status"] == "completed"
    assert cluster.client.get_run(late)["status"] == "pending"
    wait_until(lambda: cluster.runner_by_id(runner_id)["state"] == "stopped", 10)
    assert marker.read_text().split() == ["start", "end"]


def test_cli_drain_grace_stops_work_that_outlasts_it(cluster: Cluster, tmp_path: Path) -> None:
    """The coordinator's grace is the one that counts, not the runner's own (120 s)."""
    start_coordinator(cluster)
    runner, runner_id, run_id, _, marker = start_gated_run(cluster, tmp_path, slots=1)

    asked = time.monotonic()
    done = cluster.cli("runners", "drain", runner_id, "--grace", "1")
    assert done.returncode == 0, done.stderr
    assert runner.wait(30) == 0
    assert time.monotonic() - asked < 20  # the 1 s grace and the kill grace, not 120 s
    run = cluster.client.get_run(run_id)
    assert run["status"] == "pending" and run["attempts"] == 1, run  # given back
    assert marker.read_text().split() == ["start"]


def test_cli_stop_gives_runs_to_another_runner(cluster: Cluster, tmp_path: Path) -> None:
    start_coordinator(cluster)
    first, first_id, run_id, gate, marker = start_gated_run(cluster, tmp_path, slots=1)
    cluster.start_runner("runner-b", slots=1, extra=WS)
    second_id = cluster.wait_runner("runner-b")

    done = cluster.cli("runners", "stop", first_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [first_id, "stopped"]
    cluster.wait_run(run_id, {"running"}, where=lambda r: r["runner_id"] == second_id)
    # The stopped runner stops its copy: it no longer holds the run.
    wait_until(lambda: not first.alive(), 30, what="the stopped runner to exit")
    assert first.wait(1) == 0
    gate.touch()

    run = cluster.wait_run(run_id)
    assert run["status"] == "completed" and run["attempts"] == 2, run
    assert run["runner_id"] == second_id
    assert marker.read_text().split() == ["start", "start", "end"]  # only attempt 2 ended
    assert cluster.runner_by_id(first_id)["state"] == "stopped"


# ---- what the CLI shows ---------------------------------------------------------------------


def test_runners_list_json_shows_the_link(cluster: Cluster, tmp_path: Path) -> None:
    start_coordinator(cluster, ping_interval_s=0.5)
    cluster.start_runner("ws-runner", slots=3, extra=(*WS, "--labels", "ws"))
    cluster.start_runner("poll-runner", slots=2, extra=("--transport", "poll"))
    gate, marker = tmp_path / "gate", tmp_path / "marker"
    run_id = cluster.client.create_run(
        type="command", command=gate_script(gate, marker), labels=["ws"]
    )["run_id"]
    cluster.wait_run(run_id, {"running"})

    def listed() -> dict[str, dict[str, Any]]:
        done = cluster.cli("runners", "list", "--json")
        assert done.returncode == 0, done.stderr
        return {r["name"]: r for r in json.loads(done.stdout)}

    found = listed()
    ws = found["ws-runner"]
    assert ws["transport"] == "websocket"
    assert ws["state"] == "active"
    assert (ws["slots_used"], ws["slots_total"]) == (1, 3)
    assert ws["version"] == __version__
    assert found["poll-runner"]["transport"] == "poll"
    assert (found["poll-runner"]["slots_used"], found["poll-runner"]["slots_total"]) == (0, 2)
    # Pings move its last heartbeat on.
    beat = timestamp(ws["last_heartbeat_at"])
    assert abs(time.time() - beat) < 5
    wait_until(
        lambda: timestamp(listed()["ws-runner"]["last_heartbeat_at"]) > beat,
        10,
        interval=0.2,
        what="a newer heartbeat",
    )
    gate.touch()
    cluster.wait_run(run_id)
    wait_until(lambda: listed()["ws-runner"]["slots_used"] == 0, 10, what="the slot freed")


# ---- the link away longer than the runner-lost threshold -----------------------------------


def test_coordinator_side_vanishes_silently(cluster: Cluster, tmp_path: Path) -> None:
    """The coordinator's end of the runner's socket is reset while the runner's end stays
    open and hears nothing (a half-open connection). The coordinator declares the runner
    lost after its threshold and gives the run to another runner — runner-b, or runner-a
    itself under the new identity it takes after giving up its lease: the first copy must
    have stopped by then."""
    coordinator = start_coordinator(cluster, lost_threshold_s=3.0, ping_interval_s=1.0)
    with FaultProxy(coordinator.port) as proxy:
        runner_a = cluster.start_runner("runner-a", slots=1, url=proxy.url, extra=WS)
        first_id = cluster.wait_runner("runner-a")
        gate, log = tmp_path / "gate", tmp_path / "log"
        script = (
            f'echo "start $$ $(date +%s.%N)" >> "{log}"; '
            f'trap \'echo "stop $$ $(date +%s.%N)" >> "{log}"; exit 143\' TERM; '
            f'while [ ! -e "{gate}" ]; do sleep 0.05; done; echo done'
        )
        run_id = cluster.client.create_run(type="command", command=["sh", "-c", script])["run_id"]
        cluster.wait_run(run_id, {"running"})
        cluster.start_runner("runner-b", slots=1, extra=WS)
        cluster.wait_runner("runner-b")

        # Its reconnects are refused too: one that got back within its lease would keep
        # the run (its retries quicken as the lease runs out), and nothing would be lost.
        proxy.refusing = True
        assert proxy.cut_all("server") == 1
        again = cluster.wait_run(run_id, {"running"}, where=lambda r: r["runner_id"] != first_id)
        proxy.refusing = False

        def events() -> list[tuple[str, str, float]]:
            lines = log.read_text().splitlines()
            return [(w[0], w[1], float(w[2])) for w in (line.split() for line in lines)]

        wait_until(lambda: len([e for e in events() if e[0] == "start"]) == 2, 10)
        (first_start, second_start) = [e for e in events() if e[0] == "start"]
        stops = [e for e in events() if e[0] == "stop"]
        assert [s[1] for s in stops] == [first_start[1]], events()  # only the first copy
        assert stops[0][2] <= second_start[2], f"the two copies overlapped: {events()}"
        gate.touch()
        run = cluster.wait_run(run_id)
        assert run["status"] == "completed" and run["attempts"] == 2, run
        assert run["runner_id"] == again["runner_id"]
        assert cluster.runner_by_id(first_id)["state"] == "lost"
        assert "dropping the coordinator socket: no answer" in runner_a.log()


def test_coordinator_outage_longer_than_the_threshold(cluster: Cluster, tmp_path: Path) -> None:
    """The coordinator is away longer than the runner-lost threshold, so the runner stops
    its work; the run must then be given back and run again, not left 'running'."""
    # Timing (t0: the kill; the runner retries at t0+1, +3, +7–8.75 s and stops its work
    # at t0+5): the coordinator is back at ~t0+6, so the runner reconnects within the
    # coordinator's restart grace (5 s), before anything declared it lost.
    coordinator = start_coordinator(cluster, lost_threshold_s=5.0, ping_interval_s=1.0)
    runner, _, run_id, gate, marker = start_gated_run(cluster, tmp_path, slots=1)
    coordinator.send(signal.SIGKILL)
    coordinator.wait(10)
    wait_until(lambda: "stopping all work" in runner.log(), 15, what="the runner to give up")
    assert marker.read_text().split() == ["start"]
    cluster.restart_coordinator()
    gate.touch()
    run = cluster.wait_run(run_id, timeout=30)  # given back, and run again
    assert run["status"] == "completed" and run["attempts"] == 2, run
    # It ran once to its end: the first copy was stopped before the gate opened.
    assert marker.read_text().split() == ["start", "start", "end"]
    assert runner.alive()
