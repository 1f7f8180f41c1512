"""The sub-agent limits are flags of ``corral serve`` and ``corral up``: a child the
defaults (depth 3, 8 unfinished children) would let start is refused with the limit's code
under a lower flag, and nothing is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_support import CORRAL, FAKE_CLAUDE, TOKEN, Cluster, JsonClient, Proc, free_port, wait_until

from corral.errors import CorralError


def _session(client: JsonClient, name: str, prompt: str = "work", **fields: str) -> str:
    """The id of a session started and (for the fake Claude) ended."""
    created = client.create_run("start_session", session_name=name, prompt=prompt, **fields)
    run = wait_until(
        lambda: (r := client.get_run(created["run_id"]))["status"] == "completed" and r, 60
    )
    session_id: str = run["session_id"]
    return session_id


def _refused(client: JsonClient, **fields: str) -> str:
    before = client.list_runs(limit=500)
    with pytest.raises(CorralError) as refused:
        client.create_run("start_session", prompt="sub", **fields)
    assert client.list_runs(limit=500) == before
    return refused.value.code


def test_serve_flags_lower_the_depth_and_fan_out_limits(cluster: Cluster) -> None:
    cluster.start_coordinator(extra=["--max-subagent-depth", "1", "--max-subagent-children", "1"])
    cluster.start_runner("runner-a")
    client = cluster.client
    _session(client, "lead")
    _session(client, "kid", parent_session="lead")
    assert _refused(client, parent_session="kid") == "depth_exceeded"  # the default: depth 3

    hold = cluster.root / "hold"
    hold.touch()
    held = client.create_run(
        "start_session", prompt=f"wait [fake:wait_while={hold}]", parent_session="lead"
    )
    # Running, its session announced: it changes no more while the file is there.
    cluster.wait_run(held["run_id"], ["running"], 60, where=lambda r: bool(r["session_id"]))
    assert _refused(client, parent_session="lead") == "fan_out_exceeded"  # the default: 8
    hold.unlink()
    assert cluster.wait_run(held["run_id"], timeout=60)["status"] == "completed"


def test_up_takes_the_same_flags(tmp_path: Path, cluster: Cluster) -> None:
    port = free_port()
    argv = [CORRAL, "up", "--port", str(port), "--db", str(tmp_path / "up.db")]
    argv += ["--claude-bin", FAKE_CLAUDE, "--max-subagent-depth", "0"]
    up = Proc("up", argv, cluster.env, cluster.root)
    cluster.procs.append(up)
    up.start()
    client = JsonClient(f"http://127.0.0.1:{port}", TOKEN)
    try:
        wait_until(lambda: up.alive() and _healthy(client), 30, what="corral up")
        _session(client, "lead")
        assert _refused(client, parent_session="lead") == "depth_exceeded"
    finally:
        client.close()


def _healthy(client: JsonClient) -> bool:
    try:
        client.call("GET", "/health")
    except CorralError:
        return False
    return True
