"""A run's process (``corral.runner.process``): in its own process group, dead with its
runner even when the runner is SIGKILLed, and so is what it started, in its group or
carrying the runner's instance (the group keeper, ``corral.runner.keeper``); its exit code
and pipes as asyncio's subprocess gives them, a missing program said plainly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.agents.base import ProcessSpec
from corral.runner import keeper_program
from corral.runner.keeper import INSTANCE
from corral.runner.process import Child

SLEEP = shutil.which("sleep") or "/bin/sleep"


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

    if sys.argv[1:] == ["unregistered"]:
        # As if it were SIGKILLed between each start and its write to the keeper.
        Keeper.add = lambda keeper, pgid: None

    async def main():
        loop = asyncio.get_running_loop()
        # Each line read: "exits" or "waits", then a shell script to run as a run's
        # process; the runner prints the first line it printed and the keeper's pid, once
        # the shell has exited if it is to.
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            how, script = line.strip().split(" ", 1)
            child = await Child.spawn(ProcessSpec(("sh", "-c", script), None, dict(os.environ)))
            printed = (await child.proc.stdout.readline()).decode().strip()
            if how == "exits":
                assert await child.proc.wait() == 0
            print(printed, Keeper.of_this_process().pid, flush=True)

    asyncio.run(main())
    """
)


class Runner:
    """A process that starts runs' processes as a runner does, to be SIGKILLed."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.pids: list[int] = []  # every process it started, and their children

    def run(self, script: str, shell_exits: bool = False) -> list[str]:
        """What a run's shell printed first, then the keeper's pid."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{'exits' if shell_exits else 'waits'} {script}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()

    def start_one(self, shell_exits: bool = False) -> tuple[int, int, int]:
        """Another run that starts a sleep in its group: its process's pid, the sleep's,
        the keeper's."""
        script = "sleep 300 & echo $$ $!" + ("" if shell_exits else "; wait")
        shell, sleeper, keeper = (int(pid) for pid in self.run(script, shell_exits))
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
    """The run's process and what it started in its group, by the keeper."""
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


def test_what_left_its_runs_group_dies_with_the_runner(runner: Runner) -> None:
    """A daemon's setsid: it keeps the runner's instance in its environment."""
    shell, daemon, _ = (int(pid) for pid in runner.run("setsid sleep 300 & echo $$ $!; wait"))
    runner.pids += [shell, daemon]
    wait_until(lambda: os.getsid(daemon) == daemon, "the sleep to be in a session of its own")
    runner.proc.kill()
    wait_until(lambda: not alive(shell) and not alive(daemon), "both to die with the runner")


def test_a_run_started_as_its_runner_died_dies_with_it() -> None:
    """The runner SIGKILLed between a start and its write of the group to the keeper (here
    it never writes): the keeper finds the run's processes by the runner's instance in
    their environment, and kills their groups, so what exec'd with another environment in
    the run's group too. A process with another instance is not the runner's."""
    runner = Runner("unregistered")
    bystanders: list[subprocess.Popen[bytes]] = []
    try:
        script = f"env -i {SLEEP} 300 & c=$!; setsid sleep 300 & echo $$ $c $! ${INSTANCE}; wait"
        printed = runner.run(script)
        shell, cleared, daemon = (int(pid) for pid in printed[:3])
        instance, keeper = printed[3], int(printed[4])
        runner.pids += [shell, cleared, daemon]
        for other in (f"{os.getpid()}.0123456789abcdef", f"{instance}0"):
            environment = {**os.environ, INSTANCE: other}
            bystanders.append(subprocess.Popen([SLEEP, "300"], env=environment))
        wait_until(lambda: Path(f"/proc/{cleared}/environ").read_bytes() == b"", "env -i")
        wait_until(lambda: os.getsid(daemon) == daemon, "the setsid")
        assert os.getpgid(cleared) == shell
        runner.proc.kill()
        pids = (shell, cleared, daemon)
        wait_until(lambda: not any(alive(pid) for pid in pids), "the three to die with it")
        wait_until(lambda: not alive(keeper), "the keeper to be done")
        assert [bystander.poll() for bystander in bystanders] == [None, None]
    finally:
        for bystander in bystanders:
            bystander.kill()
            bystander.wait()
        runner.close()


def test_a_runners_keeper_does_not_carry_an_instance_it_inherited() -> None:
    """A runner started by a run of another runner: that runner's keeper would kill this
    one's before it killed this runner's runs. Its runs carry its own instance."""
    runner = Runner(env={**os.environ, INSTANCE: "1.outer"})
    try:
        printed = runner.run(f"echo $$ ${INSTANCE}; wait")
        shell, instance, keeper = int(printed[0]), printed[1], int(printed[2])
        runner.pids.append(shell)
        assert instance == f"{runner.proc.pid}.{instance.split('.')[1]}"
        variables = Path(f"/proc/{keeper}/environ").read_bytes().split(b"\0")
        assert not any(variable.startswith(f"{INSTANCE}=".encode()) for variable in variables)
    finally:
        runner.close()


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


