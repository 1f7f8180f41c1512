"""The deterministic simulation (see simworld.py), over thousands of seeds.

``CORRAL_SIM_SEEDS`` (default 2000) seeds run in chunks of 100 per test;
``CORRAL_SIM_SEED=1234`` runs that one seed alone, as a failure message says.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from simstore import make_template
from simworld import simulate

CHUNK = 100
ONE = os.environ.get("CORRAL_SIM_SEED")
SEEDS = int(os.environ.get("CORRAL_SIM_SEEDS", "2000"))
CHUNKS = (
    [(int(ONE), int(ONE) + 1)]
    if ONE
    else [(first, min(first + CHUNK, SEEDS)) for first in range(0, SEEDS, CHUNK)]
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where each seed's database lives: RAM (/dev/shm) when there is one. A database is
    written a few hundred times per seed and thrown away; on a disk, its fsyncs (WAL
    checkpoints) would cost more than the simulation."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(prefix="corral-sim-", dir=shm) as path:
            yield Path(path)
    else:
        yield tmp_path_factory.mktemp("sim")


@pytest.fixture(scope="module")
def template(workdir: Path) -> Path:
    return make_template(workdir / "template.db")


@pytest.mark.parametrize("seeds", CHUNKS, ids=[f"seeds_{a}-{b - 1}" for a, b in CHUNKS])
def test_simulation(seeds: tuple[int, int], template: Path, workdir: Path) -> None:
    obeyed = 0
    for seed in range(*seeds):
        outcome = simulate(seed, template, workdir)
        if outcome.failure is not None:
            pytest.fail(outcome.failure, pytrace=False)
        obeyed += outcome.stats.get("cancels obeyed", 0)
    # The invariants allow a run a client asked to cancel to complete (the cancel came too
    # late): were cancel commands never delivered, they would all hold. So the seeds must
    # show stored cancels reaching running processes.
    if seeds[1] - seeds[0] >= CHUNK:
        assert obeyed > 0, "no cancel command reached a running process in these seeds"
