"""Kill-at-random soak: ``corral tasks run`` SIGKILLed at random instants, hundreds of times.

The long run of ``tests/e2e/kill_at_random.py`` (its docstring lists the invariants checked
after every round); CI runs a short version (``tests/e2e/test_tasks_kill_at_random.py``).
Prints the figures after each plan and exits 1 if any invariant was violated; the
directory of a plan with a violation is kept and named.

    nice python benchmarks/kill_at_random.py [--kills 500] [--seed N] [--max-delay 6]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

from kill_at_random import main

if __name__ == "__main__":
    sys.exit(main())
