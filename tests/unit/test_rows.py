"""Rows to records: a run read from its row is the run ``Run``'s own constructor makes."""

from __future__ import annotations

import dataclasses

from corral.runs import AgentSpec, NewRun, Run, RunType
from corral.store.rows import new_run_row, run_from_row, runs_from_tuples

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


def test_new_rows_hold_their_own_commands() -> None:
    """Commands' JSON is kept by the command: each new row still holds its own."""
    commands = [("true",), ("make", "test"), ("true",), ("echo", "a b"), ("é", '"')]
    texts = [new_run_row(NewRun(RunType.COMMAND, command=c), NOW)["command"] for c in commands]
    assert texts == [
        '["true"]',
        '["make","test"]',
        '["true"]',
        '["echo","a b"]',
        '["\\u00e9","\\""]',
    ]


def test_runs_read_from_tuples_are_the_runs_read_from_their_rows() -> None:
    """``runs_from_tuples`` (no dict a row) makes the run ``run_from_row`` makes, whatever
    order the columns come in; a read that joins what a callback became (or lacks a
    column) is made from its dicts."""
    agent = AgentSpec(name="coder", executor="claude", model="sonnet")
    rows = [
        {**new_run_row(NewRun(RunType.COMMAND, command=("true",)), NOW), "exit_code": None},
        {
            **new_run_row(NewRun(RunType.START_SESSION, prompt="hi", agent=agent), NOW),
            "exit_code": 3,
            "usage": '{"input_tokens":5}',
            "cancel_requested": 1,
            "runner_id": "rnr_1",
        },
    ]
    for names in (tuple(rows[0]), tuple(reversed(list(rows[0])))):
        tuples = [tuple(row[name] for name in names) for row in rows]
        made = runs_from_tuples(names, tuples)
        assert made == [run_from_row(row) for row in rows]
        assert [set(vars(run)) for run in made] == [{f.name for f in dataclasses.fields(Run)}] * 2
    joined = [{**row, "callback_recorded": 1, "callback_run_id": "run_2"} for row in rows]
    names = tuple(joined[0])
    made = runs_from_tuples(names, [tuple(row.values()) for row in joined])
    assert [(r.callback_state, r.callback_run_id) for r in made] == [("delivered", "run_2")] * 2
    lacking = {k: v for k, v in rows[0].items() if k != "depth"}
    assert runs_from_tuples(tuple(lacking), [tuple(lacking.values())]) == [run_from_row(lacking)]
    assert runs_from_tuples(names, []) == []
