"""A runner process waits for its children without a thread per child: on uvloop (libuv
watches them) when it is installed, else on asyncio with pidfds."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
    """
    import asyncio, sys, threading
    if sys.argv[1] == "without-uvloop":
        sys.modules["uvloop"] = None  # an import of it raises ImportError
    from corral.runner.process import run_loop

    async def main():
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", "sleep 0.2; exit 3", start_new_session=True, preexec_fn=lambda: None
        )
        threads = threading.active_count()  # while the child runs
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        return threads, await proc.wait(), loop

    print(*run_loop(main()))
    """
)


@pytest.mark.parametrize(
    ("mode", "loop"), [("with-uvloop", "uvloop"), ("without-uvloop", "asyncio")]
)
def test_a_child_is_waited_for_without_a_thread(mode: str, loop: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.split() == ["1", "3", loop], out.stderr
