"""``corral runner`` ends on SIGTERM and Ctrl-C in every state — still registering or
connecting with no coordinator there, serving, reconnecting after the coordinator died —
and a registration the coordinator refuses (4xx) ends it at once, said once, non-zero."""

from __future__ import annotations

import signal

import pytest
from e2e_support import Cluster, Runner, free_port, wait_until

TRANSPORTS = ["poll", "websocket"]
SIGNALS = [signal.SIGTERM, signal.SIGINT]
# Generous under load; a runner that ignores the signal never exits at all.
EXIT_DEADLINE_S = 15.0


def runner_at(cluster: Cluster, url: str, transport: str, *extra: str) -> Runner:
    runner = Runner(
        "r", cluster.env, cluster.root, url=url, slots=1, extra=["--transport", transport, *extra]
    )
    cluster.procs.append(runner)
    runner.start()
    return runner


def retrying(runner: Runner) -> bool:
    log = runner.log()
    return "retry in" in log or "coordinator socket" in log


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_signal_ends_a_runner_that_cannot_reach_its_coordinator(
    cluster: Cluster, transport: str, sig: signal.Signals
) -> None:
    runner = runner_at(cluster, f"http://127.0.0.1:{free_port()}", transport)
    wait_until(lambda: retrying(runner), 30, what="the runner to retry")
    runner.send(sig)
    assert runner.wait(EXIT_DEADLINE_S) == 0, runner.log()
    assert "stopped before it" in runner.log()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_signal_ends_a_runner_whose_coordinator_died(cluster: Cluster, transport: str) -> None:
    coordinator = cluster.start_coordinator()
    runner = runner_at(cluster, cluster.url, transport)
    cluster.wait_runner("r")
    coordinator.send(signal.SIGKILL)
    assert coordinator.wait(10) == -signal.SIGKILL
    runner.send(signal.SIGTERM)
    assert runner.wait(EXIT_DEADLINE_S) == 0, runner.log()


def test_a_refused_registration_ends_the_runner(cluster: Cluster) -> None:
    cluster.start_coordinator()
    runner = runner_at(cluster, cluster.url, "poll", "--name", "n" * 300)  # too long
    assert runner.wait(EXIT_DEADLINE_S) == 2, runner.log()  # invalid_request's exit status
    log = runner.log()
    assert log.count("error:") == 1
    assert "at most 200 characters [invalid_request]" in log
    assert "retry in" not in log
    assert cluster.client.runners() == []


def test_a_refused_socket_ends_the_runner(cluster: Cluster) -> None:
    cluster.start_coordinator()
    # No runner socket at that path: the coordinator answers the upgrade with a 4xx.
    runner = runner_at(cluster, f"{cluster.url}/elsewhere", "websocket")
    assert runner.wait(EXIT_DEADLINE_S) != 0, runner.log()
    log = runner.log()
    assert log.count("error: coordinator answered HTTP 403") == 1
    assert "coordinator socket" not in log  # not taken for an outage and retried


def test_a_refused_init_ends_the_runner(cluster: Cluster) -> None:
    cluster.start_coordinator()
    # Accepted by the CLI, refused by the coordinator's runner limits (one line of text).
    runner = runner_at(cluster, cluster.url, "websocket", "--name", "two\nlines")
    assert runner.wait(EXIT_DEADLINE_S) == 2, runner.log()  # invalid_request's exit status
    log = runner.log()
    assert log.count("refused this runner's Init") == 1
    assert cluster.client.runners() == []
