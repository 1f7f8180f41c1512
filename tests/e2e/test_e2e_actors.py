"""Actors with real processes: ``corral serve``, ``corral runner`` hosting the example agent
actor from its ``[actors.agent]`` config, the ``corral actors`` CLI and the gateway.

The agent actor keeps its Claude session (the fake CLI) in its KV across sleep; a runner
killed outright (SIGKILL) is lost after its threshold and its actor, lost with it, is
placed on a second runner (seed 000's forced shutdown); destroy drops its KV.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
from e2e_support import TOKEN, Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]


def config(cluster: Cluster) -> Path:
    path = cluster.root / "actors.toml"
    command = json.dumps([sys.executable, str(ROOT / "examples" / "agent_actor.py")])
    fake = json.dumps(str(ROOT / "tests" / "fakes" / "claude"))
    path.write_text(f"[actors.agent]\ncommand = {command}\nenv = {{ CLAUDE_BIN = {fake} }}\n")
    return path


def start_runner(cluster: Cluster, name: str) -> None:
    extra = ["--transport", "websocket", "--config", str(config(cluster))]
    cluster.start_runner(name, extra=extra)


def actor(cluster: Cluster, actor_id: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.client.call("GET", f"/actors/{actor_id}")
    return found


def wait_actor(cluster: Cluster, actor_id: str, state: str, generation: int) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        found = actor(cluster, actor_id)
        return found if (found["state"], found["generation"]) == (state, generation) else None

    return wait_until(reached, 30.0, what=f"actor {state} in generation {generation}")


def say(cluster: Cluster, actor_id: str, text: str) -> dict[str, Any]:
    response = httpx.post(
        f"{cluster.url}/gateway/{actor_id}/message",
        content=text,
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=30.0,
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_agent_actor_through_the_cli_gateway_sleep_lost_runner_and_destroy(
    cluster: Cluster,
) -> None:
    cluster.env["CORRAL_RUNNER_LOST_THRESHOLD"] = "4"  # a killed runner is lost sooner
    cluster.start_coordinator()
    start_runner(cluster, "runner-a")
    created = cluster.cli(
        "actors", "create", "agent", "--key", "issue-7", "--crash-policy", "restart"
    )
    assert created.returncode == 0, created.stderr
    actor_id = created.stdout.strip()
    assert created.stderr.startswith("created")
    again = cluster.cli("actors", "create", "agent", "--key", "issue-7")
    assert again.stdout.strip() == actor_id and again.stderr.startswith("found")

    first_runner = wait_actor(cluster, actor_id, "running", 1)["runner_id"]
    shown = json.loads(cluster.cli("actors", "get", actor_id, "--json").stdout)
    assert (shown["state"], shown["runner_id"]) == ("running", first_runner)
    hello = say(cluster, actor_id, "hello")
    assert hello["reply"] == "turn 1: hello"
    kv = cluster.cli("actors", "kv", actor_id)
    assert kv.stdout == f"session_id\t{hello['session_id']}\n"
    listed = cluster.cli("actors", "list", "--name", "agent")
    assert actor_id in listed.stdout and "running" in listed.stdout

    # Asleep: its process is gone; a request through the gateway wakes it, same session.
    slept = cluster.cli("actors", "sleep", actor_id)
    assert slept.stdout.strip() == f"{actor_id} sleeping"
    wait_until(lambda: actor(cluster, actor_id)["runner_id"] is None, 30.0, what="asleep")
    again_said = say(cluster, actor_id, "still you?")
    assert again_said["session_id"] == hello["session_id"] and again_said["generation"] == 2

    # The runner is killed outright: lost after its threshold, the actor goes elsewhere.
    (runner_a,) = [p for p in cluster.procs if p.name == "runner-a"]
    runner_a.send(signal.SIGKILL)
    start_runner(cluster, "runner-b")
    moved = wait_actor(cluster, actor_id, "running", 3)
    assert moved["runner_id"] not in (None, first_runner)
    assert say(cluster, actor_id, "moved?")["session_id"] == hello["session_id"]

    gone = cluster.cli("actors", "destroy", actor_id)
    assert gone.returncode == 0, gone.stderr
    wait_until(lambda: actor(cluster, actor_id)["state"] == "destroyed", 30.0, what="destroyed")
    assert cluster.cli("actors", "kv", actor_id).stdout == ""
    missing = cluster.cli("actors", "get", "act_missing")
    assert missing.returncode == 3 and "actor_not_found" in missing.stderr + missing.stdout


def test_a_runner_stopped_by_sigterm_drains_its_actors_and_leaves(cluster: Cluster) -> None:
    cluster.start_coordinator()
    start_runner(cluster, "runner-a")
    created = cluster.cli("actors", "create", "agent", "--crash-policy", "restart")
    actor_id = created.stdout.strip()
    wait_actor(cluster, actor_id, "running", 1)
    (runner_a,) = [p for p in cluster.procs if p.name == "runner-a"]
    runner_a.send(signal.SIGTERM)  # GoingAway to its actor, which stops; then it leaves
    assert runner_a.wait(30.0) == 0
    queued = actor(cluster, actor_id)
    assert (queued["state"], queued["runner_id"]) == ("pending", None)
    start_runner(cluster, "runner-b")
    wait_actor(cluster, actor_id, "running", 2)
