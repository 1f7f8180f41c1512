"""The coordinator's CPU per run on SQLite and PostgreSQL: the dispatch benchmark's control
plane (4 runners x 8 slots whose runs start no process: noop_runner.py; --slots 32 for more
runs in flight), --rounds times on each database, each round on a coordinator and database
of its own.

CPU time per run holds up on a loaded machine where runs/s does not: this is the figure of
issue 16 §3 (goal ≤ 0.2 ms a run on SQLite). Also the share of it on the event loop's thread
(the rest is the store's worker threads and the interpreter's), and on PostgreSQL the CPU of
the server processes serving the coordinator. --profile records each round with py-spy
(collapsed stacks of the thread holding the GIL, or of every thread with --all-threads; pip
install py-spy).

    python benchmarks/run_cost.py [--runs 10000] [--rounds 3] [--db sqlite|postgres|both]
                                  [--slots 8] [--profile DIR] [--all-threads]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dispatch import NOOP_RUNNER, Throughput, cluster, cpu_seconds, database, measure_throughput
from events import PY_SPY, SPY_OPTIONS, database_cpu

# Every thread's Python stacks (the store's threads run SQL without the GIL).
ALL_THREADS = ["--format", "raw", "--rate", "200", "--nonblocking", "--output"]


@dataclass
class Round:
    measured: Throughput
    runs: int
    cpu_s: float  # the coordinator's process
    loop_cpu_s: float  # its main thread: the event loop
    database_cpu_s: float  # PostgreSQL's server processes serving it (0: SQLite)

    def ms(self, seconds: float) -> float:
        return seconds * 1000 / self.runs


def one_round(
    kind: str, runs: int, slots: int, profile: Path | None, spy_options: list[str]
) -> Round:
    with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as url:
        # Its connections named, their server processes' CPU is measured too.
        db = f"{url}&application_name={url.rsplit('%3D', 1)[1]}" if kind == "postgres" else url
        with cluster(db, 4, slots, Path(tmp), "websocket", NOOP_RUNNER) as target:
            pid = target.coordinator_pid
            spy = None
            if profile is not None:
                spy = subprocess.Popen(
                    [PY_SPY, "record", "--pid", str(pid), *spy_options, str(profile)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1)  # py-spy attached
            cpu, loop = cpu_seconds(pid), main_thread_cpu(pid)
            db_before = database_cpu(db)
            measured = measure_throughput(target, runs)
            cpu, loop = cpu_seconds(pid) - cpu, main_thread_cpu(pid) - loop
            db_after = database_cpu(db)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
    used_db = sum(after - db_before.get(p, 0.0) for p, after in db_after.items())
    return Round(measured, runs, cpu, loop, used_db)


def main_thread_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--slots",
        type=int,
        default=8,
        help="slots of each of the 4 runners: at 8 runs/s is bound by each slot's round trip "
        "(the machine is not all busy), at 32 by the machine",
    )
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--profile", type=Path, help="py-spy's collapsed stacks, a file a round")
    parser.add_argument(
        "--all-threads",
        action="store_true",
        help="profile every thread (by default the thread holding the GIL)",
    )
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    spy = ALL_THREADS if args.all_threads else SPY_OPTIONS
    print(f"load average at the start: {load()}", flush=True)
    for kind in kinds:
        rounds: list[Round] = []
        for n in range(args.rounds):
            profile = args.profile / f"{kind}-{n}.txt" if args.profile else None
            r = one_round(kind, args.runs, args.slots, profile, spy)
            rounds.append(r)
            print(
                f"  {kind:8} {r.measured.runs_per_s:6.0f} runs/s  coordinator "
                f"{r.ms(r.cpu_s):.3f} ms a run (event loop {r.ms(r.loop_cpu_s):.3f})  "
                f"database {r.ms(r.database_cpu_s):.3f} ms a run  runners "
                f"{r.measured.runners_cpu:.0f} % machine {r.measured.machine_cpu:.0f} % of a core "
                f"(load {load()})",
                flush=True,
            )

        def median(seconds: list[float]) -> float:
            return statistics.median(seconds) * 1000 / args.runs

        print(
            f"{kind:8} {args.runs} runs x {args.rounds}, 4 x {args.slots} slots, medians: "
            f"{statistics.median(r.measured.runs_per_s for r in rounds):6.0f} runs/s, "
            f"coordinator {median([r.cpu_s for r in rounds]):.3f} ms a run (event loop "
            f"{median([r.loop_cpu_s for r in rounds]):.3f}), database "
            f"{median([r.database_cpu_s for r in rounds]):.3f} ms a run",
            flush=True,
        )
    print(f"load average at the end: {load()}")


if __name__ == "__main__":
    main()
