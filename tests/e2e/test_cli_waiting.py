"""Following a run from the CLI (issue 15): a run that cannot run yet says why, at
submit time and while it is waited for; ``--wait`` prints the id first, ends with the
command's own exit status and the reason of a failure, and a Ctrl-C says the run goes on;
``logs -f`` ends with the run's status and lives through a coordinator restart."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import CORRAL, Cluster, Proc, Runner, wait_until
from terminal import Terminal


@pytest.fixture
def terminals(cluster: Cluster) -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def _terminal(cluster: Cluster, terminals: list[Terminal], *args: str) -> Terminal:
    env = {**cluster.env, "CORRAL_URL": cluster.url}
    terminal = Terminal([CORRAL, *args], env, cluster.root)
    terminals.append(terminal)
    return terminal


def _follow_logs(cluster: Cluster, run_id: str) -> Proc:
    """``corral logs -f RUN_ID`` in the background, its output in its log."""
    following = Proc(
        "follow",
        [CORRAL, "logs", "-f", run_id],
        {**cluster.env, "CORRAL_URL": cluster.url},
        cluster.root,
    )
    cluster.procs.append(following)  # killed at the end whatever happens
    following.start()
    return following


def test_a_label_no_runner_has_is_named_at_submit_and_while_waiting(
    cluster: Cluster, runner: Runner, terminals: list[Terminal]
) -> None:
    submitted = cluster.cli("run", "--label", "gpu", "--", "echo", "hi")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    assert run_id.startswith("run_")
    assert "no live runner has labels [gpu]" in submitted.stderr
    assert cluster.client.get_run(run_id)["status"] == "pending"

    waiting = _terminal(cluster, terminals, "run", "--wait", "--label", "gpu", "--", "echo", "hi")
    text = waiting.expect("waiting for a runner with labels [gpu]")
    assert text.splitlines()[0].split() == [text.split()[0], "queued"]  # the id comes first

    following = _follow_logs(cluster, run_id)
    wait_until(
        lambda: f"{run_id} waiting for a runner with labels [gpu]" in following.log(),
        what="logs -f to say why the run waits",
    )

    cluster.start_runner("gpu-box", extra=["--labels", "gpu"])
    assert waiting.wait() == 0, waiting.text
    assert "hi" in waiting.text.splitlines()
    assert following.wait(30) == 0, following.log()
    assert "hi" in following.log().splitlines()


def test_wait_exits_with_the_commands_status_and_says_why(cluster: Cluster, runner: Runner) -> None:
    failing = cluster.cli("run", "--wait", "--", "sh", "-c", "echo oops >&2; exit 7")
    assert failing.returncode == 7, failing.stderr
    lines = failing.stderr.splitlines()
    run_id, first = lines[0].split()
    assert first == "queued"
    assert lines[-1] == f"{run_id} failed: process exited with code 7"
    assert "oops" in lines

    chatty = "for i in $(seq 1 30); do echo line $i; done; exit 3"
    long_failure = cluster.cli("run", "--wait", "--", "sh", "-c", chatty)
    assert long_failure.returncode == 3
    # Its reason's context, scrolled away by its output, is repeated at the end.
    tail = long_failure.stderr.splitlines()[-7:]
    assert tail[0] == "last lines:"
    assert tail[1:6] == [f"  line {i}" for i in range(26, 31)]

    timed_out = cluster.cli("run", "--wait", "--timeout", "1", "--", "sleep", "30")
    assert timed_out.returncode == 124, timed_out.stderr
    assert "timed_out: run exceeded its timeout" in timed_out.stderr

    timed_out_id = timed_out.stderr.split()[0]
    followed = cluster.cli("logs", "-f", timed_out_id)
    assert followed.returncode == 124
    failed_again = cluster.cli("logs", "-f", run_id)
    assert failed_again.returncode == 7
    assert failed_again.stdout.splitlines() == ["oops"]


def test_ctrl_c_leaves_the_run_running_and_says_how_to_cancel_it(
    cluster: Cluster, runner: Runner, terminals: list[Terminal]
) -> None:
    waiting = _terminal(cluster, terminals, "run", "--wait", "--", "sh", "-c", "echo go; sleep 60")
    waiting.expect("go\n")
    run_id = waiting.text.split()[0]
    waiting.ctrl_c()
    assert waiting.wait() == 130
    assert f"{run_id} is still running; cancel it with `corral runs cancel {run_id}`" in (
        waiting.text
    )
    assert "Traceback" not in waiting.text
    assert cluster.client.get_run(run_id)["status"] == "running"

    pending = _terminal(cluster, terminals, "run", "--wait", "--label", "nowhere", "--", "true")
    pending.expect("waiting for a runner with labels [nowhere]")
    pending_id = pending.text.split()[0]
    pending.ctrl_c()
    assert pending.wait() == 130
    assert f"{pending_id} is still waiting; cancel it with `corral runs cancel {pending_id}`" in (
        pending.text
    )


def test_logs_follow_reconnects_across_a_coordinator_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The run must outlive the restart: with the short default threshold the long-poll
    # runner's lease (the threshold less a margin) could run out while the coordinator is
    # down, and the runner would rightly stop the run and see it started again.
    cluster.start_coordinator(lost_after_s=15.0)
    cluster.start_runner("runner-a")
    gate = tmp_path / "gate"
    script = f'echo before; while [ ! -e "{gate}" ]; do sleep 0.05; done; echo after'
    run_id = cluster.client.create_run(type="command", command=["sh", "-c", script])["run_id"]
    following = _follow_logs(cluster, run_id)
    wait_until(lambda: "before" in following.log(), what="the first line")

    assert cluster.coordinator is not None
    cluster.coordinator.send(signal.SIGKILL)
    cluster.coordinator.wait(10)
    wait_until(lambda: "reconnecting" in following.log(), what="logs -f to notice")
    cluster.restart_coordinator()
    gate.touch()

    assert following.wait(60) == 0, following.log()
    log = following.log()
    assert "reconnected" in log
    assert log.count("before") == 1  # nothing printed twice after the reconnect
    assert "after" in log.splitlines()


def test_a_corral_command_after_run_is_refused_not_run(cluster: Cluster, runner: Runner) -> None:
    typo = cluster.cli("run", "list")
    assert typo.returncode == 2
    assert "did you mean `corral runs list`?" in typo.stderr
    no_dashes = cluster.cli("run", "echo", "hi")
    assert no_dashes.returncode == 2
    assert "put the command after --" in no_dashes.stderr
    assert cluster.client.list_runs()["runs"] == []  # nothing was created

    dashed = cluster.cli("run", "--wait", "--", "echo", "list")
    assert dashed.returncode == 0, dashed.stderr
    assert dashed.stdout.splitlines() == ["list"]
