"""The coordinator's Prometheus metrics: what it counts as it happens, what a scrape reads.

``GET /metrics`` (a reader token, like every read) answers in Prometheus' text format:

    corral_runs{state}                       runs stored in each live state (pending,
                                             claimed, running, lost)  — read at scrape
    corral_runs_finished{outcome}            finished runs still stored, by outcome
                                             (completed, failed, cancelled, timed_out)
    corral_runners{state}                    runners stored in each state — read at scrape
    corral_runner_links{transport}           runner links open on this coordinator: its
                                             registered sockets, its waiting long-polls
    corral_claims_total{transport}           runs this coordinator handed to runners
    corral_dispatch_latency_seconds          a run's wait from creation to its first claim
    corral_event_subscribers                 ``GET /events`` streams open here
    corral_store_seconds{operation}          each store call, off the event loop

Counters and histograms belong to this process (they start at zero with it, as Prometheus
expects of a restarted target); what the store holds is read when scraped. Each app has
its own registry, so several coordinators in one process (tests) never mix their figures.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from corral.runners import Runner, RunnerState
from corral.runs import TERMINAL, RunStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Claims take milliseconds when a runner waits, seconds to minutes when runs queue up.
DISPATCH_BUCKETS = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
# A store call is a transaction: tenths of a millisecond on SQLite, up to a busy wait.
STORE_BUCKETS = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05),
    *(0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.runs = Gauge(
            "corral_runs", "Runs stored in each live state.", ["state"], registry=registry
        )
        self.runs_finished = Gauge(
            "corral_runs_finished",
            "Finished runs still stored (retention deletes old ones), by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.runners = Gauge(
            "corral_runners", "Runners stored in each state.", ["state"], registry=registry
        )
        self.runner_links = Gauge(
            "corral_runner_links",
            "Runner links open on this coordinator: registered sockets, waiting long-polls.",
            ["transport"],
            registry=registry,
        )
        self.claims = Counter(
            "corral_claims",
            "Runs this coordinator handed to runners.",
            ["transport"],
            registry=registry,
        )
        self.dispatch_seconds = Histogram(
            "corral_dispatch_latency_seconds",
            "A run's wait from its creation to its first claim.",
            buckets=DISPATCH_BUCKETS,
            registry=registry,
        )
        self.event_subscribers = Gauge(
            "corral_event_subscribers", "GET /events streams open here.", registry=registry
        )
        self.store_seconds = Histogram(
            "corral_store_seconds",
            "Store calls (transactions), by operation.",
            ["operation"],
            buckets=STORE_BUCKETS,
            registry=registry,
        )
        self.polls_waiting = self.runner_links.labels("poll")
        for transport in ("poll", "websocket"):
            self.claims.labels(transport)  # both series exist from the start, at zero
        self._socket_claims = self.claims.labels("websocket")

    def claimed(self, transport: str, created_at: float, claimed_at: float, attempt: int) -> None:
        """A run went to a runner; its first claim also tells how long it waited."""
        self.claims.labels(transport).inc()
        if attempt == 1:
            self.dispatch_seconds.observe(max(0.0, claimed_at - created_at))

    def started_on_socket(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """``start_run`` commands a runner socket sent (their runs as ``start_run_json``
        has them), counted once for all of them: a push sends several."""
        claims = 0
        for body in bodies:
            if body.get("type") == "start_run":
                claims += 1
                run = body["run"]
                if run["attempts"] == 1:
                    created = _seconds(run["created_at"])
                    claimed = _seconds(run["claimed_at"] or run["created_at"])
                    self.dispatch_seconds.observe(max(0.0, claimed - created))
        if claims:
            self._socket_claims.inc(claims)

    def store_call(self, operation: str, seconds: float) -> None:
        self.store_seconds.labels(operation).observe(seconds)

    def scrape(self, run_counts: dict[str, int], runners: list[Runner], sockets: int) -> bytes:
        """The text exposition, with what the store holds now."""
        for status in RunStatus:
            count = run_counts.get(status, 0)
            if status in TERMINAL:
                self.runs_finished.labels(status.value).set(count)
            else:
                self.runs.labels(status.value).set(count)
        states = Tally(runner.state for runner in runners)
        for state in RunnerState:
            self.runners.labels(state.value).set(states[state])
        self.runner_links.labels("websocket").set(sockets)
        return generate_latest(self.registry)


def _seconds(at: float | str) -> float:
    """A time of a start_run command's run: seconds since the epoch, or ISO 8601 in one an
    older coordinator stored (sent again after an upgrade)."""
    if isinstance(at, int | float):
        return float(at)
    return datetime.fromisoformat(at).timestamp()
