"""No one else in: a run sees none of its runner's secrets unless they are let through.

A real coordinator and runner: a command run and an agent run print their whole
environment, and only the allow-list, the ``--pass-env`` names, the run's ``env`` (and,
for the agent alone, its API key) are in it."""

from __future__ import annotations

from pathlib import Path

from e2e_support import Cluster

SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-e2e-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-e2e-secret",
    "DATABASE_PASSWORD": "db-e2e-secret",
    "LET_ME_THROUGH": "passed",
}
IDENTITY = {"CORRAL_RUN_ID", "CORRAL_RUN_ATTEMPT", "CORRAL_RUNNER_INSTANCE"}


def _environment(cluster: Cluster, run_id: str) -> dict[str, str]:
    run = cluster.wait_run(run_id)
    assert run["status"] == "completed", run
    lines = [line["text"] for line in cluster.client.logs(run_id)["lines"]]
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("{"))


def _corral_variables(seen: dict[str, str]) -> set[str]:
    """The CORRAL_* names a run sees: its own identity and its runner's instance (what its
    keeper kills it by), never the runner's token or URL."""
    return {name for name in seen if name.startswith("CORRAL_")}


def test_runs_see_only_the_allowed_environment(cluster: Cluster, tmp_path: Path) -> None:
    # An agent CLI that prints its environment (on stderr) and a successful result.
    agent = tmp_path / "env-agent"
    agent.write_text(
        "#!/bin/sh\nenv >&2\n"
        'echo \'{"type":"result","subtype":"success","is_error":false,"result":"ok"}\'\n'
    )
    agent.chmod(0o755)
    cluster.env.update(SECRETS)
    cluster.start_coordinator()
    cluster.start_runner("runner-a", extra=["--pass-env", "LET_ME_*", "--claude-bin", str(agent)])

    command = cluster.client.create_run(type="command", command=["env"], env={"RUN_VAR": "r"})
    seen = _environment(cluster, command["run_id"])
    assert seen["RUN_VAR"] == "r" and seen["LET_ME_THROUGH"] == "passed"
    assert "PATH" in seen and "HOME" in seen
    for name in ("ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "DATABASE_PASSWORD"):
        assert name not in seen, f"{name} leaked into a command run"
    assert _corral_variables(seen) == IDENTITY, seen

    started = cluster.client.create_run(type="start_session", prompt="hi", env={"RUN_VAR": "a"})
    seen = _environment(cluster, started["run_id"])
    assert seen["ANTHROPIC_API_KEY"] == "sk-ant-e2e-secret"  # the agent needs its key
    assert seen["AWS_SECRET_ACCESS_KEY"] == "aws-e2e-secret"  # and its provider's (Bedrock)
    assert seen["RUN_VAR"] == "a" and seen["LET_ME_THROUGH"] == "passed"
    assert "DATABASE_PASSWORD" not in seen
    assert _corral_variables(seen) == IDENTITY, seen
