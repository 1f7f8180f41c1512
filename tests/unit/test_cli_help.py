"""The CLI's help (issue 15): every command and option says what it does; every flag of
run/start/resume reads its CORRAL_* variable; every command that prints has --json."""

from __future__ import annotations

from collections.abc import Iterator

import click

from corral.cli.main import cli

PRINTING = [
    "run",
    "start",
    "resume",
    "logs",
    "wait",
    "result",
    "runs list",
    "runs get",
    "runs cancel",
    "runs retry",
    "runners list",
    "runners drain",
    "runners stop",
    "sessions list",
    "sessions show",
    "tasks status",
    "tasks graph",
    "status",
    "doctor",
    "agents list",
]


def _commands(group: click.Command = cli, path: str = "") -> Iterator[tuple[str, click.Command]]:
    yield path, group
    if isinstance(group, click.Group):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            assert sub is not None, name
            yield from _commands(sub, f"{path} {name}".strip())


def _command(path: str) -> click.Command:
    return dict(_commands())[path]


def test_every_command_and_option_says_what_it_does() -> None:
    undocumented = [
        f"{path} {' '.join(param.opts)}"
        for path, command in _commands()
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not param.help
    ]
    assert undocumented == []
    assert [path for path, command in _commands() if not command.help] == []


def test_every_flag_of_run_start_resume_reads_its_variable() -> None:
    for name in ("run", "start", "resume"):
        options = [p for p in _command(name).params if isinstance(p, click.Option)]
        missing = [p.opts[0] for p in options if not str(p.envvar or "").startswith("CORRAL_")]
        assert missing == [], name


def test_every_command_that_prints_has_json() -> None:
    lacking = [path for path in PRINTING if "--json" not in _opts(_command(path))]
    assert lacking == []


def test_the_coordinator_is_url_everywhere() -> None:
    for path, command in _commands():
        names = _opts(command)
        if "--coordinator" in names:
            assert "--url" in names, path


def _opts(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in param.opts}
