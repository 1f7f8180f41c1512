"""ClaudeExecutor: the argv and env it builds, and how it reads stream-json."""

from __future__ import annotations

import json
from typing import Any

import pytest
from claude_support import agent_assignment

from corral.agents.base import ResultSeen, SessionSeen, StopReason
from corral.agents.claude import AgentMcp, ClaudeExecutor
from corral.assignment import Assignment
from corral.errors import InvalidRequest
from corral.runs import AgentSpec, RunStatus, RunType

NOW = 1_700_000_000.0
SID = "0b7d5a4e-7f6c-4f64-9a53-2f4d3c1e9a10"


def make_run(
    *,
    type: RunType = RunType.START_SESSION,
    prompt: str | None = "fix the bug",
    session_id: str | None = None,
    agent: AgentSpec | None = None,
    project_dir: str | None = "/work/proj",
    env: dict[str, str] | None = None,
) -> Assignment:
    return agent_assignment(
        run_id="run_0123456789ab",
        prompt=prompt,
        project_dir=project_dir,
        type=type,
        session_id=session_id,
        agent=agent,
        env=env,
    )


def executor(**kwargs: Any) -> ClaudeExecutor:
    return ClaudeExecutor(now=lambda: NOW, **kwargs)


def init_line(session_id: str = SID) -> str:
    return json.dumps(
        {"type": "system", "subtype": "init", "cwd": "/work/proj", "session_id": session_id}
    )


def result_line(**fields: Any) -> str:
    message = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 2,
        "result": "done",
        "session_id": SID,
        "total_cost_usd": 0.0123,
        "usage": {"input_tokens": 10, "output_tokens": 20},
    }
    message.update(fields)
    return json.dumps(message)


def observe(*lines: str, run: Assignment | None = None, **kwargs: Any) -> Any:
    observer = executor(**kwargs).observer(run or make_run())
    for line in lines:
        observer.feed(line)
    return observer


# --- prepare -------------------------------------------------------------------------


def test_argv_for_a_plain_start() -> None:
    spec = executor().prepare(make_run(), {})
    assert spec.argv == (
        "claude",
        "-p",
        "fix the bug",
        "--output-format",
        "stream-json",
        "--verbose",
    )
    assert spec.cwd == "/work/proj"
    assert spec.exit_grace_after_result_s == 5.0


def test_argv_carries_the_profile_then_extra_args_then_resume() -> None:
    agent = AgentSpec(
        name="researcher",
        executor="claude",
        model="sonnet",
        allowed_tools=("Read", "Grep"),
        system_prompt="Be careful.",
        max_turns=7,
        extra_args=("--permission-mode", "acceptEdits"),
    )
    run = make_run(type=RunType.RESUME_SESSION, session_id=SID, agent=agent)
    spec = ClaudeExecutor(binary="/opt/claude", result_grace_s=2.5).prepare(run, {})
    assert spec.argv == (
        "/opt/claude",
        "-p",
        "fix the bug",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "sonnet",
        "--allowedTools",
        "Read,Grep",
        "--append-system-prompt",
        "Be careful.",
        "--max-turns",
        "7",
        "--permission-mode",
        "acceptEdits",
        "--resume",
        SID,
    )
    assert spec.exit_grace_after_result_s == 2.5


def test_an_empty_profile_adds_no_flags() -> None:
    spec = executor().prepare(make_run(agent=AgentSpec(name="claude", executor="claude")), {})
    assert spec.argv[3:] == ("--output-format", "stream-json", "--verbose")


def test_a_prompt_that_looks_like_a_flag_comes_after_the_options() -> None:
    spec = executor().prepare(make_run(prompt="--help me"), {})
    assert spec.argv[:2] == ("claude", "-p")
    assert spec.argv[-2:] == ("--", "--help me")
    assert spec.argv.count("--help me") == 1


def test_a_run_without_prompt_or_session_to_resume_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        executor().prepare(make_run(prompt=None), {})
    with pytest.raises(InvalidRequest):
        executor().prepare(make_run(type=RunType.RESUME_SESSION, session_id=None), {})


def test_env_merges_run_env_and_strips_claude_code_markers() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "CLAUDECODE": "1",
        "CLAUDECODE_SOMETHING": "x",
        "CLAUDE_CODE_ENTRYPOINT": "cli",
        "ANTHROPIC_API_KEY": "k",
    }
    run = make_run(env={"HOME": "/home/run", "FOO": "bar", "CLAUDECODE": "1"})
    env = executor().prepare(run, base).env
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/run",
        "FOO": "bar",
        "ANTHROPIC_API_KEY": "k",
    }
    assert base["CLAUDECODE"] == "1"  # the caller's dict is left alone


