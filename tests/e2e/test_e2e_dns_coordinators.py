"""Runners given one name that resolves to two coordinators (an address each, as a headless
Kubernetes service or a round-robin DNS name gives): they spread over both, and a rolling
restart through the name — one coordinator stopped (SIGTERM), started again, the other
killed (SIGKILL) — kills no run.

The coordinators are real ``corral serve`` processes on one PostgreSQL schema, listening
at one port on 127.0.0.1 and 127.0.0.2 (both loopback on Linux), allowing the name as a
Host. The name is resolved by a table the test hands the runners: a ``corral runner``
process has no resolver to inject, and this machine's /etc/hosts is not the tests' to
change, so the runners are ``RunnerCore``s in this process, each on a thread and event
loop of its own, with seeded randomness so that each starts where it did the last time.
"""

from __future__ import annotations

import asyncio
import random
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from e2e_support import TOKEN, Cluster, Coordinator, free_port, wait_until
from test_e2e_peer_coordinators import held_until_released, schema_url, starts_of

from corral.runner.core import RunnerCore
from corral.runner.poll import PollTransport
from corral.runner.settings import RunnerSettings

pytestmark = pytest.mark.postgres
NAME = "corral.test"
ADDRESSES = ["127.0.0.1", "127.0.0.2"]
SEEDS = (0, 1, 2, 3)  # two runners start on each address (checked: they spread)


async def resolve(host: str) -> list[str]:
    if host != NAME:
        raise OSError(f"{host}: unknown name")
    return list(ADDRESSES)


class InProcessRunners:
    """``RunnerCore``s on one event loop on a thread of its own, running until ``stop()``
    (one loop and thread for all: a process has one group keeper, meant for one loop, and
    it takes the exit of the thread that started it for the runner's death)."""

    def __init__(self, settings: list[RunnerSettings]) -> None:
        self.cores: list[RunnerCore] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(settings),))
        self._thread.start()
        assert self._ready.wait(30), "the runners did not start"

    async def _main(self, settings: list[RunnerSettings]) -> None:
        self.loop = asyncio.get_running_loop()
        self.cores = [
            RunnerCore(
                one, host_env={"PATH": "/usr/bin:/bin"}, resolve=resolve, rng=random.Random(seed)
            )
            for seed, one in zip(SEEDS, settings, strict=True)
        ]
        self._ready.set()
        await asyncio.gather(*(core.run() for core in self.cores))

    def addresses(self) -> list[str | None]:
        """Where each long-poll runner's calls go now, sorted."""
        return sorted(
            asyncio.run_coroutine_threadsafe(self._address(core), self.loop).result(10) or ""
            for core in self.cores
        )

    @staticmethod
    async def _address(core: RunnerCore) -> str | None:
        transport = core.transport
        assert isinstance(transport, PollTransport)
        return (await transport.link._coordinators.current()).address

    def stop(self) -> None:
        for core in self.cores:
            self.loop.call_soon_threadsafe(core.drain, 0.0)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the runners did not stop"


@contextmanager
def runners_of_the_name(port: int, transport: str) -> Iterator[InProcessRunners]:
    """A runner for each of ``SEEDS``, given the URL of the name alone."""
    runners = InProcessRunners(
        [
            RunnerSettings(
                coordinator_url=f"http://{NAME}:{port}",
                token=TOKEN,
                name=f"{transport}{seed}",
                slots=1,
                transport=transport,
            )
            for seed in SEEDS
        ]
    )
    try:
        yield runners
    finally:
        runners.stop()


def coordinators_of_a_name(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> tuple[Coordinator, Coordinator, int]:
    """Two coordinators at one port, on 127.0.0.1 and 127.0.0.2, and that port. (A lost
    threshold of 10 s: on a loaded machine a registration alone may take most of the
    default 2 s of these tests.)"""
    port, db = free_port(), schema_url(pg_url, pg_schema)
    a, b = (
        cluster.start_coordinator(
            host=host, port=port, db=db, lost_after_s=10.0, extra=["--allowed-hosts", NAME]
        )
        for host in ADDRESSES
    )
    return a, b, port


def finish(cluster: Cluster, runs: list[dict[str, Any]], names: list[str]) -> None:
    """Release the held runs: each completes, started once."""
    for name in names:
        (cluster.root / f"{name}.go").touch()
    for run in runs:
        finished = cluster.wait_run(run["run_id"], timeout=60)
        assert (finished["status"], finished["attempts"]) == ("completed", 1), finished
    assert all(starts_of(cluster.root, n) == 1 for n in names)  # none killed, none run again


def restart_a_kill_b(cluster: Cluster, a: Coordinator, b: Coordinator) -> None:
    """A stopped by SIGTERM is started again; then B is SIGKILLed (the test's client now
    talks to A)."""
    assert a.wait(30) == 0
    a.start()
    a.wait_ready()
    b.kill()
    cluster.coordinator = a
    cluster.reset_client()


def test_websocket_runners_given_a_name_spread_over_its_coordinators_and_follow_a_restart(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    a, b, port = coordinators_of_a_name(cluster, pg_url, pg_schema)
    root = cluster.root
    names = [f"held{i}" for i in range(len(SEEDS))]

    def owners() -> list[str | None]:
        """Each runner's coordinator, as the coordinators record it (its socket's)."""
        found = [r for r in cluster.client.runners() if r["state"] == "active"]
        return sorted(r["coordinator_url"] for r in found)

    with runners_of_the_name(port, "websocket"):
        wait_until(lambda: len(owners()) == len(SEEDS), 30, what="every runner connected")
        assert owners() == [a.url, a.url, b.url, b.url]  # spread over both

        runs = [
            cluster.client.create_run("command", command=held_until_released(root, n))
            for n in names
        ]
        wait_until(lambda: all(starts_of(root, n) == 1 for n in names), 30, what="starts")

        a.send(signal.SIGTERM)  # a deploy: its runners are told to move on
        wait_until(lambda: owners() == [b.url] * len(SEEDS), 10, what="every runner on B")
        restart_a_kill_b(cluster, a, b)  # SIGKILL: their sockets are cut
        wait_until(lambda: owners() == [a.url] * len(SEEDS), 10, what="every runner on A")
        finish(cluster, runs, names)


def test_long_poll_runners_given_a_name_spread_over_its_coordinators_and_follow_a_restart(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    a, b, port = coordinators_of_a_name(cluster, pg_url, pg_schema)
    root = cluster.root
    names = [f"held{i}" for i in range(len(SEEDS))]

    with runners_of_the_name(port, "poll") as runners:
        wait_until(
            lambda: (
                len([r for r in cluster.client.runners() if r["state"] == "active"]) == len(SEEDS)
            ),
            30,
            what="every runner registered",
        )
        assert runners.addresses() == sorted(ADDRESSES * 2)  # spread over both

        runs = [
            cluster.client.create_run("command", command=held_until_released(root, n))
            for n in names
        ]
        wait_until(lambda: all(starts_of(root, n) == 1 for n in names), 30, what="starts")

        a.send(signal.SIGTERM)  # its long-polls are answered coordinator_leaving
        wait_until(lambda: runners.addresses() == [ADDRESSES[1]] * len(SEEDS), 10, what="all on B")
        restart_a_kill_b(cluster, a, b)  # SIGKILL: their calls fail
        wait_until(lambda: runners.addresses() == [ADDRESSES[0]] * len(SEEDS), 20, what="all on A")
        finish(cluster, runs, names)
