"""The CLI imports a command's module only when that command runs: a client command (and
``corral runner``) starts without the coordinator, the store, psycopg or FastAPI, which cost
about a second of CPU on every call."""

from __future__ import annotations

import subprocess
import sys

import pytest

COORDINATOR = ("corral.coordinator", "corral.store", "psycopg", "fastapi")
# The runner serves its actors' local API with uvicorn; a client command serves nothing.
CLIENT_ONLY = (*COORDINATOR, "uvicorn")


def _modules_loaded_by(*argv: str) -> list[str]:
    probe = (
        "import sys\n"
        "from corral.cli.main import cli\n"
        f"cli.main({list(argv)!r}, standalone_mode=False)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(
    "argv",
    [
        ("runs", "list", "--help"),
        ("run", "--help"),
        ("logs", "--help"),
        ("status", "--help"),
        ("actors", "list", "--help"),
    ],
)
def test_a_client_command_loads_nothing_of_the_coordinator(argv: tuple[str, ...]) -> None:
    loaded = _modules_loaded_by(*argv)
    module = "corral.cli." + {"run": "submit", "logs": "runs"}.get(argv[0], argv[0])
    assert module in loaded  # the probe did load the command
    assert _of(loaded, CLIENT_ONLY) == []


def test_the_runner_loads_nothing_of_the_coordinator() -> None:
    loaded = _modules_loaded_by("runner", "--help")
    assert "corral.runner.core" in loaded
    assert _of(loaded, COORDINATOR) == []


def _of(loaded: list[str], packages: tuple[str, ...]) -> list[str]:
    return [m for m in loaded if m in packages or m.startswith(tuple(p + "." for p in packages))]


def test_serve_still_loads_the_coordinator() -> None:
    assert "corral.coordinator.app" in _modules_loaded_by("serve", "--help")
