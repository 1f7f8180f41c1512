"""Browser fixtures: a real coordinator and runner (tests/e2e's ``Cluster``) and a headless
Chromium on its dashboard. At teardown the browser quits and every process is killed; a
failed test gets the browser's console and the process logs in its report."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from selenium.common.exceptions import WebDriverException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from browser_support import DESKTOP, WEBSOCKET, Page, start_chromium
from e2e_support import TOKEN, Cluster

CLUSTER = pytest.StashKey[Cluster]()
PAGE = pytest.StashKey[Page]()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A coordinator and one runner (``runner-a``, two slots, on corral's default WebSocket
    link), ready."""
    found = Cluster(tmp_path)
    request.node.stash[CLUSTER] = found
    try:
        found.start_coordinator()
        found.start_runner("runner-a", extra=WEBSOCKET)
        yield found
    finally:
        found.close()


@pytest.fixture
def page(cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    """Chromium signed in to the cluster's dashboard (the runs page shown)."""
    driver = start_chromium(tmp_path)
    found = Page(driver, cluster.url, tmp_path / "screenshots")
    request.node.stash[PAGE] = found
    try:
        found.resize(DESKTOP)
        found.sign_in(TOKEN)
        yield found
    finally:
        driver.quit()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        page = item.stash.get(PAGE, None)
        if page is not None:
            with contextlib.suppress(WebDriverException):  # the browser may be gone
                page.console_errors()
            console = "\n".join(f"{e['level']} {e['message']}" for e in page.console)
            report.sections.append(("browser console", console))
        found = item.stash.get(CLUSTER, None)
        if found is not None:
            report.sections.extend(found.logs())
    return report
