"""A run's process (``corral.runner.process``): in its own process group, dead with its
runner even when the runner is SIGKILLed, and so is what it started in its group (the
group keeper, ``corral.runner.keeper``); its exit code and pipes as asyncio's subprocess
gives them, a missing program said plainly."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.agents.base import ProcessSpec
from corral.runner import keeper_program
from corral.runner.process import Child


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.01)


async def finished(child: Child) -> tuple[str, str, int]:
    """The child's stdout, stderr and exit code."""
    assert child.proc.stdout is not None and child.proc.stderr is not None
    out, err = await asyncio.gather(child.proc.stdout.read(), child.proc.stderr.read())
    return out.decode(), err.decode(), await child.proc.wait()


def run(
    argv: tuple[str, ...], cwd: str | None = None, env: dict[str, str] | None = None
) -> tuple[str, str, int]:
    async def main() -> tuple[str, str, int]:
        spec = ProcessSpec(argv, cwd, dict(os.environ) if env is None else env)
        return await finished(await Child.spawn(spec))

    return asyncio.run(main())


RUNNER = textwrap.dedent(
    """
    import asyncio, os, sys
    from corral.agents.base import ProcessSpec
    from corral.runner.keeper import Keeper
    from corral.runner.process import Child

    async def main():
        loop = asyncio.get_running_loop()
        # For each line read: a shell that starts a sleep in its group and prints both
        # pids; then the runner prints them and its keeper's, once the shell has exited
        # if the line says so.
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            script = "sleep 300 & echo $$ $!" + ("" if line.strip() == "exits" else "; wait")
            child = await Child.spawn(ProcessSpec(("sh", "-c", script), None, dict(os.environ)))
            pids = (await child.proc.stdout.readline()).decode().strip()
            if line.strip() == "exits":
                assert await child.proc.wait() == 0
            print(pids, Keeper.of_this_process().pid, flush=True)

    asyncio.run(main())
    """
)


class Runner:
    """A process that starts runs' processes as a runner does, to be SIGKILLed."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pids: list[int] = []  # every process it started, and their children

    def start_one(self, shell_exits: bool = False) -> tuple[int, int, int]:
        """Another run: its process's pid, its child's, the keeper's."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("exits\n" if shell_exits else "waits\n")
        self.proc.stdin.flush()
        shell, sleeper, keeper = (int(pid) for pid in self.proc.stdout.readline().split())
        self.pids += [shell, sleeper]
        return shell, sleeper, keeper

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def runner() -> Iterator[Runner]:
    runner = Runner()
    try:
        yield runner
    finally:
        runner.close()


def test_a_runs_processes_die_when_its_runner_is_sigkilled(runner: Runner) -> None:
    """The run's process by PR_SET_PDEATHSIG, what it started (its group) by the keeper."""
    shell, sleeper, _ = runner.start_one()
    assert alive(shell) and alive(sleeper)
    assert os.getpgid(shell) == shell and os.getsid(shell) == shell  # its own group
    assert os.getpgid(sleeper) == shell
    runner.proc.kill()
    assert runner.proc.wait(10) == -signal.SIGKILL
    wait_until(lambda: not alive(shell), "the runner's child to die with it")
    wait_until(lambda: not alive(sleeper), "its child, in its group, to die too")


def test_what_an_exited_run_left_in_its_group_dies_with_the_runner(runner: Runner) -> None:
    """Its sleep holds the run's pipes: the run is not over, another runner would run it
    again once this one is gone."""
    shell, sleeper, _ = runner.start_one(shell_exits=True)
    assert not alive(shell) and alive(sleeper)
    runner.proc.kill()
    wait_until(lambda: not alive(sleeper), "the shell's sleep to die with the runner")


def test_a_keeper_that_died_is_replaced_with_the_groups_still_running(runner: Runner) -> None:
    first_shell, first_sleeper, keeper = runner.start_one()
    os.kill(keeper, signal.SIGKILL)
    wait_until(lambda: not alive(keeper), "the keeper to die")
    assert alive(first_shell) and alive(first_sleeper)  # the keeper's death kills nothing
    second_shell, second_sleeper, second_keeper = runner.start_one()
    assert second_keeper != keeper
    runner.proc.kill()
    pids = (first_shell, first_sleeper, second_shell, second_sleeper)
    wait_until(lambda: not any(alive(pid) for pid in pids), "all four to die with the runner")


def test_a_missing_program_is_said_plainly(tmp_path: Path) -> None:
    """As the attempt tells it from a missing cwd: no file name, or the program's."""
    for program in ("corral-no-such-program", str(tmp_path / "missing")):
        with pytest.raises(FileNotFoundError) as caught:
            run((program,))
        assert caught.value.filename in (None, program)
        assert repr(program) in str(caught.value)
    with pytest.raises(FileNotFoundError) as caught:
        run(("true",), cwd=str(tmp_path / "missing"))
    assert caught.value.filename == str(tmp_path / "missing")


def test_exit_codes_and_deaths_by_signal() -> None:
    for script, expected in (
        ("exit 0", 0),
        ("exit 7", 7),
        ("exit 255", 255),
        ("kill -TERM $$", -signal.SIGTERM),
        ("kill -KILL $$", -signal.SIGKILL),
    ):
        assert run(("sh", "-c", script))[2] == expected, script


def test_concurrent_spawns_each_get_their_own_pipes_and_exit_code() -> None:
    async def main() -> list[tuple[str, str, int]]:
        env = dict(os.environ)
        children = await asyncio.gather(
            *(
                Child.spawn(
                    ProcessSpec(("sh", "-c", f"echo out{i}; echo err{i} >&2; exit {i}"), None, env)
                )
                for i in range(40)
            )
        )
        return list(await asyncio.gather(*(finished(child) for child in children)))

    results = asyncio.run(main())
    assert results == [(f"out{i}\n", f"err{i}\n", i) for i in range(40)]


def test_the_program_gets_its_argv_env_and_cwd_as_given(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "ONLY": "this one"}
    # What was exec'd: /proc/self/cmdline and /proc/self/environ, untouched by the shell.
    script = 'pwd -P; tr "\\0" "\\n" < /proc/$$/cmdline; echo; tr "\\0" "\\n" < /proc/$$/environ'
    out, err, code = run(("sh", "-c", script, "arg 1"), cwd=str(tmp_path), env=env)
    assert (err, code) == ("", 0)
    lines = out.splitlines()
    assert lines[0] == str(tmp_path.resolve())
    assert lines[1:5] == ["sh", "-c", script, "arg 1"]  # argv[0] as given, not its path
    assert lines[5] == ""
    assert sorted(lines[6:]) == sorted(f"{k}={v}" for k, v in env.items())


def test_the_keeper_keeps_a_group_while_anything_is_left_in_it() -> None:
    """Its look for groups now empty: a group whose leader exited is not one of them."""
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!"], stdout=subprocess.PIPE, start_new_session=True
    )
    assert shell.stdout is not None
    sleeper = int(shell.stdout.readline())
    shell.stdout.close()
    assert shell.wait() == 0
    try:
        assert keeper_program._running(shell.pid)  # the sleep is left in the group
    finally:
        os.kill(sleeper, signal.SIGKILL)
    alone = subprocess.Popen(["true"], start_new_session=True)
    assert alone.wait() == 0  # reaped: its group is empty
    assert not keeper_program._running(alone.pid)
