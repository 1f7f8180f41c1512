"""Labels and runners from the CLI (issue 15): one rule for a run's ``--label a,b`` and a
runner's ``--labels a,b``; labels shown by ``runners list``; runners drained or stopped by
name as well as by id."""

from __future__ import annotations

import json

from e2e_support import Cluster


def test_one_label_rule_and_runners_by_name(cluster: Cluster) -> None:
    cluster.start_coordinator()
    ws = ["--transport", "websocket"]
    box = cluster.start_runner("gpu-box", slots=1, extra=[*ws, "--labels", "linux, gpu"])
    plain = cluster.start_runner("plain", slots=1, extra=ws)
    box_id = cluster.wait_runner("gpu-box")

    listed = cluster.cli("runners", "list")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if " gpu-box " in line]
    assert "gpu,linux" in row.split()

    for labels in (["--label", "gpu,linux"], ["--label", "linux", "--label", " gpu"]):
        done = cluster.cli("run", "--wait", *labels, "--", "echo", "on the box")
        assert done.returncode == 0, done.stderr
        run = cluster.client.get_run(done.stderr.split()[0])
        assert run["labels"] == ["gpu", "linux"]
        assert run["runner_id"] == box_id

    drained = cluster.cli("runners", "drain", "gpu-box", "--grace", "60")
    assert drained.returncode == 0, drained.stderr
    # Nothing to finish: it leaves at once, sometimes before the answer is written.
    answered_id, answered_state = drained.stdout.split()
    assert answered_id == box_id
    assert answered_state in ("draining", "stopped")
    assert box.wait(30) == 0
    assert cluster.runner_by_id(box_id)["state"] == "stopped"
    stopped = cluster.cli("runners", "stop", "plain")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.split()[1] == "stopped"
    assert cluster.runner_by_id(stopped.stdout.split()[0])["name"] == "plain"
    plain.kill()

    unknown = cluster.cli("runners", "stop", "nobody")
    assert unknown.returncode == 3
    assert "no runner has the id or name 'nobody'" in unknown.stderr


def test_run_flags_read_their_variables_and_print_json(cluster: Cluster) -> None:
    cluster.start_coordinator()
    env = {
        "CORRAL_LABEL": "gpu,linux",
        "CORRAL_PRIORITY": "5",
        "CORRAL_MAX_ATTEMPTS": "2",
        "CORRAL_TIMEOUT": "30",
        "CORRAL_IDLE_TIMEOUT": "20",
        "CORRAL_JSON": "1",
    }
    cluster.env.update(env)
    created = cluster.cli("run", "--", "echo", "hi")
    assert created.returncode == 0, created.stderr
    run_id = json.loads(created.stdout)["run_id"]
    run = cluster.client.get_run(run_id)
    assert run["labels"] == ["gpu", "linux"]
    assert (run["priority"], run["max_attempts"]) == (5, 2)
    assert (run["timeout_s"], run["idle_timeout_s"]) == (30, 20)
    for name in env:
        del cluster.env[name]

    cluster.env["CORRAL_SESSION"] = "from-env"
    started = cluster.cli("start", "--json", "hello")
    del cluster.env["CORRAL_SESSION"]
    assert cluster.client.get_run(json.loads(started.stdout)["run_id"])["session_name"] == (
        "from-env"
    )

    cancelled = cluster.cli("runs", "cancel", "--json", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    logs = cluster.cli("logs", "--json", run_id)
    assert (logs.returncode, logs.stdout) == (0, "")  # it never ran: no lines