def test_an_agent_token_gives_the_agent_corrals_mcp_server_without_showing_the_token() -> None:
    mcp = AgentMcp(command=("/venv/bin/corral", "mcp", "--url", "http://c:8765"), token="crl_x")
    resume = make_run(type=RunType.RESUME_SESSION, session_id=SID)
    spec_run_id = resume.id
    spec = ClaudeExecutor(mcp=mcp).prepare(resume, {})
    at = spec.argv.index("--mcp-config")
    assert spec.argv[at + 2 : at + 4] == ("--resume", SID)  # the config is one word
    assert json.loads(spec.argv[at + 1]) == {
        "mcpServers": {
            "corral": {
                "type": "stdio",
                "command": "/venv/bin/corral",
                "args": ["mcp", "--url", "http://c:8765"],
                # The agent's run: its session is the parent of the sub-agents it starts.
                "env": {"CORRAL_TOKEN": "${CORRAL_TOKEN}", "CORRAL_RUN_ID": "${CORRAL_RUN_ID}"},
            }
        }
    }
    assert not any("crl_x" in arg for arg in spec.argv)
    assert spec.env["CORRAL_TOKEN"] == "crl_x"
    assert spec.env["CORRAL_RUN_ID"] == spec_run_id
    assert "crl_x" not in repr(mcp)
    plain = executor().prepare(make_run(), {})
    assert "--mcp-config" not in plain.argv and "CORRAL_TOKEN" not in plain.env


# --- observer: feed ------------------------------------------------------------------


def test_init_reveals_the_session_once() -> None:
    observer = executor().observer(make_run())
    assert observer.feed(init_line()) == [SessionSeen(SID)]
    assert observer.feed(init_line()) == []


def test_result_is_announced() -> None:
    observer = executor().observer(make_run())
    assert observer.feed(result_line()) == [ResultSeen()]


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "not json at all",
        "{broken",
        "[1, 2, 3]",
        "42",
        "null",
        '"a string"',
        '{"type": "system", "subtype": "init"}',
        '{"type": "system", "subtype": "init", "session_id": 5}',
        '{"type": "assistant", "message": {"content": []}}',
        '{"no": "type"}',
    ],
)
def test_garbage_and_other_lines_reveal_nothing(line: str) -> None:
    observer = executor().observer(make_run())
    assert observer.feed(line) == []
    report = observer.outcome(0, None)
    assert report.status is RunStatus.FAILED
    assert report.session_id is None


def test_absurdly_deep_json_reveals_nothing() -> None:
    assert executor().observer(make_run()).feed("[" * 100_000) == []


# --- observer: outcome ---------------------------------------------------------------


def test_success() -> None:
    report = observe(init_line(), '{"type": "assistant"}', result_line()).outcome(0, None)
    assert report.status is RunStatus.COMPLETED
    assert report.result == "done"
    assert report.session_id == SID
    assert report.cost_usd == 0.0123
    assert report.usage == {"input_tokens": 10, "output_tokens": 20}
    assert report.num_turns == 2
    assert report.exit_code == 0
    assert report.error is None
    assert report.retry_after_s is None


def test_is_error_with_subtype_success_fails() -> None:
    line = result_line(is_error=True, result="Invalid API key · Please run /login")
    report = observe(init_line(), line).outcome(1, None)
    assert report.status is RunStatus.FAILED
    assert report.error == "Invalid API key · Please run /login"
    assert report.result == "Invalid API key · Please run /login"
    assert report.session_id == SID
    assert report.exit_code == 1


def test_is_error_without_text_names_the_subtype() -> None:
    line = json.dumps({"type": "result", "subtype": "success", "is_error": True})
    report = observe(line).outcome(1, None)
    assert report.status is RunStatus.FAILED
    assert report.error == "success"


@pytest.mark.parametrize("is_error", [True, False])
@pytest.mark.parametrize("subtype", ["error_max_turns", "error_during_execution"])
def test_error_subtypes_fail_naming_the_subtype(subtype: str, is_error: bool) -> None:
    message = {
        "type": "result",
        "subtype": subtype,
        "is_error": is_error,
        "num_turns": 7,
        "session_id": SID,
        "total_cost_usd": 0.5,
    }
    report = observe(json.dumps(message)).outcome(1, None)
    assert report.status is RunStatus.FAILED
    assert report.error is not None and subtype in report.error
    assert report.session_id == SID
    assert report.num_turns == 7
    assert report.cost_usd == 0.5


