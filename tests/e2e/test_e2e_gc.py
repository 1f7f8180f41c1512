"""``corral gc`` as a real process on SQLite and PostgreSQL: it deletes what retention lets
go, keeps a session's result and a live run, and refuses a bad duration with exit 2."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from e2e_support import CORRAL

from corral.errors import NotFound
from corral.ids import RunnerId
from corral.runs import NewRun, Run, RunReport, RunStatus, RunType
from corral.store import Store

DAY = 86400.0


def gc(store_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return subprocess.run(
        [CORRAL, "gc", "--db", store_url, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def held_run(store: Store, runner: RunnerId, now: float) -> Run:
    store.runs.create(NewRun(type=RunType.COMMAND, command=("echo",)), now)
    (run,) = store.runs.claim(runner, 1, now)
    store.runs.mark_started(run.id, runner, 1, now)
    return run


def test_corral_gc_deletes_what_retention_lets_go(store: Store, store_url: str) -> None:
    long_ago = time.time() - 40 * DAY
    runner, _ = store.runners.register(
        name="r", hostname="r", labels=(), slots=4, version="0", transport="poll", now=long_ago
    )
    old = held_run(store, runner.id, long_ago)
    store.runs.finish(old.id, runner.id, 1, RunReport(status=RunStatus.COMPLETED), long_ago)
    live = held_run(store, runner.id, long_ago)

    kept = gc(store_url, "--retain-runs", "forever")
    assert kept.returncode == 0, kept.stderr
    assert "deleted 0 runs" in kept.stdout
    assert store.runs.get(old.id).status is RunStatus.COMPLETED

    done = gc(store_url, "--retain-runs", "30d")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("deleted 1 runs"), done.stdout
    with pytest.raises(NotFound):
        store.runs.get(old.id)
    assert store.runs.get(live.id).status is RunStatus.RUNNING
    assert store.runners.get(runner.id).id == runner.id

    bad = gc(store_url, "--retain-runs", "soon")
    assert bad.returncode == 2
    assert "not a duration" in bad.stderr
