"""The CLI's ``--url`` (and ``CORRAL_URL``) takes several coordinators, comma-separated: a
command reaches the one that answers. A list with an entry no connection could use is
refused as one URL would be: one line, exit 2."""

from __future__ import annotations

import json
import socket

from e2e_support import FAKE_CLAUDE, Cluster


def nothing_listens() -> str:
    """The URL of a local port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_command_given_a_dead_coordinator_and_a_live_one_reaches_the_live_one(
    cluster: Cluster,
) -> None:
    live = cluster.start_coordinator().url
    urls = f"{nothing_listens()},{live}"
    by_flag = cluster.cli("status", "--json", "--url", urls)
    assert by_flag.returncode == 0, by_flag.stderr
    assert json.loads(by_flag.stdout)["url"] == live
    by_env = cluster.cli("runs", "list", "--json", url=urls)  # CORRAL_URL
    assert by_env.returncode == 0, by_env.stderr


def test_doctor_checks_each_coordinator_of_the_list(cluster: Cluster) -> None:
    """One down among them fails the doctor, naming it; the rest is checked through the
    one that answers."""
    live = cluster.start_coordinator().url
    dead = nothing_listens()
    done = cluster.cli("doctor", "--claude-bin", FAKE_CLAUDE, "--url", f"{dead},{live}")
    lines = done.stdout.splitlines()
    assert done.returncode == 1
    assert lines[0].startswith(f"FAIL  coordinator at {dead}: ")
    assert lines[1].startswith(f"ok    coordinator at {live} answers")
    assert any("database schema version" in line for line in lines[2:])


def test_a_list_with_a_bad_url_is_refused_before_anything_is_sent(cluster: Cluster) -> None:
    for urls, why in (
        ("http://127.0.0.1:8765,http://bad..name:8765", "label empty or too long"),
        ("http://127.0.0.1:8765,127.0.0.1:8766", "did you mean http://127.0.0.1:8766?"),
        ("http://127.0.0.1:8765,http://127.0.0.1:99999", "Port out of range"),
        (" , ", "no coordinator URL given"),
    ):
        for args in (["runs", "list", "--url", urls], ["mcp", "--url", urls]):
            done = cluster.cli(*args, url="http://127.0.0.1:9")  # --url wins over it
            assert done.returncode == 2, (args, done.stderr)
            assert "Traceback" not in done.stderr and why in done.stderr, (args, done.stderr)
