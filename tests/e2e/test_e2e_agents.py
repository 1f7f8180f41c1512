"""Agent runs with the fake Claude Code CLI: sessions, resumes on the runner holding the
session, hung and lingering agents, and rate limits that give the attempt back."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from e2e_support import Cluster, Runner, pid_alive


def _starts(cluster: Cluster, marker: str) -> list[dict[str, Any]]:
    return [e for e in cluster.ledger() if e["event"] == "start" and marker in e["prompt"]]


def _seconds(run: dict[str, Any], start: str, end: str) -> float:
    return (datetime.fromisoformat(run[end]) - datetime.fromisoformat(run[start])).total_seconds()


def test_agent_session_start_resume_result(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_coordinator()
    cluster.start_runner("runner-a", slots=1)
    runner_a = cluster.wait_runner("runner-a")
    project = tmp_path / "project"
    project.mkdir()
    prompt = "hello [fake:cost=0.25] [fake:write=notes.txt:first]"

    started = cluster.cli(
        "start", "--wait", "--session", "feature-x", "--dir", str(project), prompt
    )
    assert started.returncode == 0, started.stderr
    # --wait shows the agent's stream-json as a transcript, then prints the result.
    *streamed, printed = started.stdout.strip().splitlines()
    assert printed == f"turn 1: {prompt}"
    assert streamed[0].startswith("── session ")
    assert streamed[1:] == [
        f"turn 1: {prompt}",
        "── done · 1 turns · $0.2500 · " + streamed[-1].rsplit(" · ", 1)[1],
    ]
    run_id = started.stderr.strip().splitlines()[-1].split()[0]
    run = cluster.client.get_run(run_id)
    assert run["status"] == "completed", run
    assert run["type"] == "start_session"
    assert run["runner_id"] == runner_a
    assert run["attempts"] == 1
    assert run["cost_usd"] == 0.25
    assert run["result"] == f"turn 1: {prompt}"
    assert run["project_dir"] == str(project)
    (first,) = _starts(cluster, "hello")
    session_id = run["session_id"]
    assert session_id == first["session_id"]  # what the fake's system/init line said
    assert first["cwd"] == str(project) and first["resume"] is None
    assert (project / "notes.txt").read_text() == "first"

    result = cluster.cli("result", session_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"turn 1: {prompt}\n"
    assert cluster.client.session_result("feature-x")["result"] == f"turn 1: {prompt}"  # by name

    # Keep runner-a (the session's) busy, and bring an idle runner-b: the resume must wait
    # for runner-a rather than run where the session does not live.
    gate = tmp_path / "gate"
    blocker = cluster.client.create_run(
        type="command", command=["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.05; done']
    )["run_id"]
    assert cluster.wait_run(blocker, {"running"})["runner_id"] == runner_a
    cluster.start_runner("runner-b", slots=1)
    runner_b = cluster.wait_runner("runner-b")

    resumed = cluster.cli("resume", session_id, "next")
    assert resumed.returncode == 0, resumed.stderr
    resume_id = resumed.stdout.strip()
    # runner-b takes a run created after the resume: so it polled while the resume was
    # pending (the oldest run first), and the resume was not its to take.
    probe = cluster.client.create_run(type="command", command=["true"])["run_id"]
    assert cluster.wait_run(probe)["runner_id"] == runner_b
    assert cluster.client.get_run(resume_id)["status"] == "pending"

    gate.touch()
    run = cluster.wait_run(resume_id)
    assert run["status"] == "completed", run
    assert run["type"] == "resume_session"
    assert run["runner_id"] == runner_a
    assert run["session_id"] == session_id
    assert run["project_dir"] == str(project)
    assert run["result"] == "turn 2: next"
    (second,) = _starts(cluster, "next")
    assert second["resume"] == session_id
    assert second["session_id"] == session_id
    assert second["cwd"] == str(project)
    assert second["turn"] == 2

    latest = cluster.client.session_result(session_id)
    assert latest["result"] == "turn 2: next"
    assert latest["is_error"] is False
    assert latest["last_run_id"] == resume_id
    assert abs(latest["cost_usd"] - (0.25 + 0.0123)) < 1e-9
    assert cluster.client.session_result("feature-x")["last_run_id"] == resume_id


def test_hung_agent_idle_timeout(cluster: Cluster, runner: Runner, tmp_path: Path) -> None:
    client = cluster.client
    hung = client.create_run(
        type="start_session",
        prompt="wait [fake:hang_before]",
        idle_timeout_s=1,
        project_dir=str(tmp_path),
    )["run_id"]
    lingering = client.create_run(
        type="start_session", prompt="answer [fake:hang_after]", project_dir=str(tmp_path)
    )["run_id"]

    run = cluster.wait_run(hung, timeout=20)
    assert run["status"] == "timed_out", run
    assert "idle" in run["error"]
    assert _seconds(run, "started_at", "finished_at") < 10  # 1 s, not the 600 s default
    (start,) = _starts(cluster, "hang_before")
    assert run["session_id"] == start["session_id"]  # announced before it hung
    assert not pid_alive(start["pid"]), "the hung fake claude was left running"

    # The result line is the verdict: the lingering process is killed after the runner's
    # result grace (5 s), and the run completes with its result all the same.
    run = cluster.wait_run(lingering, timeout=30)
    assert run["status"] == "completed", run
    assert run["result"] == "turn 1: answer [fake:hang_after]"
    (start,) = _starts(cluster, "hang_after")
    assert any(e["event"] == "finish" and e["pid"] == start["pid"] for e in cluster.ledger())
    assert not pid_alive(start["pid"]), "the lingering fake claude was left running"


def test_rate_limit_does_not_burn_attempt(cluster: Cluster, runner: Runner, tmp_path: Path) -> None:
    # ``attempts`` counts claims (the lease number); a rate-limited claim is given back, so
    # the attempts a run has used are ``attempts - rate_limited``.
    prompt = "limited [fake:rate_limit_once]"
    run_id = cluster.client.create_run(
        type="start_session", prompt=prompt, max_attempts=1, project_dir=str(tmp_path)
    )["run_id"]

    # Given back until the limit resets (the fake says: in 2 s); its one attempt is unused.
    waiting = cluster.wait_run(
        run_id, {"pending"}, where=lambda r: r["rate_limited"] >= 1, timeout=20
    )
    assert waiting["rate_limited"] == 1, waiting
    assert waiting["attempts"] - waiting["rate_limited"] == 0, waiting
    assert waiting["runner_id"] is None
    assert "rate limited" in waiting["error"]

    run = cluster.wait_run(run_id, timeout=20)
    assert run["status"] == "completed", run  # not failed: max_attempts is 1
    assert run["rate_limited"] == 1
    assert run["attempts"] - run["rate_limited"] == 1
    assert run["result"] == f"turn 1: {prompt}"
    assert len(_starts(cluster, "limited")) == 2
    finishes = [e for e in cluster.ledger() if e["event"] == "finish"]
    assert [f["is_error"] for f in finishes] == [True, False]
