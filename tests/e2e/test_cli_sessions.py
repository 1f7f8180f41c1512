"""Sessions from the CLI (issue 15): a taken name is refused with the way on, a session
with no result says why, and ``sessions list|show`` show runs, results and total cost."""

from __future__ import annotations

import json
from pathlib import Path

from e2e_support import CORRAL, Cluster, Proc, Runner, wait_until


def test_session_names_results_and_listing(cluster: Cluster, runner: Runner) -> None:
    first = cluster.cli("start", "--wait", "--session", "demo", "hello [fake:cost=0.0375]")
    assert first.returncode == 0, first.stderr

    taken = cluster.cli("start", "--session", "demo", "again")
    assert taken.returncode == 4, taken.stderr
    assert "session 'demo' exists" in taken.stderr
    assert "corral resume demo" in taken.stderr and "--new" in taken.stderr
    assert len(cluster.client.list_runs()["runs"]) == 1  # nothing was created

    resumed = cluster.cli("resume", "--wait", "demo", "more [fake:cost=0.0125]")
    assert resumed.returncode == 0, resumed.stderr
    other = cluster.cli("start", "--wait", "--new", "--session", "demo", "over [fake:cost=1.5]")
    assert other.returncode == 0, other.stderr

    listed = cluster.cli("sessions", "list")
    assert listed.returncode == 0, listed.stderr
    header, newest, older = listed.stdout.splitlines()
    assert header.split()[:5] == ["name", "session", "agent", "runs", "cost"]
    assert newest.split()[0] == "demo" and "$1.50" in newest.split()
    assert older.split()[3:5] == ["2", "$0.0500"]  # two runs, their costs summed
    assert "turn 2: more [fake:cost=0.0125]" in older

    shown = cluster.cli("sessions", "show", older.split()[1])
    assert shown.returncode == 0, shown.stderr
    assert "total cost: $0.0500" in shown.stdout
    run_lines = [line for line in shown.stdout.splitlines() if line.startswith("run_")]
    assert [line.split()[1:3] for line in run_lines] == [
        ["start_session", "completed"],
        ["resume_session", "completed"],
    ]
    as_json = json.loads(cluster.cli("sessions", "list", "--json").stdout)
    assert [s["runs"] for s in as_json] == [1, 2]


def test_result_of_a_session_whose_only_run_failed_says_why(
    cluster: Cluster, runner: Runner
) -> None:
    started = cluster.cli(
        "start", "--wait", "--session", "broken", "--dir", "/nonexistent/place", "hi"
    )
    assert started.returncode != 0
    run_id = started.stderr.split()[0]

    missing = cluster.cli("result", "broken")
    assert missing.returncode == 3
    (line,) = missing.stderr.splitlines()
    assert f"session 'broken' has no result: its run {run_id} failed: " in line
    never = cluster.cli("result", "nobody")
    assert never.returncode == 3
    assert "no run was ever started with that name" in never.stderr


def test_a_waiting_resume_names_the_runner_holding_its_session(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_coordinator()
    cluster.start_runner("holder", slots=1)
    started = cluster.cli("start", "--wait", "--session", "held", "first")
    assert started.returncode == 0, started.stderr
    gate = tmp_path / "gate"
    busy = cluster.client.create_run(
        type="command", command=["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.05; done']
    )["run_id"]
    cluster.wait_run(busy, {"running"})
    cluster.start_runner("idle", slots=1)  # free, but not where the session lives

    resuming = Proc(
        "resume",
        [CORRAL, "resume", "--wait", "held", "second"],
        {**cluster.env, "CORRAL_URL": cluster.url},
        cluster.root,
    )
    cluster.procs.append(resuming)
    resuming.start()
    wait_until(
        lambda: (
            "waiting for runner holder, which holds the session: its slots are busy"
            in resuming.log()
        ),
        what="the resume to say what it waits for",
    )
    gate.touch()
    assert resuming.wait(60) == 0, resuming.log()
    assert "turn 2: second" in resuming.log()
