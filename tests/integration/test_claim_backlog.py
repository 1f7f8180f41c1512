"""A claim among many pending runs its runner cannot take (issue 16 §3): it still takes
exactly the runs the plain rule gives — every label the run requires is one of the runner's,
the runner it requires (if any) is this one, its backoff is over — first by priority, then
oldest, then by id. The claim reads pending runs by label class (``corral.store.claims``);
these tests hold it to that rule on both databases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.ids import RunId
from corral.runners import Runner
from corral.runs import NewRun, Run, RunReport, RunStatus, RunType
from corral.store import Store

NOW = 1_700_000_000.0


def command(**kw: Any) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=("true",), **kw)


def register(store: Store, name: str, labels: Sequence[str], slots: int = 100) -> Runner:
    runner, _ = store.runners.register(
        name=name,
        hostname="host",
        labels=labels,
        slots=slots,
        version="0.1.0",
        transport="http",
        now=NOW,
    )
    return runner


def expected(runs: Sequence[Run], runner: Runner, now: float, limit: int) -> list[RunId]:
    """The claim's rule, written plainly: the runs ``runner`` may take, in claim order."""
    fits = [
        r
        for r in runs
        if set(r.labels) <= set(runner.labels)
        and r.required_runner in (None, runner.name)
        and r.available_at <= now
    ]
    fits.sort(key=lambda r: (-r.priority, r.created_at, r.id))
    return [r.id for r in fits[:limit]]


def test_a_big_backlog_the_runner_cannot_take_leaves_its_runs_in_order(store: Store) -> None:
    """Thousands of older runs that need a label the runner lacks, or another runner, are
    passed over; the runs it can take come in claim order, whatever their class."""
    store.runs.create_many([command(labels=("gpu",)) for _ in range(2000)], NOW - 100)
    store.runs.create_many([command(required_runner="other") for _ in range(1000)], NOW - 100)
    store.runs.create_many([command(labels=("linux", "gpu")) for _ in range(500)], NOW - 50)
    mine = [
        *store.runs.create_many([command(), command(priority=5)], NOW),
        *store.runs.create_many(
            [command(labels=("linux",)), command(required_runner="me")], NOW + 1
        ),
        *store.runs.create_many(
            [command(labels=("arm", "linux"), required_runner="me"), command(priority=5)], NOW + 2
        ),
        *store.runs.create_many([command(labels=("linux",), priority=-1)], NOW + 3),
    ]
    later = store.runs.create(command(), NOW + 100)  # not yet available at the claims' time
    runner = register(store, "me", ["linux", "arm", "x86"])
    order = expected(mine, runner, NOW + 10, len(mine))
    claimed = [r.id for r in store.runs.claim(runner.id, 3, NOW + 10)]
    claimed += [r.id for r in store.runs.claim(runner.id, 3, NOW + 10)]
    claimed += [r.id for r in store.runs.claim(runner.id, 3, NOW + 10)]
    assert claimed == order
    assert store.runs.claim(runner.id, 3, NOW + 10) == []
    assert [r.id for r in store.runs.claim(runner.id, 3, NOW + 100)] == [later.id]
    gpu = register(store, "gpu-box", ["gpu"])
    assert len(store.runs.claim(gpu.id, 100, NOW + 100)) == 100  # the backlog, to its runner


LABELS = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3, unique=True)
RUN = st.fixed_dictionaries(
    {
        "labels": LABELS,
        "required_runner": st.sampled_from([None, None, "r1", "r2"]),
        "priority": st.integers(-1, 1),
        "batch": st.integers(0, 3),  # runs of one batch share created_at; a later one waits
    }
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=st.lists(RUN, max_size=25),
    runner_labels=LABELS,
    runner_name=st.sampled_from(["r1", "r2"]),
    limit=st.integers(1, 6),
)
def test_the_claim_takes_what_the_plain_rule_says(
    store: Store,
    specs: list[dict[str, Any]],
    runner_labels: list[str],
    runner_name: str,
    limit: int,
) -> None:
    with store.db.transaction() as tx:
        tx.execute("DELETE FROM runs")
    runs: list[Run] = []
    for batch in range(4):
        new = [
            command(
                labels=tuple(s["labels"]),
                required_runner=s["required_runner"],
                priority=s["priority"],
            )
            for s in specs
            if s["batch"] == batch
        ]
        runs += store.runs.create_many(new, NOW + batch)
    runner = register(store, runner_name, runner_labels)
    want = expected(runs, runner, NOW + 2, limit)
    assert [r.id for r in store.runs.claim(runner.id, limit, NOW + 2)] == want


