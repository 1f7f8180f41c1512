"""A runner process waits for its children on pidfds, not with a thread per child."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import asyncio, threading
    from corral.runner.process import watch_children_with_pidfds

    async def main():
        watch_children_with_pidfds()
        proc = await asyncio.create_subprocess_exec("sh", "-c", "sleep 0.2; exit 3")
        threads = threading.active_count()  # while the child runs
        print(threads, await proc.wait())

    asyncio.run(main())
    """
)


def test_a_child_is_waited_for_without_a_thread() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.split() == ["1", "3"], out.stderr
