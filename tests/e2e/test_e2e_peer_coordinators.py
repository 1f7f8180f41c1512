"""Two ``corral serve`` processes on one PostgreSQL database, a runner given both URLs.

A rolling restart — each coordinator stopped (SIGTERM) and started again, one at a time —
kills no run: the runner moves to the other coordinator within its lease, and the run it
holds goes on, started once. A run created through one coordinator reaches the runner
connected to the other (LISTEN/NOTIFY between them), and so does a cancel.
"""

from __future__ import annotations

import signal
from pathlib import Path
from urllib.parse import quote

import pytest
from e2e_support import TOKEN, Cluster, Coordinator, JsonClient, wait_until

pytestmark = pytest.mark.postgres


def held_until_released(root: Path, name: str) -> list[str]:
    """A command that notes each start of it, then runs until the test releases it."""
    starts, release = root / f"{name}.starts", root / f"{name}.go"
    script = f"echo start >> {starts}; while [ ! -e {release} ]; do sleep 0.05; done; echo done"
    return ["sh", "-c", script]


def starts_of(root: Path, name: str) -> int:
    path = root / f"{name}.starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def restart(cluster: Cluster, coordinator: Coordinator) -> None:
    """Stop it as a deploy does (SIGTERM), wait until it is gone, start it again."""
    coordinator.send(signal.SIGTERM)
    coordinator.wait(30)
    coordinator.start()
    coordinator.wait_ready()
    cluster.reset_client()


def test_a_rolling_restart_of_two_coordinators_kills_no_run(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    db = f"{pg_url}{'&' if '?' in pg_url else '?'}options={quote(f'-csearch_path={pg_schema}')}"
    a = cluster.start_coordinator(db=db)
    b = cluster.start_coordinator(db=db)
    cluster.start_runner(
        "runner", url=f"{a.url},{b.url}", slots=4, extra=["--transport", "websocket"]
    )
    via_a, via_b = JsonClient(a.url, TOKEN), JsonClient(b.url, TOKEN)
    root = cluster.root
    try:
        long_run = via_a.create_run("command", command=held_until_released(root, "long"))
        wait_until(lambda: starts_of(root, "long") == 1, 30, what="the long run to start")

        restart(cluster, a)  # the runner was on A: it moves to B
        # Created through A, the run reaches the runner, which is now on B.
        moved = via_a.create_run("command", command=["echo", "through a"])
        assert cluster.wait_run(moved["run_id"])["status"] == "completed"

        restart(cluster, b)  # and back to A
        cancelled = via_b.create_run("command", command=held_until_released(root, "cancel"))
        wait_until(lambda: starts_of(root, "cancel") == 1, 30, what="the run to cancel to start")
        via_b.cancel_run(cancelled["run_id"])  # through B, to the runner on A
        assert cluster.wait_run(cancelled["run_id"])["status"] == "cancelled"

        (root / "long.go").touch()
        finished = cluster.wait_run(long_run["run_id"], timeout=60)
        assert (finished["status"], finished["exit_code"], finished["attempts"]) == (
            "completed",
            0,
            1,
        )
        assert starts_of(root, "long") == 1  # never started again
    finally:
        via_a.close()
        via_b.close()
