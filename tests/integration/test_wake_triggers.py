"""The wake-up triggers on PostgreSQL (``corral.store.wakeups``): what each change of a run
sends, in its transaction's commit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from corral.runs import NewRun, Run, RunReport, RunStatus, RunType
from corral.store import Store
from corral.store.wakeups import channel

NOW = 1_700_000_000.0
pytestmark = pytest.mark.parametrize(
    "dialect", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


@contextmanager
def heard(pg_url: str, schema: str) -> Iterator[Callable[[Callable[[], object]], list[str]]]:
    """``hear(step)``: the topics the schema's channel carried for ``step``, in order. Each
    step is followed by a marker sent from another session: notifications arrive in
    commit order, so what came before the marker is the step's."""
    name = channel(schema)
    with (
        psycopg.connect(pg_url, autocommit=True) as listener,
        psycopg.connect(pg_url, autocommit=True) as marker,
    ):
        listener.execute(f"LISTEN {name}")
        steps = 0

        def hear(step: Callable[[], object]) -> list[str]:
            nonlocal steps
            steps += 1
            step()
            marker.execute("SELECT pg_notify(%s, %s)", (name, f"marker {steps}"))
            topics = []
            for note in listener.notifies(timeout=30):
                if note.payload == f"marker {steps}":
                    return topics
                topics.append(note.payload.split(" ", 1)[1])
            raise AssertionError("the marker never came")

        yield hear


def test_each_change_of_a_run_wakes_whom_it_concerns_and_a_claim_or_start_nobody(
    store: Store, pg_url: str, pg_schema: str
) -> None:
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=(), slots=2, version="0", transport="http", now=NOW
    )
    command = NewRun(type=RunType.COMMAND, command=("true",))
    with heard(pg_url, pg_schema) as hear:
        assert hear(lambda: store.runs.create_many([command, command], NOW)) == ["runs"]
        claims: list[list[Run]] = []
        assert hear(lambda: claims.append(store.runs.claim(runner.id, 1, NOW + 1))) == []
        (claimed,) = claims[0]
        assert hear(lambda: store.runs.mark_started(claimed.id, runner.id, 1, NOW + 2)) == []
        assert hear(lambda: store.runs.request_cancel(claimed.id, NOW + 3)) == [
            f"runner:{runner.id}",
            f"logs:{claimed.id}",
        ]
        cancelled = RunReport(status=RunStatus.CANCELLED, exit_code=None)
        assert hear(lambda: store.runs.finish(claimed.id, runner.id, 1, cancelled, NOW + 4)) == [
            f"logs:{claimed.id}"
        ]
        assert hear(lambda: store.runs.create(command, NOW + 5)) == ["runs"]


def test_a_claim_and_a_start_call_no_wake_up_function(store: Store) -> None:
    """They send nothing (above): the runs' update trigger is not even called for them, a
    plpgsql call a run saved (migration 24). Counted in the transaction that claims."""
    runner, _ = store.runners.register(
        name="r", hostname="h", labels=(), slots=1, version="0", transport="http", now=NOW
    )
    store.runs.create(NewRun(type=RunType.COMMAND, command=("true",)), NOW)
    calls = "SELECT COALESCE(pg_stat_get_xact_function_calls('corral_wake_runs'::regproc), 0) AS n"
    with store.db.transaction() as tx:
        tx.execute("SET LOCAL track_functions = 'pl'")
        (claimed,) = store.runs.claim(runner.id, 1, NOW + 1)
        store.runs.mark_started(claimed.id, runner.id, 1, NOW + 2)
        assert tx.one(calls) == {"n": 0}
        store.runs.request_cancel(claimed.id, NOW + 3)
        assert tx.one(calls) == {"n": 1}  # a cancel of a held run: it is called