@pytest.mark.parametrize("dialect", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_postgres_a_claim_passes_over_runs_another_claim_holds(
    store: Store, store_url: str
) -> None:
    """A run locked by another claim's transaction is passed over (``SKIP LOCKED``), and the
    claim still fills up with the runs after it, in order, from every class it fits."""
    first, second = store.runs.create_many([command(), command(labels=("a",))], NOW)
    third, fourth = store.runs.create_many([command(), command(labels=("a",))], NOW + 1)
    held = first if first.id < second.id else second
    runner = register(store, "me", ["a"])
    with psycopg.connect(store_url) as other:
        other.execute("SELECT id FROM runs WHERE id = %s FOR NO KEY UPDATE", (held.id,))
        claimed = [r.id for r in store.runs.claim(runner.id, 3, NOW + 2)]
    rest = [r.id for r in sorted([first, second], key=lambda r: r.id) if r.id != held.id]
    assert claimed == [*rest, *sorted([third.id, fourth.id])]
    assert [r.id for r in store.runs.claim(runner.id, 3, NOW + 2)] == [held.id]


@pytest.mark.parametrize("dialect", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_postgres_filling_slots_passes_over_held_runs_and_stops_at_the_free_slots(
    store: Store, store_url: str
) -> None:
    """Filling a runner's free slots counts them in the claim's own statement: past a run
    another claim holds it reads on, and it takes no more runs than the slots free — those
    it holds, but the one it has reported ended, are not."""
    runner = register(store, "me", [], slots=4)
    store.runs.create_many([command(), command()], NOW)
    busy, ending = store.runs.claim(runner.id, 2, NOW)  # held; the second reported ended
    runs = store.runs.create_many([command() for _ in range(6)], NOW + 1)
    ordered = sorted(runs, key=lambda r: r.id)
    start = lambda run: {"type": "start_run", "run_id": run.id}  # noqa: E731
    with psycopg.connect(store_url) as other:
        other.execute("SELECT id FROM runs WHERE id = %s FOR NO KEY UPDATE", (ordered[0].id,))
        commands, free = store.commands.claim_into_commands(
            runner.id, NOW + 2, start, finishing={(ending.id, ending.attempts), ("run_x", 1)}
        )
    assert [c.body["run_id"] for c in commands] == [r.id for r in ordered[1:4]]
    assert free == 0 and busy.id not in [c.body["run_id"] for c in commands]


def test_claimable_since_sees_runs_written_or_whose_backoff_ended_since(store: Store) -> None:
    """The reconciler's look (``has_claimable(since=…)``): a run written after ``since``,
    or one whose backoff ended after it, and nothing that waits unchanged before it."""
    store.runs.create_many([command(labels=("gpu",)) for _ in range(50)], NOW - 100)
    assert store.runs.has_claimable(NOW, since=NOW - 101)
    assert not store.runs.has_claimable(NOW, since=NOW - 100)
    runner = register(store, "gpu", ["gpu"])
    (run,) = store.runs.claim(runner.id, 1, NOW)
    assert run.runner_id is not None
    store.runs.mark_started(run.id, run.runner_id, run.attempts, NOW)
    given_back = RunReport(status=RunStatus.PENDING, error="rate limited", retry_after_s=60.0)
    store.runs.finish(run.id, run.runner_id, run.attempts, given_back, NOW + 1)  # waits to +61
    assert not store.runs.has_claimable(NOW + 30, since=NOW + 10)  # its backoff is not over
    assert store.runs.has_claimable(NOW + 62, since=NOW + 10)  # it ended after NOW + 10
    assert not store.runs.has_claimable(NOW + 62, since=NOW + 61)
    store.runs.create(command(), NOW + 70)
    assert store.runs.has_claimable(NOW + 70, since=NOW + 69)
    assert not store.runs.has_claimable(NOW + 69, since=NOW + 61)  # not yet written then


def test_the_claimable_read_gives_each_run_its_own_labels(store: Store) -> None:
    """The claim board's read (``RunStore.claimable``) parses each label set once a read:
    every run still comes with its own labels and required runner, in claim order."""
    specs = [command(labels=("a",)), command(), command(labels=("b", "a"), required_runner="r")]
    runs = [*store.runs.create_many(specs, NOW), *store.runs.create_many(specs, NOW + 1)]
    read = store.runs.claimable(NOW + 1, 10)
    want = sorted(runs, key=lambda r: (r.created_at, r.id))
    assert [c.run_id for c in read] == [r.id for r in want]
    assert [(c.labels, c.required_runner) for c in read] == [
        (frozenset(r.labels), r.required_runner) for r in want
    ]
