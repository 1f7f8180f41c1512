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


SPAWNED = textwrap.dedent(
    """
    import asyncio, os, signal, sys, threading, warnings
    warnings.simplefilter("error")
    if sys.argv[1] == "without-uvloop":
        sys.modules["uvloop"] = None
    from corral.agents.base import ProcessSpec
    from corral.runner.process import Child, run_loop

    async def main():
        script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
        env = dict(os.environ)
        child = await Child.spawn(ProcessSpec((sys.executable, "-c", script), None, env))
        threads = threading.active_count()
        out = await child.proc.stdout.read()
        err = await child.proc.stderr.read()
        code = await child.proc.wait()
        again = await child.proc.wait()  # as often as asked
        sleeper = await Child.spawn(ProcessSpec(("sleep", "30"), None, env))
        waiters = [asyncio.ensure_future(sleeper.proc.wait()) for _ in range(2)]
        waiters[0].cancel()  # one waiter gone: the others still hear of the exit
        stopped = await sleeper.stop(5.0)
        return (threads, out.decode().strip(), err.decode().strip(), code, again,
                stopped, await waiters[1], sleeper.proc.returncode)

    print(*run_loop(main()))
    """
)


@pytest.mark.parametrize("mode", ["with-uvloop", "without-uvloop"])
def test_a_spawned_child_is_read_and_reaped_in_the_loop(mode: str) -> None:
    """Its output through the loop's pipes, its exit code (-N for signal N) through a
    pidfd: no thread, no warning of a pipe or a process left open."""
    out = subprocess.run(
        [sys.executable, "-c", SPAWNED, mode], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "out", "err", "3", "3", "-15", "-15", "-15"], out.stderr
    assert out.stderr == ""
