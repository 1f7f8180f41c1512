"""Output that works in CI and on a terminal (issue 15): plain aligned text when piped,
tables and colour on a terminal unless ``--no-color`` or ``NO_COLOR``; money as money and
times in local time with the zone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_support import CORRAL, Cluster, Runner
from terminal import Terminal

BOX = set("│┃┏┓┗┛━─┡┩")
ESC = "\x1b["


@pytest.fixture
def run_id(cluster: Cluster, runner: Runner) -> str:
    done = cluster.cli("start", "--wait", "--session", "costly", "hi [fake:cost=0.0375]")
    assert done.returncode == 0, done.stderr
    return done.stderr.split()[0]


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def test_piped_output_is_plain_with_money_and_local_times(cluster: Cluster, run_id: str) -> None:
    cluster.env["TZ"] = "America/New_York"
    listed = cluster.cli("runs", "list")
    assert listed.returncode == 0, listed.stderr
    assert not BOX & set(listed.stdout) and ESC not in listed.stdout
    header, row = listed.stdout.splitlines()
    assert header.split() == [
        "run", "type", "status", "runner", "attempts", "created", "cost", "error"
    ]  # fmt: skip
    assert row.split()[:3] == [run_id, "start_session", "completed"]
    assert "$0.0375" in row.split()
    assert " EST " in row or " EDT " in row  # local time, with its zone

    got = cluster.cli("runs", "get", run_id)
    fields = dict(line.split(":", 1) for line in got.stdout.splitlines())
    assert fields["cost"].strip() == "$0.0375"
    assert fields["status"].strip() == "completed"
    assert fields["finished"].strip().endswith(("EST", "EDT"))


def test_a_terminal_gets_tables_and_colour_unless_told_not_to(
    cluster: Cluster, run_id: str, terminals: list[Terminal]
) -> None:
    env = {**cluster.env, "CORRAL_URL": cluster.url}
    for argv, extra_env, colour in (
        ([CORRAL, "runs", "list"], {}, True),
        ([CORRAL, "--no-color", "runs", "list"], {}, False),
        ([CORRAL, "runs", "list"], {"NO_COLOR": "1"}, False),
    ):
        terminal = Terminal(argv, {**env, **extra_env}, cluster.root)
        terminals.append(terminal)
        assert terminal.wait() == 0, terminal.text
        assert BOX & set(terminal.text), terminal.text
        assert (ESC in terminal.text) is colour, (argv, extra_env, terminal.text)
        assert run_id in terminal.text