def test_rate_limit_with_reset_epoch_waits_until_then() -> None:
    line = result_line(is_error=True, result=f"Claude AI usage limit reached|{int(NOW) + 90}")
    report = observe(init_line(), line).outcome(1, None)
    assert report.status is RunStatus.PENDING
    assert report.retry_after_s == 90.0
    assert report.session_id == SID
    assert report.error is not None and "usage limit" in report.error


def test_rate_limit_with_a_past_reset_waits_at_least_a_second() -> None:
    line = result_line(is_error=True, result=f"Claude AI usage limit reached|{int(NOW) - 500}")
    report = observe(line).outcome(1, None)
    assert report.status is RunStatus.PENDING
    assert report.retry_after_s == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "Claude AI usage limit reached",
        "API Error: Rate limit exceeded",
        'API Error: 429 {"type":"error"}',
        "API Error: Overloaded",
    ],
)
def test_rate_limit_without_epoch_backs_off(text: str) -> None:
    report = observe(result_line(is_error=True, result=text), rate_limit_backoff_s=45.0).outcome(
        1, None
    )
    assert report.status is RunStatus.PENDING
    assert report.retry_after_s == 45.0


def test_api_error_status_429_is_a_rate_limit() -> None:
    line = result_line(is_error=True, result="API Error", api_error_status=429)
    report = observe(line).outcome(1, None)
    assert report.status is RunStatus.PENDING
    assert report.retry_after_s == 60.0


def test_rate_limit_words_in_a_successful_result_do_not_count() -> None:
    report = observe(result_line(result="I added a rate limit of 429 per hour")).outcome(0, None)
    assert report.status is RunStatus.COMPLETED


def test_result_then_lingered_kill_still_uses_the_result() -> None:
    report = observe(init_line(), result_line()).outcome(-9, StopReason.LINGERED_AFTER_RESULT)
    assert report.status is RunStatus.COMPLETED
    assert report.result == "done"
    assert report.exit_code == -9


@pytest.mark.parametrize("reason", list(StopReason))
def test_a_result_counts_whatever_stopped_the_process_afterwards(reason: StopReason) -> None:
    report = observe(result_line(is_error=True, result="boom")).outcome(None, reason)
    assert report.status is RunStatus.FAILED
    assert report.error == "boom"


def test_no_result_and_a_crash_fails() -> None:
    report = observe(init_line()).outcome(3, None)
    assert report.status is RunStatus.FAILED
    assert report.error == "claude exited with code 3 before its result"
    assert report.session_id == SID
    assert report.exit_code == 3


def test_no_result_and_a_clean_exit_still_fails() -> None:
    report = observe(init_line()).outcome(0, None)
    assert report.status is RunStatus.FAILED
    assert report.error == "claude exited with code 0 before its result"


@pytest.mark.parametrize("reason", [StopReason.TIMEOUT, StopReason.IDLE_TIMEOUT])
def test_timeouts_keep_the_session_id(reason: StopReason) -> None:
    report = observe(init_line()).outcome(-15, reason)
    assert report.status is RunStatus.TIMED_OUT
    assert report.session_id == SID
    assert report.exit_code == -15
    assert report.error


def test_cancel_and_shutdown_before_a_result() -> None:
    cancelled = observe(init_line()).outcome(-15, StopReason.CANCELLED)
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.session_id == SID
    shutdown = observe(init_line()).outcome(-15, StopReason.RUNNER_SHUTDOWN)
    assert shutdown.status is RunStatus.PENDING
    assert shutdown.session_id == SID


def test_a_resumed_run_knows_its_session_before_init() -> None:
    run = make_run(type=RunType.RESUME_SESSION, session_id=SID)
    report = observe(run=run).outcome(1, None)
    assert report.session_id == SID


def test_malformed_result_fields_are_dropped_not_raised() -> None:
    line = json.dumps(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": 5,
            "total_cost_usd": "cheap",
            "usage": [1],
            "num_turns": "two",
        }
    )
    report = observe(line).outcome(0, None)
    assert report.status is RunStatus.COMPLETED
    assert report.result is None
    assert report.cost_usd is None
    assert report.usage is None
    assert report.num_turns is None


def test_an_agent_whose_minted_token_has_not_come_gets_no_mcp_server() -> None:
    mcp = AgentMcp(command=("/venv/bin/corral", "mcp", "--url", "http://c:8765"), token=None)
    spec = ClaudeExecutor(mcp=mcp).prepare(make_run(), {})
    assert "--mcp-config" not in spec.argv
    assert "CORRAL_TOKEN" not in spec.env
