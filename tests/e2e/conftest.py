"""End-to-end fixtures: ``corral serve`` and ``corral runner`` as real processes.

``cluster`` gives a test its own tmp dir, database, free port and isolated environment;
it starts nothing by itself (``cluster.start_coordinator()``, ``cluster.start_runner()``,
or the ``coordinator`` and ``runner`` fixtures below). At teardown every process group is
SIGKILLed; when a test fails, the tail of every process log is added to its report.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from e2e_support import Cluster, Coordinator, Runner

CLUSTER = pytest.StashKey[Cluster]()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    found = Cluster(tmp_path)
    request.node.stash[CLUSTER] = found
    try:
        yield found
    finally:
        found.close()


@pytest.fixture
def coordinator(cluster: Cluster) -> Coordinator:
    """A running coordinator on SQLite, ready (``GET /health`` answers)."""
    return cluster.start_coordinator()


@pytest.fixture
def runner(cluster: Cluster, coordinator: Coordinator) -> Runner:
    """One registered runner (two slots) of ``coordinator``, using the fake claude."""
    return cluster.start_runner("runner-a")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    found = item.stash.get(CLUSTER, None)
    if found is not None and report.failed:
        report.sections.extend(found.logs())
    return report
