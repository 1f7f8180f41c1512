"""Kill-at-random, the short version CI runs (the long one: ``benchmarks/kill_at_random.py``).

One plan of ten tasks is killed at random instants with git slowed down (see
``kill_at_random``), once with two ``tasks run`` started at once and ``git gc`` /
``git worktree prune`` run between two rounds; after every round the invariants hold, and
the plan ends as it should. The seed is printed, so a failure can be replayed with
``python tests/e2e/kill_at_random.py --seed N``.
"""

from __future__ import annotations

import random
from pathlib import Path

from kill_at_random import Figures, Slowness, run_plan

KILLS = 4
MAX_DELAY_S = 4.0


def test_kill_9_at_random_instants_loses_nothing(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    figures = Figures()
    run_plan(
        tmp_path,
        random.Random(seed),
        figures,
        max_kills=KILLS,
        max_delay=MAX_DELAY_S,
        slowness=Slowness(filter_s=0.01, hook_s=0.02),
        concurrent=True,
        maintenance=True,
    )
    print(figures.line())
    assert figures.violations == [], f"seed {seed}: {figures.violations}"
    assert figures.kills == KILLS
    assert figures.concurrent_refusals == 1
    assert figures.gc_rounds == 1
