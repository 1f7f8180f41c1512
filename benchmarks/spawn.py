"""Process start benchmark: what a runner pays to start a run's process (Child.spawn).

A start is one vfork and one exec, of the run's program itself; the group keeper
(corral.runner.keeper), started before the first, learns each group through a pipe after.

Measures, in one runner-like process (its event loop, the runner's modules imported):
  started  Child.spawn called → the process is running its program (it prints its own
           start time: `date +%s.%N`): p50, p99
  cycle    Child.spawn of `true` → its pipes closed and its exit code known: p50, p99
  CPU      of the whole start and exit, a spawn: this process, its helper (the group
           keeper, corral.runner.keeper) and every process they ran

    python benchmarks/spawn.py [--samples 500] [--concurrency 1]

Compare two trees by running it with PYTHONPATH=<tree>/src, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import corral
import corral.cli.runner  # the runner's modules: a runner's memory size
from corral.agents.base import ProcessSpec
from corral.runner.process import Child, run_loop

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> float:
    """This process's CPU, its reaped children's, and its live children's with theirs
    (the group keeper, alive while this process is, is counted as a live child)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += sum(int(v) for v in fields[11:15]) / TICKS
    return total


async def started(env: dict[str, str]) -> float:
    sent = time.time()
    child = await Child.spawn(ProcessSpec(("date", "+%s.%N"), None, env))
    assert child.proc.stdout is not None
    line = await child.proc.stdout.readline()
    assert await child.proc.wait() == 0
    return (float(line) - sent) * 1000


async def cycle(env: dict[str, str]) -> float:
    begin = time.perf_counter()
    child = await Child.spawn(ProcessSpec(("true",), None, env))
    assert child.proc.stdout is not None and child.proc.stderr is not None
    await child.proc.stdout.read()
    await child.proc.stderr.read()
    assert await child.proc.wait() == 0
    return (time.perf_counter() - begin) * 1000


async def measure(samples: int, concurrency: int) -> None:
    env = dict(os.environ)
    for _ in range(20):  # warm up (the group keeper starts at the first spawn)
        await cycle(env)
    starts, cycles = [], []
    for _ in range(samples):
        starts.append(await started(env))
        cycles.append(await cycle(env))
    before = cpu_seconds()
    wall = time.perf_counter()
    spawns = samples * concurrency
    for _ in range(samples):
        await asyncio.gather(*(cycle(env) for _ in range(concurrency)))
    wall = time.perf_counter() - wall
    cpu = cpu_seconds() - before

    def pct(values: list[float], p: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    print(
        f"{Path(corral.__file__).parents[2].name:<12} started p50 {pct(starts, 50):.3f} "
        f"p99 {pct(starts, 99):.3f} ms; cycle p50 {pct(cycles, 50):.3f} "
        f"p99 {pct(cycles, 99):.3f} mean {statistics.mean(cycles):.3f} ms; "
        f"{concurrency} at once: {spawns / wall:.0f} spawns/s, CPU {cpu / spawns * 1000:.3f} ms "
        f"a spawn (load {os.getloadavg()[0]:.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    run_loop(measure(args.samples, args.concurrency))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
