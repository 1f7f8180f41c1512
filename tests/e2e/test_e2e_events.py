"""``corral events`` end to end: real ``corral serve``, ``corral runner`` and ``corral events
-f`` processes. The coordinator SIGKILLed and restarted while ``events -f`` is open: the
follower resumes by itself, and what it printed is every stored event of the kinds it
asked for, in order, each once (no gap across the restart, no duplicate)."""

from __future__ import annotations

import json
from typing import Any

from e2e_support import CORRAL, Cluster, Proc, wait_until


def printed(follower: Proc) -> list[dict[str, Any]]:
    """The JSON events a follower printed (its stderr notes are in the same log)."""
    return [json.loads(line) for line in follower.log().splitlines() if line.startswith("{")]


def completed(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e["kind"] == "run" and e["data"]["status"] == "completed")


def test_events_follow_resumes_across_a_coordinator_restart(cluster: Cluster) -> None:
    coordinator = cluster.start_coordinator()
    cluster.start_runner("runner-a")
    argv = [CORRAL, "events", "-f", "--after", "0", "--json", "--kind", "run,log"]
    follower = Proc(
        "events",
        [*argv, "--url", coordinator.url],
        cluster.env,
        cluster.root,
    )
    cluster.procs.append(follower)
    follower.start()

    def batch(tag: str) -> None:
        runs = cluster.client.create_runs(
            [{"type": "command", "command": ["echo", f"{tag}-{i}"]} for i in range(3)]
        )
        for run in runs:
            assert cluster.wait_run(run["run_id"])["status"] == "completed"

    batch("before")
    wait_until(lambda: completed(printed(follower)) == 3, what="the first runs' events")
    cluster.restart_coordinator()  # SIGKILL, then the same port and database
    batch("after")
    wait_until(lambda: completed(printed(follower)) == 6, what="the events after the restart")
    assert follower.alive()
    assert "resuming after event" in follower.log()  # it did lose the stream, and resumed

    seen = printed(follower)
    ids = [e["id"] for e in seen]
    assert ids == sorted(set(ids)), "an event printed twice or out of order"
    stored = cluster.cli("events", "--json", "--kind", "run,log")
    assert stored.returncode == 0, stored.stderr
    kept = [json.loads(line) for line in stored.stdout.splitlines()]
    assert [e["id"] for e in kept] == ids  # every stored event, no more: no gap
    texts = [e["data"]["text"] for e in seen if e["kind"] == "log"]
    assert sorted(texts[:3]) == [f"before-{i}" for i in range(3)]  # two slots: any order
    assert sorted(texts[3:]) == [f"after-{i}" for i in range(3)]
