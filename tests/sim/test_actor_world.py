"""The deterministic simulation with actors (see simworld.py: an actor world), over
hundreds of seeds: the runner link's faults — cuts, half-open sockets, partitions, runner
crashes and drains, coordinator crashes, duplicated frames, a slow store — while actors
are created, woken, put to sleep, destroyed, crash, exit, set alarms and write their KV.

``CORRAL_SIM_ACTOR_SEEDS`` (default 300) seeds run in chunks of 50 per test;
``CORRAL_SIM_SEED=1234`` runs that one seed alone, as a failure message says.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from simstore import make_template
from simworld import simulate

CHUNK = 50
ONE = os.environ.get("CORRAL_SIM_SEED")
SEEDS = int(os.environ.get("CORRAL_SIM_ACTOR_SEEDS", "300"))
CHUNKS = (
    [(int(ONE), int(ONE) + 1)]
    if ONE
    else [(first, min(first + CHUNK, SEEDS)) for first in range(0, SEEDS, CHUNK)]
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Each seed's database lives in RAM (/dev/shm) when there is one (test_sim.py)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(prefix="corral-actor-sim-", dir=shm) as path:
            yield Path(path)
    else:
        yield tmp_path_factory.mktemp("sim")


@pytest.fixture(scope="module")
def template(workdir: Path) -> Path:
    return make_template(workdir / "template.db")


@pytest.mark.parametrize("seeds", CHUNKS, ids=[f"seeds_{a}-{b - 1}" for a, b in CHUNKS])
def test_actors_under_faults(seeds: tuple[int, int], template: Path, workdir: Path) -> None:
    stats: Counter[str] = Counter()
    for seed in range(*seeds):
        outcome = simulate(seed, template, workdir, with_actors=True)
        if outcome.failure is not None:
            pytest.fail(outcome.failure, pytrace=False)
        stats.update(outcome.stats)
    # The invariants hold trivially if nothing happens: the seeds must show actor
    # processes started under faults, and KV writes both applied and fenced off.
    if seeds[1] - seeds[0] >= CHUNK:
        assert stats["actor processes"] > seeds[1] - seeds[0], stats
        assert stats["kv ok"] > 0 and stats["kv actor_not_placed"] > 0, stats
        assert stats["crash_runner"] > 0 and stats["half_open"] > 0, stats
