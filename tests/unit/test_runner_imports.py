"""The runner process imports none of the coordinator's store (nor its PostgreSQL driver):
it runs on hosts that have no database, and what it shares with the coordinator (``Held``,
``RunnerSync``) lives in ``corral.runners``."""

from __future__ import annotations

import subprocess
import sys

RUNNER_MODULES = [
    "corral.runner.core",
    "corral.runner.websocket",
    "corral.runner.poll",
    "corral.runner.task_attempt",
]


def test_the_runner_never_imports_the_store_or_psycopg() -> None:
    probe = (
        "import importlib, sys\n"
        f"for name in {RUNNER_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert set(RUNNER_MODULES) <= set(loaded)  # the probe did import the runner
    forbidden = [
        m
        for m in loaded
        if m in ("corral.store", "psycopg") or m.startswith(("corral.store.", "psycopg."))
    ]
    assert forbidden == []
