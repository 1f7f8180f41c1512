"""The metrics of the runs a runner socket was sent: claims counted, first waits observed."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from corral.coordinator.metrics import Metrics


def start(attempts: int, created: float | str, claimed: float | str | None) -> dict[str, Any]:
    run = {"attempts": attempts, "created_at": created, "claimed_at": claimed}
    return {"type": "start_run", "run": run}


def samples(metrics: Metrics) -> dict[tuple[str, str], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_push_counts_every_start_and_observes_first_attempts_waits() -> None:
    metrics = Metrics()
    metrics.started_on_socket(
        [
            start(1, 1_700_000_000.0, 1_700_000_000.5),
            start(1, 1_700_000_000.0, None),  # claimed as created
            start(2, 1_700_000_000.0, 1_700_000_060.0),  # a retry
            {"type": "cancel_run", "run_id": "run_1"},
            # Stored by an older coordinator (ISO 8601), sent again after an upgrade.
            start(1, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00.250000+00:00"),
        ]
    )
    metrics.started_on_socket([])
    found = samples(metrics)
    assert found[("corral_claims_total", "transport=websocket")] == 4
    assert found[("corral_claims_total", "transport=poll")] == 0
    assert found[("corral_dispatch_latency_seconds_count", "")] == 3
    assert found[("corral_dispatch_latency_seconds_sum", "")] == 0.75
