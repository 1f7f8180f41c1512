"""The chaos soak, short: two rounds of chaos on two coordinators, four runners (two on
WebSocket, two on long-poll) and a PostgreSQL of the test's own (see ``soak.py``).

Whatever the seed, nothing is lost and nothing is executed twice
(``chaos_ledger.check``, after each round); the actors' requests through either gateway
are answered once or fail with a clear 5xx, their counters never go back or count twice,
no actor has two live generations (``actor_ledger.check_actors``); and the chaos really
happened: processes were killed while runs were created and ran, and actors answered.
The seed is printed; a failure is replayed with ``python tests/chaos/soak.py --seed N``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from soak import soak

pytestmark = pytest.mark.postgres


@pytest.mark.timeout(300)
def test_nothing_lost_nothing_run_twice_under_chaos(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    said: list[str] = []
    figures = soak(tmp_path, seed=seed, rounds=2, round_s=12.0, runs_per_s=2.5, report=said.append)
    print("\n".join(said))
    assert figures.violations == [], f"seed {seed}:\n" + "\n".join(said)
    assert figures.rounds == 2
    assert figures.coordinator_kills + figures.runner_kills > 0
    assert sum(figures.created.values()) > 20
    assert figures.verdict.final["completed"] > 10
    assert figures.actors.answers["200"] > 10
