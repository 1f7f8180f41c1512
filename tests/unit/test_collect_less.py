"""Long-lived processes (``corral serve``, ``up``, ``runner``) let the cyclic garbage
collector run rarely: start-up's objects frozen out of its sight, a young-generation
threshold of 50,000."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from corral.runner.process import collect_less


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_collector")
def test_a_serving_process_collects_rarely_and_never_looks_at_start_up_objects() -> None:
    gc.unfreeze()
    collect_less()
    assert gc.get_threshold()[0] == 50_000
    assert gc.get_freeze_count() > 1_000  # the modules, classes and functions loaded so far
    before = gc.get_count()[0]
    kept = [[] for _ in range(5_000)]  # 5,000 containers: no young collection in between
    assert gc.get_count()[0] >= before + 5_000 and len(kept) == 5_000
