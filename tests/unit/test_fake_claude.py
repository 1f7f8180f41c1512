"""The fake ``claude`` CLI, run as a real process and read through ClaudeExecutor's observer."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from claude_support import agent_assignment

from corral.agents.base import ResultSeen, SessionSeen, StopReason
from corral.agents.claude import ClaudeExecutor
from corral.assignment import Assignment
from corral.runs import AgentSpec, RunReport, RunStatus, RunType

FAKE = str(Path(__file__).resolve().parents[1] / "fakes" / "claude")
TIMEOUT = 30


@dataclass
class Finished:
    proc: subprocess.CompletedProcess[str]
    report: RunReport
    observations: list[Any]
    messages: list[dict[str, Any]]


def make_run(
    project_dir: Path,
    prompt: str,
    *,
    session_id: str | None = None,
    agent: AgentSpec | None = None,
) -> Assignment:
    return agent_assignment(
        run_id="run_fakeclaude01",
        prompt=prompt,
        project_dir=str(project_dir),
        type=RunType.RESUME_SESSION if session_id else RunType.START_SESSION,
        session_id=session_id,
        agent=agent,
    )


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    # As a runner started from inside Claude Code would see it: the executor must strip it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAUDECODE")}
    env.update(
        {
            "FAKE_CLAUDE_HOME": str(tmp_path / "home"),
            "FAKE_CLAUDE_LEDGER": str(tmp_path / "ledger.jsonl"),
            "CLAUDECODE": "1",
            "CLAUDE_CODE_ENTRYPOINT": "cli",
        }
    )
    return env


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def plain_env(base_env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in base_env.items() if not k.startswith("CLAUDE")}


def run_fake(run: Assignment, base_env: dict[str, str]) -> Finished:
    executor = ClaudeExecutor(binary=FAKE)
    spec = executor.prepare(run, base_env)
    proc = subprocess.run(
        [sys.executable, *spec.argv],
        cwd=spec.cwd,
        env=spec.env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    observer = executor.observer(run)
    observations: list[Any] = []
    for line in proc.stdout.splitlines():
        observations += observer.feed(line)
    messages = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return Finished(proc, observer.outcome(proc.returncode, None), observations, messages)


def call(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, FAKE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def ledger(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_success_speaks_stream_json(project: Path, base_env: dict[str, str]) -> None:
    done = run_fake(make_run(project, "say hello"), base_env)
    assert done.proc.returncode == 0, done.proc.stderr
    kinds = [m["type"] for m in done.messages]
    assert kinds == ["system", "assistant", "result"]
    init, assistant, result = done.messages
    assert init["subtype"] == "init"
    assert init["cwd"] == str(project)
    assert init["model"] == "claude-sonnet-4-5-20250929"
    assert assistant["message"]["content"][0]["type"] == "text"
    assert result["usage"]["output_tokens"] > 0
    session_id = init["session_id"]
    assert done.observations == [SessionSeen(session_id), ResultSeen()]
    report = done.report
    assert report.status is RunStatus.COMPLETED
    assert report.result == "turn 1: say hello"
    assert report.session_id == session_id
    assert report.cost_usd == 0.0123
    assert report.num_turns == 1
    assert report.exit_code == 0


def test_resume_continues_the_same_session(project: Path, base_env: dict[str, str]) -> None:
    first = run_fake(make_run(project, "remember 42"), base_env)
    session_id = first.report.session_id
    assert session_id
    second = run_fake(make_run(project, "what was it?", session_id=session_id), base_env)
    assert second.report.status is RunStatus.COMPLETED
    assert second.messages[0]["session_id"] == session_id
    assert second.report.session_id == session_id
    assert second.report.result == "turn 2: what was it?"
    third = run_fake(make_run(project, "again", session_id=session_id), base_env)
    assert third.report.result == "turn 3: again"


def test_unknown_resume_is_refused(project: Path, base_env: dict[str, str]) -> None:
    session_id = "8a1f0c2e-0000-4000-8000-000000000000"
    done = run_fake(make_run(project, "hi", session_id=session_id), base_env)
    assert done.proc.returncode == 1
    assert done.proc.stdout == ""
    assert done.proc.stderr.strip() == f"No conversation found with session ID: {session_id}"
    assert done.report.status is RunStatus.FAILED
    assert done.report.error == "claude exited with code 1 before its result"


def test_stream_json_requires_verbose(project: Path, base_env: dict[str, str]) -> None:
    proc = call(["-p", "hi", "--output-format", "stream-json"], plain_env(base_env), project)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        "Error: When using --print, --output-format=stream-json requires --verbose"
    )


def test_plain_output_is_just_the_result_text(project: Path, base_env: dict[str, str]) -> None:
    proc = call(["-p", "hi there"], plain_env(base_env), project)
    assert proc.returncode == 0
    assert proc.stdout == "turn 1: hi there\n"


def test_nested_session_guard(project: Path, base_env: dict[str, str]) -> None:
    env = {**plain_env(base_env), "CLAUDECODE": "1"}
    proc = call(["-p", "hi", "--output-format", "stream-json", "--verbose"], env, project)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "cannot be launched inside another Claude Code session" in proc.stderr
    # The executor strips CLAUDECODE from the very same environment, so it runs.
    assert run_fake(make_run(project, "hi"), base_env).report.status is RunStatus.COMPLETED


def test_profile_flags_are_accepted(project: Path, base_env: dict[str, str]) -> None:
    agent = AgentSpec(
        name="researcher",
        executor="claude",
        model="claude-opus-4-1",
        allowed_tools=("Read", "Grep"),
        system_prompt="Be careful.",
        max_turns=3,
        extra_args=("--permission-mode", "acceptEdits", "--dangerously-skip-permissions"),
    )
    done = run_fake(make_run(project, "look around", agent=agent), base_env)
    assert done.report.status is RunStatus.COMPLETED, done.proc.stderr
    assert done.messages[0]["model"] == "claude-opus-4-1"
    assert done.report.result == "turn 1: look around"


def test_a_dashed_prompt_survives(project: Path, base_env: dict[str, str]) -> None:
    done = run_fake(make_run(project, "--not-a-flag"), base_env)
    assert done.report.status is RunStatus.COMPLETED, done.proc.stderr
    assert done.report.result == "turn 1: --not-a-flag"


def test_fail_directive(project: Path, base_env: dict[str, str]) -> None:
    done = run_fake(make_run(project, "go [fake:fail]"), base_env)
    assert done.proc.returncode == 1
    result = done.messages[-1]
    assert (result["subtype"], result["is_error"]) == ("success", True)
    assert done.report.status is RunStatus.FAILED
    assert done.report.error == "simulated failure"
    assert done.report.session_id == done.messages[0]["session_id"]


def test_error_max_turns_directive(project: Path, base_env: dict[str, str]) -> None:
    done = run_fake(make_run(project, "go [fake:error_max_turns]"), base_env)
    assert done.proc.returncode == 1
    assert done.report.status is RunStatus.FAILED
    assert done.report.error is not None and "error_max_turns" in done.report.error


def test_rate_limit_directive(project: Path, base_env: dict[str, str]) -> None:
    done = run_fake(make_run(project, "go [fake:rate_limit]"), base_env)
    assert done.proc.returncode == 1
    assert done.messages[-1]["result"].startswith("Claude AI usage limit reached|")
    assert done.report.status is RunStatus.PENDING
    assert done.report.retry_after_s is not None
    assert 1.0 <= done.report.retry_after_s <= 3.0


def test_crash_directive(project: Path, base_env: dict[str, str]) -> None:
    done = run_fake(make_run(project, "go [fake:crash]"), base_env)
    assert done.proc.returncode == 3
    assert [m["type"] for m in done.messages] == ["system"]
    assert done.report.status is RunStatus.FAILED
    assert done.report.error == "claude exited with code 3 before its result"
    assert done.report.session_id == done.messages[0]["session_id"]


def test_write_directive_edits_the_project(project: Path, base_env: dict[str, str]) -> None:
    prompt = "edit [fake:write=src/notes.txt:hello\\nworld] [fake:write=top.md:# Top]"
    done = run_fake(make_run(project, prompt), base_env)
    assert done.report.status is RunStatus.COMPLETED
    assert (project / "src" / "notes.txt").read_text() == "hello\nworld"
    assert (project / "top.md").read_text() == "# Top"


def test_cost_and_lines_directives(project: Path, base_env: dict[str, str]) -> None:
    done = run_fake(make_run(project, "go [fake:cost=0.5] [fake:lines=3]"), base_env)
    assert [m["type"] for m in done.messages].count("assistant") == 4
    assert done.report.cost_usd == 0.5
    assert done.report.num_turns == 4


def test_ledger_records_each_invocation(
    project: Path, base_env: dict[str, str], tmp_path: Path
) -> None:
    first = run_fake(make_run(project, "one"), base_env)
    session_id = first.report.session_id
    run_fake(make_run(project, "two", session_id=session_id), base_env)
    run_fake(make_run(project, "three", session_id="no-such-session"), base_env)
    entries = ledger(tmp_path)
    assert [e["event"] for e in entries] == ["start", "finish", "start", "finish", "rejected"]
    start, finish = entries[0], entries[1]
    assert start["pid"] == finish["pid"]
    assert start["session_id"] == finish["session_id"] == session_id
    assert start["prompt"] == "one"
    assert start["cwd"] == str(project)
    assert start["resume"] is None
    assert isinstance(start["ts"], float)
    assert entries[2]["resume"] == session_id
    assert entries[2]["pid"] != start["pid"]


@contextlib.contextmanager
def running_fake(run: Assignment, base_env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """The fake for ``run``, its stdout a pipe to read while it runs; killed at the end."""
    spec = ClaudeExecutor(binary=FAKE).prepare(run, base_env)
    with subprocess.Popen(
        [sys.executable, *spec.argv],
        cwd=spec.cwd,
        env=spec.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            yield proc
        finally:
            proc.kill()
            proc.wait(timeout=TIMEOUT)


def test_hang_after_prints_the_result_then_lingers(project: Path, base_env: dict[str, str]) -> None:
    run = make_run(project, "go [fake:hang_after]")
    observer = ClaudeExecutor(binary=FAKE).observer(run)
    with running_fake(run, base_env) as proc:
        assert proc.stdout is not None
        seen: list[Any] = []
        for line in proc.stdout:
            seen += observer.feed(line.rstrip("\n"))
            if ResultSeen() in seen:
                break
        assert ResultSeen() in seen
        assert proc.poll() is None  # still running after its result
    report = observer.outcome(proc.returncode, StopReason.LINGERED_AFTER_RESULT)
    assert report.status is RunStatus.COMPLETED
    assert report.result == "turn 1: go [fake:hang_after]"


def test_wait_while_holds_the_result_until_the_gate_is_gone(
    project: Path, base_env: dict[str, str], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    with running_fake(make_run(project, f"go [fake:wait_while={gate}]"), base_env) as proc:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["subtype"] == "init"
        assert [e["event"] for e in ledger(tmp_path)] == ["start"]  # waiting at the gate
        gate.unlink()
        assert proc.wait(timeout=TIMEOUT) == 0
    assert [e["event"] for e in ledger(tmp_path)] == ["start", "finish"]
