"""The commands people expect (issue 15): ``status`` on one screen, ``doctor``, ``wait``,
``runs retry``, and ``logs`` showing an agent's stream-json as a transcript."""

from __future__ import annotations

import json

from e2e_support import FAKE_CLAUDE, Cluster, Runner


def _run(cluster: Cluster, *command: str) -> str:
    created = cluster.client.create_run(type="command", command=list(command))
    return str(created["run_id"])


def test_status_on_one_screen(cluster: Cluster, runner: Runner) -> None:
    agent = cluster.cli("start", "--wait", "hi [fake:cost=0.0375]")
    assert agent.returncode == 0, agent.stderr
    failed = _run(cluster, "sh", "-c", "echo broken >&2; exit 3")
    cluster.wait_run(failed)

    shown = cluster.cli("status")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"coordinator  {cluster.url}")
    assert lines[1] == "runners      1 live, 0/2 slots in use"
    assert any(line.split()[1:3] == ["runner-a", "active"] for line in lines)
    assert "runs         completed 1  failed 1" in lines
    assert "cost today   $0.0375" in lines
    (failure,) = [line for line in lines if line.startswith(failed)]
    assert failure.endswith("process exited with code 3")
    as_json = json.loads(cluster.cli("status", "--json").stdout)
    assert as_json["stats"]["runs"] == {"completed": 1, "failed": 1}


def test_doctor(cluster: Cluster) -> None:
    cluster.start_coordinator()
    alone = cluster.cli("doctor", "--claude-bin", FAKE_CLAUDE)
    assert alone.returncode == 1
    assert "FAIL  0 live runner(s) — start one" in alone.stdout
    cluster.start_runner("runner-a")
    fine = cluster.cli("doctor", "--claude-bin", FAKE_CLAUDE)
    assert fine.returncode == 0, fine.stdout
    assert [line.split()[0] for line in fine.stdout.splitlines()] == ["ok"] * 4
    assert "(Claude Code, fake)" in fine.stdout
    missing = cluster.cli("doctor", "--claude-bin", "no-such-claude")
    assert missing.returncode == 1
    assert "FAIL  no 'no-such-claude' on PATH here" in missing.stdout
    cluster.env["CORRAL_TOKEN"], token = "crl_not-a-token", cluster.env["CORRAL_TOKEN"]
    refused = cluster.cli("doctor", "--claude-bin", FAKE_CLAUDE)
    cluster.env["CORRAL_TOKEN"] = token
    assert refused.returncode == 1
    (line,) = refused.stdout.splitlines()
    assert line.startswith(f"FAIL  coordinator at {cluster.url} refuses this token")
    assert "pass --token or CORRAL_TOKEN" in line
    checks = json.loads(cluster.cli("doctor", "--json", "--claude-bin", "no-such-claude").stdout)
    assert [c["ok"] for c in checks] == [True, True, True, False]


def test_wait_and_retry(cluster: Cluster, runner: Runner) -> None:
    fine = _run(cluster, "true")
    broken = _run(cluster, "sh", "-c", "exit 4")
    waited = cluster.cli("wait", fine, broken)
    assert waited.returncode == 4, waited.stderr
    assert waited.stderr.splitlines() == [
        f"{fine} completed",
        f"{broken} failed: process exited with code 4",
    ]

    retried = cluster.cli("runs", "retry", broken)
    assert retried.returncode == 0, retried.stderr
    again = retried.stdout.strip()
    assert again != broken
    run = cluster.wait_run(again)
    assert (run["command"], run["status"], run["exit_code"]) == (
        ["sh", "-c", "exit 4"],
        "failed",
        4,
    )
    unfinished = _run(cluster, "sleep", "30")
    refused = cluster.cli("runs", "retry", unfinished)
    assert refused.returncode == 2
    assert "only a finished run is retried" in refused.stderr


def test_logs_show_an_agents_stream_as_a_transcript(cluster: Cluster, runner: Runner) -> None:
    started = cluster.cli("start", "--wait", "look [fake:cost=0.0375] [fake:lines=2]")
    assert started.returncode == 0, started.stderr
    run_id = started.stderr.split()[0]

    shown = cluster.cli("logs", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("── session ") and "model" in lines[0]
    assert lines[1:4] == [
        "working (1/2)",
        "working (2/2)",
        "turn 1: look [fake:cost=0.0375] [fake:lines=2]",
    ]
    assert lines[4].startswith("── done · 3 turns · $0.0375 · ")
    raw = cluster.cli("logs", "--raw", run_id)
    events = [json.loads(line) for line in raw.stdout.splitlines()]
    assert [e["type"] for e in events] == [
        "system",
        "assistant",
        "assistant",
        "assistant",
        "result",
    ]
