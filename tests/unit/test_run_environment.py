"""What a run's process sees of the runner's environment (``corral.runner.environment``)
and how each executor composes it with the profile's and the run's ``env``."""

from __future__ import annotations

from corral.agents.claude import ClaudeExecutor
from corral.agents.command import CommandExecutor
from corral.assignment import Assignment
from corral.ids import RunId
from corral.runner.environment import run_environment
from corral.runs import AgentSpec, RunType

HOST = {
    "PATH": "/usr/bin",
    "HOME": "/home/r",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "TERM": "xterm",
    "CORRAL_TOKEN": "runner-secret",
    "ANTHROPIC_API_KEY": "sk-ant-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "DATABASE_URL": "postgresql://u:pw@db/x",
    "MY_TOOL_HOME": "/opt/tool",
    "MY_TOOLS": "x",
}


def _run(kind: RunType, *, env: dict[str, str], agent: AgentSpec | None = None) -> Assignment:
    return Assignment(
        id=RunId("run_000000000001"),
        type=kind,
        attempt=1,
        prompt=None if kind is RunType.COMMAND else "hello",
        command=("env",) if kind is RunType.COMMAND else (),
        agent=agent,
        env=env,
    )


def test_only_the_allow_list_and_passed_names_reach_a_command() -> None:
    executor = CommandExecutor()
    base = run_environment(HOST, ["MY_TOOL_*"], executor.host_env)
    spec = executor.prepare(_run(RunType.COMMAND, env={"RUN_VAR": "1"}), base)
    assert spec.env == {
        "PATH": "/usr/bin",
        "HOME": "/home/r",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TERM": "xterm",
        "MY_TOOL_HOME": "/opt/tool",  # --pass-env 'MY_TOOL_*' (not MY_TOOLS)
        "RUN_VAR": "1",
    }


def test_the_agent_key_reaches_claude_only_with_the_profile_and_run_env() -> None:
    executor = ClaudeExecutor()
    base = run_environment(HOST, [], executor.host_env)
    agent = AgentSpec(name="a", executor="claude", env={"PROFILE_VAR": "p", "RUN_VAR": "p"})
    spec = executor.prepare(_run(RunType.START_SESSION, env={"RUN_VAR": "r"}, agent=agent), base)
    assert spec.env["ANTHROPIC_API_KEY"] == "sk-ant-secret"
    assert spec.env["PROFILE_VAR"] == "p" and spec.env["RUN_VAR"] == "r"  # the run's wins
    for secret in ("CORRAL_TOKEN", "DATABASE_URL", "MY_TOOL_HOME"):
        assert secret not in spec.env
    command = run_environment(HOST, [], CommandExecutor().host_env)
    assert "ANTHROPIC_API_KEY" not in command and "AWS_SECRET_ACCESS_KEY" not in command
