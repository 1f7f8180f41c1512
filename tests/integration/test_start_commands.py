"""Start commands stored by the claim's own statement on PostgreSQL (``commands.START_RUN``,
``claims.fill``'s ``start``): what they hold is what the coordinator's ``start_run`` body
holds, they are numbered on from the runner's commands in claim order, and a claim that
takes a task run stores them as before (``test_task_store``)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from corral.assignment import Assignment
from corral.coordinator.link_core import _start_body
from corral.ids import RunnerId
from corral.runs import AgentSpec, NewRun, RunType
from corral.store import Store, claims
from corral.store.claims import fill
from corral.store.commands import START_RUN
from corral.store.db import Database

NOW = 1_700_000_000.0
pytestmark = pytest.mark.parametrize(
    "dialect", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def register(store: Store, slots: int, name: str = "r") -> RunnerId:
    runner, _ = store.runners.register(
        name=name, hostname="h", labels=(), slots=slots, version="0", transport="websocket", now=NOW
    )
    return runner.id


def command(**kw: Any) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=("echo", "hi"), **kw)


AGENT_RUN = NewRun(
    type=RunType.START_SESSION,
    prompt='fix the ünïcode "quotes" and \\ backslashes\n\ttabs \x01',
    agent=AgentSpec(
        name="coder",
        executor="claude",
        model="m",
        allowed_tools=("Read", "Edit"),
        system_prompt="be brief",
        max_turns=7,
        budget_usd=1.25,
        extra_args=("--x",),
        env={"A": "1"},
    ),
    session_name="s1",
    project_dir="/work/p",
    timeout_s=3600.0,
    idle_timeout_s=12.5,
    env={"K": "v", "EMPTY": ""},
)


def claim_stored(store: Store, runner: RunnerId, now: float) -> list[tuple[int, str]]:
    """The start commands the claim's statement itself stored (``Filled.commands``)."""
    with store.db.transaction() as tx:
        return fill(tx, store.db, runner, now, (), START_RUN).commands


def test_a_stored_start_holds_what_the_coordinators_start_run_holds(store: Store) -> None:
    runner = register(store, 3)
    store.runs.create_many([command(), AGENT_RUN, command(timeout_s=0.1, priority=5)], NOW)
    stored = claim_stored(store, runner, NOW + 0.25)
    assert [idx for idx, _ in stored] == [1, 2, 3]
    for idx, body in stored:
        run = store.runs.get(json.loads(body)["run"]["run_id"])
        assert json.loads(body) == _start_body(run)
        assert Assignment.from_json(json.loads(body)["run"]) == Assignment.from_json(
            _start_body(run)["run"]
        )
        (again,) = store.commands.unacknowledged(runner, idx - 1)[:1]
        assert (again.idx, again.stored) == (idx, body)
    # In claim order: the run of priority 5 first.
    assert json.loads(stored[0][1])["run"]["timeout_s"] == 0.1


def test_the_claims_starts_are_numbered_after_the_runners_commands(store: Store) -> None:
    runner = register(store, 4)
    store.commands.push(runner, [{"type": "x"}, {"type": "y"}], NOW)
    low, high, mid = store.runs.create_many(
        [command(priority=1), command(priority=9), command(priority=5)], NOW
    )
    commands, free = store.commands.claim_into_commands(runner, NOW + 1, _start_body, (), START_RUN)
    assert free == 1
    assert [c.idx for c in commands] == [3, 4, 5]
    assert [c.body["run"]["run_id"] for c in commands] == [high.id, mid.id, low.id]
    assert [c.stored for c in commands] == [
        c.stored for c in store.commands.unacknowledged(runner, 2)
    ]
    assert all(c.body == json.loads(c.stored or "") for c in commands)
    store.commands.push(runner, [{"type": "z"}], NOW + 2)
    assert [c.idx for c in store.commands.unacknowledged(runner, 5)] == [6]


def test_a_claim_that_reads_on_numbers_the_starts_of_each_statement_on(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past runs another claim holds the claim reads on, in another statement: the starts
    each stores follow on, in claim order."""
    made: list[bool] = []
    statement = claims._claim_statement

    def counted(db: Database, *, reading_on: bool, start: str | None = None) -> str:
        made.append(reading_on)
        return statement(db, reading_on=reading_on, start=start)

    monkeypatch.setattr(claims, "_claim_statement", counted)
    runner = register(store, 2)
    runs = [store.runs.create(command(), NOW + i) for i in range(20)]
    with psycopg.connect(store_url) as other:
        # The first statement reads 2 + 16 runs: it can lock only the first.
        held = [r.id for r in runs[1:18]]
        other.execute("SELECT id FROM runs WHERE id = ANY(%s) FOR NO KEY UPDATE", (held,))
        commands, free = store.commands.claim_into_commands(
            runner, NOW + 30, _start_body, (), START_RUN
        )
    assert (made, free) == ([False, True], 0)
    assert [(c.idx, c.body["run"]["run_id"]) for c in commands] == [
        (1, runs[0].id),
        (2, runs[18].id),
    ]
    assert [c.stored for c in store.commands.unacknowledged(runner, 0)] == [
        c.stored for c in commands
    ]
