"""The simulation's store: the real ``Store`` on a fresh SQLite file per seed, watched.

- A template database is migrated once and copied for every seed (migrating is the slow
  part of opening a store).
- A trigger (test instrumentation only) logs every run status change into
  ``sim_transitions``: the invariants read it to count how often each effect happened.
  Two more log every KV write that was applied into ``sim_kv_writes``, with the placement
  its actor had in the same transaction.
- ``CrashingStore`` wraps the store the coordinator uses: armed with a budget of ``k``
  calls, the ``k+1``-th raises ``CoordinatorCrashed`` before it runs. A crash of the
  coordinator in the middle of a multi-transaction operation (events applied, but
  ``last_event_idx`` not yet recorded) is exactly that.
- ``sequential_ids`` makes run and runner ids a counter, so a seed replays identically.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import corral.ids
from corral.store import Store

TRANSITION_LOG = (
    """
CREATE TABLE sim_transitions (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   TEXT NOT NULL,
    old      TEXT NOT NULL,
    new      TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    runner   TEXT
)""",
    """
CREATE TRIGGER sim_status AFTER UPDATE OF status ON runs WHEN OLD.status != NEW.status
BEGIN
    INSERT INTO sim_transitions (run_id, old, new, attempts, runner)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts, COALESCE(NEW.runner_id, OLD.runner_id));
END""",
    """
CREATE TABLE sim_kv_writes (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    actor_id   TEXT NOT NULL,
    value      TEXT NOT NULL,
    runner_id  TEXT,
    generation INTEGER
)""",
    *(
        f"""
CREATE TRIGGER sim_kv_{when} AFTER {when.upper()} ON actor_kv
BEGIN
    INSERT INTO sim_kv_writes (actor_id, value, runner_id, generation)
    SELECT NEW.actor_id, NEW.value, p.runner_id, p.generation
    FROM (SELECT 1) LEFT JOIN actor_placements p ON p.actor_id = NEW.actor_id;
END"""
        for when in ("insert", "update")
    ),
)


def make_template(path: Path) -> Path:
    """A migrated database with the transition log, to copy for each seed."""
    store = Store.open(str(path))
    try:
        with store.db.transaction() as tx:
            for statement in TRANSITION_LOG:
                tx.execute(statement)
    finally:
        store.close()
    return path


def open_copy(template: Path, path: Path) -> Store:
    shutil.copyfile(template, path)
    return Store.open(str(path))


@contextlib.contextmanager
def sequential_ids() -> Iterator[None]:
    """run_000000000001, rnr_000000000002, …: the same ids for the same seed."""
    counter = itertools.count(1)
    original = corral.ids._new
    corral.ids._new = lambda prefix, nbytes=6: f"{prefix}_{next(counter):012d}"
    try:
        yield
    finally:
        corral.ids._new = original


class CoordinatorCrashed(Exception):
    """The coordinator process died before this store call."""


class _Budget:
    def __init__(self) -> None:
        self.left: int | None = None  # None: unlimited

    def spend(self) -> None:
        if self.left is None:
            return
        if self.left == 0:
            raise CoordinatorCrashed()
        self.left -= 1


class _Proxy:
    def __init__(self, target: Any, budget: _Budget) -> None:
        self._target = target
        self._budget = budget

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name.startswith("_") or not callable(value):
            return value
        budget = self._budget

        def call(*args: Any, **kwargs: Any) -> Any:
            budget.spend()
            return value(*args, **kwargs)

        return call


class CrashingStore(_Proxy):
    """The real store, with a budget of calls before the coordinator dies (see above)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, _Budget())
        # Every sub-store's calls spend the budget too (``store.runs.finish`` …).
        for name, sub in vars(store).items():
            if name != "db":
                setattr(self, name, _Proxy(sub, self._budget))

    def run_until_crash(self, fn: Callable[[], Any], budget: int) -> bool:
        """Run ``fn`` with ``budget`` store calls left; True if it ran to the end."""
        self._budget.left = budget
        try:
            fn()
        except CoordinatorCrashed:
            return False
        finally:
            self._budget.left = None
        return True
