"""The store's CPU per run on the control plane, without sockets or HTTP: ``run_cost.py``'s
runs replayed against the store in one thread, so that a change to SQL or to the store's
Python is measured without the event loop, the runners and the machine's other load
(on a shared machine run_cost.py's figure swings ±20 % between rounds; this one ±8 %).

--runs command runs are created in batches of 500 (POST /runs:batch: each batch its own
time), then 4 runners x 8 slots take them as runner sockets do: a round of the push loop
(``LinkCore.push_work``: the claim into start commands) and the runner's reports
(``LinkCore.apply``: started and finished, parsed as the socket parses them), grouped 3
calls a commit as the store writer takes them (``writer.run_group``); the runners
acknowledge their commands every 10 rounds. Thread CPU per run: creating, the groups, the
acknowledgements. ``--wal``: also the WAL frames (pages) a group's commit wrote, and which
tables and indexes they belonged to (the owners as of a snapshot taken half-way).

    python benchmarks/store_cost.py [--runs 10000] [--rounds 3] [--wal]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sqlite3
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.coordinator.link_core import LinkCore, PushRequest, parse_events
from corral.coordinator.settings import CoordinatorSettings
from corral.coordinator.writer import run_group
from corral.ids import RunnerId
from corral.protocol.messages import Indexed
from corral.runs import NewRun, RunType
from corral.store import Store
from corral.store.db import open_database

RUNNERS, SLOTS, BATCH, CALLS_A_COMMIT, ACK_EVERY = 4, 8, 500, 3, 10
COMMAND = NewRun(type=RunType.COMMAND, command=("true",))


def bench_runners(store: Store, count: int, slots: int) -> list[RunnerId]:
    """``count`` runners of ``slots`` slots each, registered as a runner socket registers."""
    now = time.time()
    return [
        store.runners.register(
            name=f"bench-{n}",
            hostname="h",
            labels=[],
            slots=slots,
            version="0",
            transport="websocket",
            now=now,
            held=None,
            revive=False,
        )[0].id
        for n in range(count)
    ]


class Replay:
    def __init__(self, path: Path, runs: int, wal: bool) -> None:
        self.path, self.runs = path, runs
        self.store = Store(open_database(str(path)))
        if wal:  # the WAL keeps every frame: each commit's can be read back
            self.store.db._conn().execute("PRAGMA wal_autocheckpoint=0")  # type: ignore[attr-defined]
        self.core = LinkCore(self.store, CoordinatorSettings())
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.runners = bench_runners(self.store, RUNNERS, SLOTS)
        self.event_idx = dict.fromkeys(self.runners, 0)
        self.sent = dict.fromkeys(self.runners, 0)
        self.held: dict[RunnerId, list[tuple[str, int]]] = {r: [] for r in self.runners}
        self.owners: dict[int, str] = {}
        self.wal_at = 0  # the WAL's size when the owners were read

    def timed(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        started = time.thread_time()
        try:
            return call(*args)
        finally:
            self.cpu[what] += time.thread_time() - started

    def run(self, wal: bool) -> None:
        now = time.time()
        for first in range(0, self.runs, BATCH):
            batch = [COMMAND] * min(BATCH, self.runs - first)
            at = now - 1 + first * 1e-5  # each batch its own time, as each POST has
            self.timed("create", self.store.runs.create_many, batch, at)
        done, rounds = 0, 0
        while done < self.runs:
            calls: list[Callable[[], Any]] = []
            for runner in self.runners:
                done += len(self.held[runner])
                calls += self.reports(runner, now)
                calls.append(functools.partial(self.push, runner, now))
            for first in range(0, len(calls), CALLS_A_COMMIT):
                group = calls[first : first + CALLS_A_COMMIT]
                self.timed("groups", run_group, self.store.db, group)
            rounds += 1
            if rounds % ACK_EVERY == 0:
                for runner in self.runners:
                    self.timed("acks", self.core.acknowledge, runner, self.sent[runner])
            if wal and not self.owners and done >= self.runs // 2:
                self.owners = page_owners(self.path)
                self.wal_at = self.path.with_name(self.path.name + "-wal").stat().st_size

    def reports(self, runner: RunnerId, now: float) -> list[Callable[[], Any]]:
        """What the runner reports of the runs it was sent: each started, then finished."""
        if not self.held[runner]:
            return []
        bodies: list[dict[str, Any]] = []
        for run_id, attempt in self.held[runner]:
            ran = {"run_id": run_id, "attempt": attempt}
            bodies.append({"type": "started", **ran})
            bodies.append({"type": "finished", **ran, "status": "completed", "exit_code": 0})
        events = []
        for body in bodies:
            self.event_idx[runner] += 1
            events.append(Indexed(self.event_idx[runner], body))
        parsed, last = parse_events(events), self.event_idx[runner]
        return [lambda: self.core.apply(runner, last, parsed, now)]

    def push(self, runner: RunnerId, now: float) -> None:
        finishing = frozenset(self.held[runner])
        pushed = self.core.push_work(runner, now, PushRequest(True, self.sent[runner], finishing))
        if pushed.commands:
            self.sent[runner] = pushed.commands[-1].idx
        self.held[runner] = [
            (c.body["run"]["run_id"], c.body["run"]["attempts"])
            for c in pushed.commands
            if c.body["type"] == "start_run"
        ]


def page_owners(path: Path) -> dict[int, str]:
    """Each page's table or index, as the last commit left them (read through the WAL)."""
    with sqlite3.connect(path) as conn:
        return {page: name for name, page in conn.execute("SELECT name, pageno FROM dbstat")}


def commits(path: Path, after: int, count: int) -> list[list[int]]:
    """The pages each of ``count`` commits after WAL offset ``after`` wrote."""
    data = path.with_name(path.name + "-wal").read_bytes()
    page_size = struct.unpack(">I", data[8:12])[0]
    frame = 24 + page_size
    found: list[list[int]] = []
    pages: list[int] = []
    offset = 32 + (after - 32) // frame * frame
    while offset + frame <= len(data) and len(found) < count:
        page, commit = struct.unpack(">II", data[offset : offset + 8])
        pages.append(page)
        if commit:
            found.append(pages)
            pages = []
        offset += frame
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wal", action="store_true", help="the pages each commit wrote")
    args = parser.parse_args()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    totals = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            replay = Replay(Path(tmp) / "store.db", args.runs, args.wal)
            replay.run(args.wal)
            us = {what: cpu * 1e6 / args.runs for what, cpu in replay.cpu.items()}
            totals.append(sum(us.values()))
            print(
                "  "
                + "  ".join(f"{what} {v:6.1f}" for what, v in us.items())
                + f"  total {totals[-1]:6.1f} µs a run",
                flush=True,
            )
            if args.wal:
                groups = commits(replay.path, replay.wal_at, 30)
                owned = collections.Counter(
                    replay.owners.get(p, "(new or free)") for pages in groups for p in pages
                )
                print(f"  {sum(map(len, groups)) / len(groups):.1f} pages a commit:")
                for name, n in owned.most_common(12):
                    print(f"    {n / len(groups):5.1f}  {name}")
            replay.store.close()
    print(
        f"median {statistics.median(totals):.1f} µs a run; load at the end: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
