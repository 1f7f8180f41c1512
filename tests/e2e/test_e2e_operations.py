"""Operations end to end: real ``corral serve --log-format json`` and ``corral runner
--log-format json`` processes. Every line each writes is one JSON object (timestamp, level,
logger, message), and ``GET /metrics`` counts the runs its runner's socket was given."""

from __future__ import annotations

import json
import signal

import httpx
from e2e_support import TOKEN, Cluster, Coordinator, free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families

JSON_LOGS = ("--log-format", "json")


def samples(url: str) -> dict[tuple[str, str], float]:
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[(sample.name, labels)] = sample.value
    return found


def json_records(log: str) -> list[dict[str, object]]:
    """The process's lines as JSON objects (the test harness's own ``====`` lines aside);
    a line that is not one fails the test."""
    records = []
    for line in log.splitlines():
        if line.startswith("==== start"):
            continue
        record = json.loads(line)
        assert {"timestamp", "level", "logger", "message"} <= set(record), record
        records.append(record)
    return records


def test_json_logs_and_metrics_of_a_websocket_runner(cluster: Cluster) -> None:
    coordinator = Coordinator(
        "coordinator", cluster.env, cluster.root, port=free_port(), db=str(cluster.root / "c.db")
    )
    coordinator.argv += JSON_LOGS
    cluster.procs.append(coordinator)
    cluster.coordinator = coordinator
    coordinator.start()
    coordinator.wait_ready()
    runner = cluster.start_runner("runner-a", extra=("--transport", "websocket", *JSON_LOGS))

    runs = cluster.client.create_runs(
        [{"type": "command", "command": ["echo", str(i)]} for i in range(3)]
    )
    for run in runs:
        assert cluster.wait_run(run["run_id"])["status"] == "completed"
    figures = samples(coordinator.url)
    assert figures[("corral_claims_total", "transport=websocket")] == 3
    assert figures[("corral_dispatch_latency_seconds_count", "")] == 3
    assert figures[("corral_runs_finished", "outcome=completed")] == 3
    assert figures[("corral_runner_links", "transport=websocket")] == 1

    coordinator.send(signal.SIGHUP)  # it says so in its log: one line at least
    wait_until(
        lambda: any("reloaded" in str(r["message"]) for r in json_records(coordinator.log())),
        what="the reload's log line",
    )
    assert json_records(runner.log()), "the runner logged nothing"
