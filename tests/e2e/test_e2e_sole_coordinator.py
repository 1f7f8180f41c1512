"""One coordinator per SQLite file (issue 16): a second ``corral serve`` on the same file is
refused at once and names the first; the lock dies with its holder, so after a kill -9 a
new coordinator starts on that file. On PostgreSQL several coordinators share a database."""

from __future__ import annotations

import signal
import subprocess

from e2e_support import CORRAL, Cluster, Coordinator, free_port


def test_a_second_coordinator_on_one_sqlite_file_is_refused(cluster: Cluster) -> None:
    first = cluster.start_coordinator()
    db = str(cluster.root / "corral.db")  # the cluster's default
    second = Coordinator("second", cluster.env, cluster.root, port=free_port(), db=db)
    cluster.procs.append(second)
    second.start()
    assert second.wait(30) != 0
    assert "[database_in_use]" in second.log()
    assert f"pid {first.pid}" in second.log() and first.url in second.log()
    assert first.healthy()  # the first one goes on serving

    first.send(signal.SIGKILL)
    first.wait(30)
    # No stale lock: the kernel dropped it with the killed process.
    cluster.restart_coordinator()
    assert cluster.coordinator is not None and cluster.coordinator.healthy()


def test_tasks_run_beside_a_coordinator_on_its_database_is_refused(cluster: Cluster) -> None:
    repo = cluster.root / "repo"
    repo.mkdir()
    for argv in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "test@example.com"],
        ["config", "user.name", "Test"],
        ["commit", "-q", "--allow-empty", "-m", "init"],
    ):
        subprocess.run(["git", "-C", str(repo), *argv], env=cluster.env, check=True)
    cluster.start_coordinator(db=str(repo / ".corral" / "corral.db"))
    # No --url: tasks run would serve the repository's database itself, beside the
    # coordinator (a short command such as tasks status may: it ends at once).
    env = {k: v for k, v in cluster.env.items() if k != "CORRAL_URL"}
    refused = subprocess.run(
        [CORRAL, "tasks", "--repo", str(repo), "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 4  # a conflict
    assert "[database_in_use]" in refused.stderr and "--url" in refused.stderr
