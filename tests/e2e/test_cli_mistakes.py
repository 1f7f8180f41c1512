"""Ordinary mistakes get one plain line and a documented exit status, never a traceback
(issue 15): a second coordinator on a used port, stopping ``corral serve`` while runners
hold long-polls, ``tasks run`` outside a git repository, a ``--url`` without a scheme."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from e2e_support import CORRAL, Cluster, Proc, free_port, wait_until
from terminal import Terminal


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_second_coordinator_on_a_used_port_says_so(cluster: Cluster) -> None:
    port = cluster.start_coordinator().port
    for command in ("up", "serve"):
        second = cluster.cli(command, "--port", str(port), "--db", str(cluster.root / "2.db"))
        assert second.returncode == 4, second.stderr
        line = _one_line(second.stderr)
        assert f"port {port} is in use — is another corral running?" in line


def test_serve_stops_on_ctrl_c_and_sigterm_without_a_traceback(cluster: Cluster) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [CORRAL, "serve", "--port", str(port), "--db", str(cluster.root / "c.db")]
    # A long-poll runner keeps a request open past the shutdown's grace: it is cancelled.
    serve = Terminal(argv, cluster.env, cluster.root)
    try:
        wait_until(lambda: _healthy(cluster, url), 30, what="serve to answer")
        runner = cluster.start_runner("poller", url=url, extra=["--transport", "poll"], wait=False)
        wait_until(lambda: "poll" in _runner_transports(cluster, url), what="the poller")
        serve.ctrl_c()
        assert serve.wait(30) == 130
    finally:
        serve.close()
    assert "Traceback" not in serve.text and "ERROR" not in serve.text, serve.text
    assert serve.text.rstrip().endswith("corral serve stopped")

    again = Proc("serve-again", argv, cluster.env, cluster.root)
    cluster.procs.append(again)
    again.start()
    wait_until(lambda: _healthy(cluster, url), 30, what="serve to answer again")
    wait_until(lambda: "poll" in _runner_transports(cluster, url), 30, what="the poller back")
    again.send(signal.SIGTERM)
    assert again.wait(30) == 0
    assert "Traceback" not in again.log() and "ERROR" not in again.log(), again.log()
    assert again.log().rstrip().endswith("corral serve stopped")
    runner.kill()


def _healthy(cluster: Cluster, url: str) -> bool:
    done = cluster.cli("runners", "list", "--json", url=url, timeout=30)
    return done.returncode == 0


def _runner_transports(cluster: Cluster, url: str) -> str:
    done = cluster.cli("runners", "list", url=url, timeout=30)
    return done.stdout


def test_tasks_run_outside_a_repository(cluster: Cluster, tmp_path: Path) -> None:
    outside = tmp_path / "not-a-repo"
    outside.mkdir()
    done = subprocess.run(
        [CORRAL, "tasks", "run"],
        cwd=outside,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert f"{outside} is not a git repository" in line
    assert "Command '[" not in line  # no repr of the git call


def test_a_url_without_a_scheme_is_refused_with_the_one_meant(cluster: Cluster) -> None:
    for args, env_url in (
        (["runs", "list", "--url", "127.0.0.1:8765"], None),
        (["runs", "list"], "127.0.0.1:8765"),
        (["runner", "--url", "127.0.0.1:8765"], None),
    ):
        done = subprocess.run(
            [CORRAL, *args],
            env={**cluster.env, **({"CORRAL_URL": env_url} if env_url else {})},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert "did you mean http://127.0.0.1:8765?" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_postgresql_url_libpq_cannot_parse_is_refused_at_once(cluster: Cluster) -> None:
    """No wait for a database can mend it: one line, exit 2, not a retry loop."""
    url = "postgresql://postgres@127.0.0.1:5432/test?no_such_option=1"
    done = subprocess.run(
        [CORRAL, "serve", "--port", str(free_port()), "--db", url],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())  # the CLI folds a long message
    assert "Traceback" not in said
    assert "not a PostgreSQL URL libpq accepts" in said and "[invalid_db_url]" in said
    assert 'invalid URI query parameter: "no_such_option"' in said


def test_a_url_no_connection_could_use_is_refused_before_anything_starts(cluster: Cluster) -> None:
    """A host name with an empty label, or a port out of range: one line, exit 2 — not a
    runner that starts and then dies with a traceback when it resolves the name."""
    for url, why in (
        ("http://bad..name:8765", "label empty or too long"),
        (f"http://{'a' * 64}.example:8765", "label empty or too long"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:8765,http://bad..name:8765", "label empty or too long"),
    ):
        done = subprocess.run(
            [CORRAL, "runner", "--coordinator", url],
            env={**cluster.env, "CORRAL_TOKEN": "crl_x"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 2, (url, done.stderr)
        assert "Traceback" not in done.stderr and why in done.stderr, (url, done.stderr)
