"""The coordinator's CPU per run on SQLite and PostgreSQL: the dispatch benchmark's control
plane (4 runners x 8 slots whose runs start no process: noop_runner.py), --rounds times on
each database, each round on a coordinator and database of its own.

CPU time per run holds up on a loaded machine where runs/s does not: this is the figure of
issue 16 §3 (goal ≤ 0.2 ms a run on SQLite). On PostgreSQL the server processes serving
the coordinator are measured too. --profile records each round with py-spy (collapsed
stacks of the thread holding the GIL, or of every thread with --all-threads; pip install
py-spy).

    python benchmarks/run_cost.py [--runs 10000] [--rounds 3] [--db sqlite|postgres|both]
                                  [--profile DIR] [--all-threads]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from events import SPY_OPTIONS, Phase, throughput

# Every thread's Python and native stacks (the store's threads run SQL without the GIL).
ALL_THREADS = ["--format", "raw", "--rate", "200", "--nonblocking", "--native", "--output"]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--profile", type=Path, help="py-spy's collapsed stacks, a file a round")
    parser.add_argument(
        "--all-threads",
        action="store_true",
        help="profile every thread with native frames (by default the thread holding the GIL)",
    )
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {load()}", flush=True)
    for kind in kinds:
        phases: list[Phase] = []
        for n in range(args.rounds):
            profile = args.profile / f"{kind}-{n}.txt" if args.profile else None
            spy = ALL_THREADS if args.all_threads else SPY_OPTIONS
            phase = throughput(kind, args.runs, 0, True, profile, spy)
            phases.append(phase)
            print(
                f"  {kind:8} {phase.measured.runs_per_s:6.0f} runs/s  coordinator "
                f"{phase.cpu_ms_per_run:.3f} ms a run  database "
                f"{phase.database_ms_per_run(args.runs):.3f} ms a run  (load {load()})",
                flush=True,
            )
        print(
            f"{kind:8} {args.runs} runs x {args.rounds}, medians: "
            f"{statistics.median(p.measured.runs_per_s for p in phases):6.0f} runs/s, "
            f"coordinator {statistics.median(p.cpu_ms_per_run for p in phases):.3f} ms a run, "
            f"database {statistics.median(p.database_ms_per_run(args.runs) for p in phases):.3f}"
            " ms a run",
            flush=True,
        )
    print(f"load average at the end: {load()}")


if __name__ == "__main__":
    main()
