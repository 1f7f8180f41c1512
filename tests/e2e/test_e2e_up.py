"""``corral up`` (what ``make run`` starts): a coordinator and a local runner in one process.
It serves runs over its WebSocket runner link, and SIGTERM stops it cleanly."""

from __future__ import annotations

import signal

from e2e_support import CORRAL, Cluster, Proc, free_port, wait_until

from corral.client import Client
from corral.credentials import read_token


def test_up_runs_work_and_stops_on_sigterm(cluster: Cluster) -> None:
    port = free_port()
    db = cluster.root / "up.db"
    # The defaults, as `make run` has them: no transport, no token given.
    env = {k: v for k, v in cluster.env.items() if k not in ("CORRAL_TRANSPORT", "CORRAL_TOKEN")}
    up = Proc("up", [CORRAL, "up", "--port", str(port), "--db", str(db)], env, cluster.root)
    cluster.procs.append(up)  # killed at the end whatever happens
    up.start()
    wait_until(lambda: "corral is up" in up.log(), 30, what="corral up to start")
    # Its admin token is where the README's quick start (run in the same directory) finds it.
    token = read_token(up.cwd)
    assert token is not None and token not in up.log()
    # The dashboard's address, without the token: this output is not a terminal.
    assert f"dashboard: http://127.0.0.1:{port}/  (sign in with the admin token)" in up.log()
    with Client(f"http://127.0.0.1:{port}", token=token) as client:
        (runner,) = wait_until(client.list_runners, 30, what="the local runner")
        assert (runner.transport, runner.state) == ("websocket", "active")
        run_id = client.run_command(["sh", "-c", "echo from-up"]).run_id
        run = client.wait_run(run_id)  # the log stream's end, not a poll
        assert run.status == "completed", run
        assert [line.text for line in client.logs(run_id).lines] == ["from-up"]
    up.send(signal.SIGTERM)
    assert up.wait(30) == 0
    assert "stopped" in up.log()
