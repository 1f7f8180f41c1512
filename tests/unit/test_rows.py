"""Rows to records: a run read from its row is the run ``Run``'s own constructor makes."""

from __future__ import annotations

import dataclasses

from corral.runs import AgentSpec, NewRun, Run, RunType
from corral.store.rows import new_run_row, run_from_row

NOW = 1_700_000_000.0


def test_a_run_from_its_row_has_every_field_and_equals_one_made_by_its_constructor() -> None:
    agent = AgentSpec(name="coder", executor="claude", model="sonnet")
    spec = NewRun(RunType.START_SESSION, prompt="hi", agent=agent, labels=("b", "a"))
    run = run_from_row({**new_run_row(spec, NOW), "exit_code": None})
    assert set(vars(run)) == {f.name for f in dataclasses.fields(Run)}
    assert run == Run(**vars(run))
    assert (run.labels, run.agent, run.created_at) == (("a", "b"), agent, NOW)


def test_runs_read_from_rows_have_their_own_commands() -> None:
    """Parsed commands are kept by their JSON: each run still reads its own."""
    commands = [("true",), ("make", "test"), ("true",), ("echo", "a b")]
    rows = [
        {**new_run_row(NewRun(RunType.COMMAND, command=c), NOW), "exit_code": None}
        for c in commands
    ]
    assert [run_from_row(row).command for row in rows] == commands
