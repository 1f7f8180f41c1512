"""Command runs through the real CLI, coordinator and runner: output, exit codes, timeouts,
cancellation of a whole process group, and the CLI's errors."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from e2e_support import Cluster, Coordinator, Runner, free_port, pid_alive, wait_until


def _run_id_from(stderr: str) -> str:
    """``corral … --wait`` starts with ``RUN_ID queued`` on stderr."""
    first = stderr.strip().splitlines()[0]
    run_id, queued = first.split()
    assert run_id.startswith("run_") and queued == "queued", stderr
    return run_id


def test_command_run_end_to_end(cluster: Cluster, runner: Runner) -> None:
    runner_id = cluster.wait_runner("runner-a")

    done = cluster.cli("run", "--wait", "--", "sh", "-c", "echo hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["hi"]
    run_id = _run_id_from(done.stderr)
    assert done.stderr.strip().endswith(f"{run_id} completed")

    got = cluster.cli("runs", "get", "--json", run_id)
    assert got.returncode == 0, got.stderr
    run = json.loads(got.stdout)
    assert run["status"] == "completed"
    assert run["exit_code"] == 0
    assert run["runner_id"] == runner_id
    assert run["attempts"] == 1
    assert run["command"] == ["sh", "-c", "echo hi"]
    stamps = [run[k] for k in ("created_at", "claimed_at", "started_at", "finished_at")]
    assert all(stamps), run
    times = [datetime.fromisoformat(s) for s in stamps]
    assert times == sorted(times), run

    logs = cluster.cli("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == ["hi"]

    # The process knows which run and attempt it is.
    whoami = cluster.cli(
        "run", "--wait", "--", "sh", "-c", "echo $CORRAL_RUN_ID $CORRAL_RUN_ATTEMPT"
    )
    assert whoami.returncode == 0, whoami.stderr
    assert whoami.stdout.split() == [_run_id_from(whoami.stderr), "1"]

    failing = cluster.cli("run", "--wait", "--", "sh", "-c", "echo oops >&2; exit 7")
    assert failing.returncode == 7
    assert "oops" in failing.stderr
    failed_id = _run_id_from(failing.stderr)
    run = cluster.client.get_run(failed_id)
    assert run["status"] == "failed"
    assert run["exit_code"] == 7
    assert run["attempts"] == 1  # a failed command is not retried
    assert "7" in run["error"]
    assert run["finished_at"] is not None


def test_overall_timeout(cluster: Cluster, runner: Runner) -> None:
    created = cluster.client.create_run(type="command", command=["sleep", "30"], timeout_s=1)
    run = cluster.wait_run(created["run_id"], timeout=15)
    assert run["status"] == "timed_out", run
    assert "timeout" in run["error"]
    # From the claim (the runner spawns right after it; "started" is reported on the way):
    # stopped by the runner at 1 s (SIGTERM ends sleep at once), not by the coordinator's
    # reconciler, which steps in only after a 30 s grace.
    elapsed = (
        datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["claimed_at"])
    ).total_seconds()
    assert 1.0 <= elapsed < 5.0, run
    assert run["attempts"] == 1


@pytest.mark.parametrize("transport", ["poll", "websocket"])
def test_cancel_running_kills_process_group(
    cluster: Cluster, coordinator: Coordinator, transport: str, tmp_path: Path
) -> None:
    """The cancel reaches the runner as a stored command, on either transport."""
    cluster.start_runner("runner-a", extra=("--transport", transport))
    work = tmp_path / "work"
    work.mkdir()
    script = "echo $$ > shellpid; sleep 60 & echo $! > childpid; wait"
    created = cluster.client.create_run(
        type="command", command=["sh", "-c", script], project_dir=str(work)
    )
    run_id = created["run_id"]
    cluster.wait_run(run_id, {"running"})
    wait_until(
        lambda: (work / "childpid").exists() and (work / "childpid").read_text().strip(),
        what="the background sleep to start",
    )
    shell_pid = int((work / "shellpid").read_text())
    child_pid = int((work / "childpid").read_text())
    assert pid_alive(shell_pid) and pid_alive(child_pid)

    cancelled = cluster.cli("runs", "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"{run_id} cancel requested"

    run = cluster.wait_run(run_id, timeout=15)
    assert run["status"] == "cancelled", run
    wait_until(lambda: not pid_alive(shell_pid), 10, what=f"the shell {shell_pid} to die")
    wait_until(lambda: not pid_alive(child_pid), 10, what=f"the background sleep {child_pid}")

    # Cancelled again (an answer lost, a second click), it says so and changes nothing; a
    # run that ended otherwise is refused (test_api_bad_input: cancel-completed-run).
    again = cluster.cli("runs", "cancel", run_id)
    assert (again.returncode, again.stdout.strip()) == (0, f"{run_id} cancelled")
    assert cluster.client.cancel_run(run_id) == cluster.client.get_run(run_id) == run


def test_cli_errors(cluster: Cluster) -> None:
    cluster.start_coordinator()

    missing = cluster.cli("runs", "get", "run_000000000000")
    assert missing.returncode == 3
    assert missing.stdout == ""
    lines = missing.stderr.splitlines()
    assert len(lines) == 1, missing.stderr
    assert "run_not_found" in lines[0]

    unknown = cluster.cli("start", "--agent", "nope", "x")
    assert unknown.returncode != 0
    assert "unknown_agent" in unknown.stderr
    assert cluster.client.list_runs()["runs"] == []  # nothing was created

    nobody = f"http://127.0.0.1:{free_port()}"
    down = cluster.cli("runs", "list", url=nobody)
    assert down.returncode != 0
    lines = down.stderr.splitlines()
    assert len(lines) == 1, down.stderr
    assert "cannot reach" in lines[0] and nobody in lines[0]
    assert "Traceback" not in down.stderr


def test_serve_refuses_timings_that_make_no_sense(cluster: Cluster) -> None:
    for flag in ("--ping-interval", "--runner-lost-threshold", "--ack-interval", "--lost-after"):
        refused = cluster.cli("serve", flag, "0", url="http://127.0.0.1:1")  # none needed
        assert refused.returncode == 2, refused
        assert f"Invalid value for '{flag}'" in refused.stderr
        assert "Traceback" not in refused.stderr