# Orphans made on purpose live in a pid namespace of their own (``unshare``, as root): a
# runner starting in another test meanwhile would kill them (it kills the orphans of its
# namespace only). The scenario runs there as its pid 1 and prints what it saw.
ORPHANS_LEFT = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    RUNNER, INSTANCE, SLEEP = sys.argv[1:4]

    def alive(pid):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")

    def start_runner():
        return subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)

    def run(runner, script):
        runner.stdin.write(f"waits {script}\\n")
        runner.stdin.flush()
        return runner.stdout.readline().split()

    runner, live = start_runner(), start_runner()
    script = f"{SLEEP} 300 & echo $$ $! ${INSTANCE}; wait"
    shell, daemon, instance, keeper = run(runner, "setsid " + script)
    live_shell, _, live_instance, _ = run(live, script)
    bystanders = [
        subprocess.Popen([SLEEP, "300"], env={**os.environ, INSTANCE: other})
        for other in (f"{os.getpid()}.0123456789abcdef", f"{instance}0", "1.outer")
    ]
    os.kill(int(keeper), signal.SIGSTOP)  # it cannot act on the runner's death
    runner.kill()
    runner.wait()
    os.kill(int(keeper), signal.SIGKILL)
    while alive(int(keeper)):
        time.sleep(0.01)
    left = alive(int(shell)) and alive(int(daemon))
    # A runner that starts, though its coordinator is not there (yet).
    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    restarted = subprocess.Popen([corral, "runner", "--url", "http://127.0.0.1:9", "--token", "t"],
                                 stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 10
    while (alive(int(shell)) or alive(int(daemon))) and time.monotonic() < end:
        time.sleep(0.01)
    killed = not alive(int(shell)) and not alive(int(daemon))
    restarted.terminate()
    said = [line.strip() for line in restarted.stderr if "of a dead runner" in line]
    print(json.dumps({
        "left": left, "killed": killed, "said": said, "orphans": [shell, daemon],
        "live": alive(int(live_shell)), "instances": [instance, live_instance],
        "bystanders": [b.poll() for b in bystanders],
    }))
    """
)


def in_own_pid_namespace(script: str, *args: str) -> Any:
    """What ``script`` printed (JSON), run as pid 1 of a new pid namespace."""
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    done = subprocess.run(
        [*argv, sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_runner_starting_kills_what_a_runner_killed_with_its_keeper_left() -> None:
    """A ``pkill -9 -f corral``: the runner and its keeper die at once and the runs live
    on; the next runner to start on the host kills them (``kill_orphans``), the run's
    group and what left it, before it takes work, and says so. Processes carrying the
    instance of a live runner, or a value no runner made, live on."""
    seen = in_own_pid_namespace(ORPHANS_LEFT, RUNNER, INSTANCE, SLEEP)
    assert seen["left"]  # the gap the next start closes
    assert seen["killed"]
    (said,) = seen["said"]
    assert said.endswith(" ".join(sorted(seen["orphans"], key=int)))
    assert seen["live"] and seen["instances"][0] != seen["instances"][1]
    assert seen["bystanders"] == [None, None, None]


SPARED = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from corral.runner import keeper_program
    INSTANCE, SLEEP = sys.argv[1:3]
    gone = 4242  # no process of this new namespace
    environment = {**os.environ, INSTANCE: f"{gone}.0123456789abcdef"}
    carrier = subprocess.Popen([SLEEP, "300"], env=environment)
    seen = [carrier.pid in set(keeper_program.orphans(spared)) for spared in ((), (carrier.pid,))]
    carrier.kill()
    print(json.dumps(seen))
    """
)


def test_a_runner_does_not_kill_what_carries_its_own_instance() -> None:
    """Nor its ancestors' (a runner started by a run whose runner is gone)."""
    assert in_own_pid_namespace(SPARED, INSTANCE, SLEEP) == [True, False]


def test_a_runner_does_not_judge_processes_of_another_pid_namespace() -> None:
    """A container's runner, seen from the host: its pids are of its own namespace."""
    dead = subprocess.Popen([SLEEP, "0"])
    dead.wait()  # gone here; in the container, the pid of its live runner
    carried = f"{INSTANCE}={dead.pid}.0123456789abcdef"
    argv = ["unshare", "--pid", "--fork", "--kill-child", "env", carried, SLEEP, "300"]
    contained = subprocess.Popen(argv)
    try:
        wait_until(lambda: len(children(contained.pid)) == 1, "the sleep in its namespace")
        (sleeper,) = children(contained.pid)
        environ = Path(f"/proc/{sleeper}/environ")
        wait_until(lambda: carried.encode() in environ.read_bytes().split(b"\0"), "its exec")
        assert sleeper not in set(keeper_program.orphans(spared=()))
    finally:
        contained.kill()
        contained.wait()


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_keeper_that_died_is_replaced_at_once(runner: Runner) -> None:
    """Not at the next start: until then, the runner's death would kill nothing."""
    shell, sleeper, keeper = runner.start_one()
    os.kill(keeper, signal.SIGKILL)
    wait_until(lambda: bool(keepers(runner.proc.pid) - {keeper}), "another keeper")
    runner.proc.kill()
    wait_until(lambda: not alive(shell) and not alive(sleeper), "both to die with the runner")


def keepers(runner: int) -> set[int]:
    """The live processes ``runner`` started that run the keeper's program."""
    children: set[int] = set()
    for task in Path(f"/proc/{runner}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended
            children.update(int(pid) for pid in (task / "children").read_text().split())
    program = keeper_program.__file__.encode()
    return {pid for pid in children if alive(pid) and program in cmdline(pid)}


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # it is gone


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
    instance = next(line for line in lines[6:] if line.startswith(f"{INSTANCE}="))
    assert sorted(lines[6:]) == sorted([*(f"{k}={v}" for k, v in env.items()), instance])


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
