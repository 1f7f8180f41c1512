"""The Store's contract, run against SQLite and PostgreSQL alike.

Time is an argument of every operation, so each test drives it with explicit ``now``
values; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import corral.runs
from corral.errors import IllegalTransition, InvalidRequest, LeaseLost, NotFound
from corral.ids import RunId, RunnerId
from corral.runners import Held, Runner, RunnerState, RunnerSync
from corral.runs import AgentSpec, Ended, NewRun, Run, RunReport, RunStatus, RunType
from corral.store import LogLine, Reconciled, Store, coordinators
from corral.store import reconcile as reconcile_module
from corral.store.commands import Command
from corral.store.db import migrate
from corral.store.rows import MAX_PARAMETERS
from corral.store.schema import LATEST_VERSION, MIGRATIONS

NOW = 1_700_000_000.0
LOST_AFTER = 30.0
GRACE = 5.0
AGENT = AgentSpec(name="coder", executor="claude", model="sonnet", allowed_tools=("Read",))


# ---- helpers ---------------------------------------------------------------------------------


def command(**kw: Any) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=("echo", "hi"), **kw)


def agent_run(**kw: Any) -> NewRun:
    fields: dict[str, Any] = {"prompt": "fix the bug", "agent": AGENT, "project_dir": "/p"}
    fields.update(kw)
    return NewRun(**{"type": RunType.START_SESSION, **fields})


def register(
    store: Store,
    *,
    labels: Sequence[str] = (),
    slots: int = 4,
    now: float = NOW,
    name: str = "r",
    runner_id: str | None = None,
    held: Sequence[Held] = (),
) -> Runner:
    runner, _ = store.runners.register(
        name=name,
        hostname=f"{name}.host",
        labels=labels,
        slots=slots,
        version="0.1.0",
        transport="http",
        now=now,
        runner_id=runner_id,
        held=held,
    )
    return runner


def claim_one(store: Store, runner: Runner, now: float = NOW) -> Run:
    runs = store.runs.claim(runner.id, 1, now)
    assert len(runs) == 1, f"expected one run for {runner.id}, got {runs}"
    return runs[0]


def start(store: Store, run: Run, now: float = NOW) -> Run:
    assert run.runner_id is not None
    store.runs.mark_started(run.id, run.runner_id, run.attempts, now)
    return store.runs.get(run.id)


def running(store: Store, runner: Runner, spec: NewRun | None = None, now: float = NOW) -> Run:
    """A run created, claimed by ``runner`` and started."""
    store.runs.create(spec or command(), now)
    return start(store, claim_one(store, runner, now), now)


def finish(
    store: Store,
    run: Run,
    status: RunStatus = RunStatus.COMPLETED,
    now: float = NOW + 1,
    **kw: Any,
) -> Run:
    assert run.runner_id is not None
    report = RunReport(status=status, **kw)
    return store.runs.finish(run.id, run.runner_id, run.attempts, report, now)


def held(*runs: Run) -> list[Held]:
    return [Held(r.id, r.attempts) for r in runs]


# ---- create / get / list ---------------------------------------------------------------------


def test_create_and_get_round_trip(store: Store) -> None:
    spec = agent_run(
        session_name="s1",
        labels=("gpu", "arm"),
        timeout_s=60.0,
        idle_timeout_s=5.0,
        max_attempts=2,
        priority=7,
        required_runner="box-7",
        env={"A": "1"},
    )
    created = store.runs.create(spec, NOW)
    got = store.runs.get(created.id)
    assert got == created
    assert got.status is RunStatus.PENDING
    assert got.agent == AGENT
    assert got.labels == ("arm", "gpu")
    assert (got.attempts, got.max_attempts, got.priority) == (0, 2, 7)
    assert got.required_runner == "box-7"
    assert got.env == {"A": "1"}
    assert got.available_at == got.created_at == NOW
    assert got.runner_id is None and got.exit_code is None and not got.cancel_requested


def test_create_runs_is_one_batch(store: Store) -> None:
    runs = store.runs.create_many([command(priority=i) for i in range(5)], NOW)
    assert len({r.id for r in runs}) == 5
    assert [store.runs.get(r.id).priority for r in runs] == [0, 1, 2, 3, 4]
    assert store.runs.create_many([], NOW) == []


def test_a_batch_past_one_statements_parameters_is_stored_whole(store: Store) -> None:
    """On SQLite a batch is written many rows a statement: one that takes more than a
    statement may bind goes in several, each run once, in the batch's order as created."""
    batch = [command(priority=i % 7) for i in range(2 * MAX_PARAMETERS // 30)]
    runs = store.runs.create_many(batch, NOW)
    assert [r.priority for r in runs] == [spec.priority for spec in batch]
    assert store.runs.count_by_status() == {"pending": len(batch)}
    assert {store.runs.get(r.id).id for r in runs[::97]} == {r.id for r in runs[::97]}


def test_a_batch_stores_each_run_as_given_whatever_the_others_set(store: Store) -> None:
    """On SQLite a batch's statement names only the columns some run of it sets (the
    others are left to be NULL): runs that set different ones read back as created."""
    batch = [
        command(),
        agent_run(session_name="s1", timeout_s=60.0, required_runner="box-7"),
        command(idle_timeout_s=5.0, labels=("gpu",)),
    ]
    runs = store.runs.create_many(batch, NOW)
    assert [store.runs.get(r.id) for r in runs] == runs
    assert (runs[0].timeout_s, runs[0].session_name, runs[0].required_runner) == (None,) * 3
    assert (runs[1].timeout_s, runs[1].session_name) == (60.0, "s1")
    assert (runs[2].idle_timeout_s, runs[2].labels) == (5.0, ("gpu",))
    only = store.runs.create_many([command(), command()], NOW + 1)
    assert [store.runs.get(r.id) for r in only] == only


def test_a_batchs_values_read_back_exactly(store: Store) -> None:
    """On PostgreSQL a batch goes to the server as one JSON array read into rows: floats
    keep every bit, text every character (quotes, backslashes, beyond ASCII)."""
    batch = [
        agent_run(
            prompt='say "hé" \\ ✓ 𝄞\n',
            timeout_s=0.1,
            idle_timeout_s=1 / 3,
            env={"K": "ü\t"},
            labels=("ø", "a b"),
        ),
        command(priority=-(2**31), max_attempts=2**31 - 1),
    ]
    runs = store.runs.create_many(batch, NOW + 0.123456789)
    assert [store.runs.get(r.id) for r in runs] == runs
    assert runs[0].prompt == 'say "hé" \\ ✓ 𝄞\n' and runs[0].idle_timeout_s == 1 / 3
    assert store.runs.get(runs[1].id).created_at == NOW + 0.123456789


def test_no_column_of_runs_that_may_be_null_has_a_default(store: Store) -> None:
    """What a batch's statement leaves out of a run (its None values) must read as NULL."""
    with store.db.transaction(write=False) as tx:
        if store.db.dialect == "sqlite":
            rows = tx.execute("SELECT name, dflt_value AS fallback FROM pragma_table_info('runs')")
            nullable = {
                r["name"]
                for r in tx.execute(
                    "SELECT name FROM pragma_table_info('runs') WHERE \"notnull\" = 0"
                )
            }
        else:
            rows = tx.execute(
                "SELECT column_name AS name, column_default AS fallback "
                "FROM information_schema.columns WHERE table_name = 'runs'"
            )
            nullable = {
                r["name"]
                for r in tx.execute(
                    "SELECT column_name AS name FROM information_schema.columns "
                    "WHERE table_name = 'runs' AND is_nullable = 'YES'"
                )
            }
    defaults = {r["name"]: r["fallback"] for r in rows}
    assert {"timeout_s", "runner_id", "lost_runner_id"} <= nullable
    assert {name for name in nullable if defaults[name] is not None} == set()


def test_get_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as err:
        store.runs.get("run_missing")
    assert err.value.code == "run_not_found"


def test_list_is_newest_first_and_pages_with_before(store: Store) -> None:
    ids = [store.runs.create(command(), NOW + i).id for i in range(5)]
    ids += [r.id for r in store.runs.create_many([command(), command(), command()], NOW + 10)]
    listed = [r.id for r in store.runs.list(limit=100)]
    assert listed[3:] == ids[4::-1]  # the first five, newest first
    assert set(listed[:3]) == set(ids[5:])  # the three created together, ties broken by id
    assert listed[:3] == sorted(listed[:3], reverse=True)

    pages: list[list[str]] = []
    before: str | None = None
    while True:
        page = [r.id for r in store.runs.list(limit=3, before=before)]
        if not page:
            break
        pages.append(page)
        before = page[-1]
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [i for p in pages for i in p] == listed


def test_list_filters_by_status_runner_and_session(store: Store) -> None:
    r1, r2 = register(store, name="a"), register(store, name="b")
    on_r1 = running(store, r1, now=NOW + 1)
    on_r2 = running(store, r2, now=NOW + 2)
    pending = store.runs.create(command(), NOW + 2.5)
    named = store.runs.create(agent_run(session_name="feature"), NOW + 3)
    resumed = store.runs.create(
        agent_run(session_id="sess-1", type=RunType.RESUME_SESSION), NOW + 4
    )

    def ids(**kw: Any) -> list[RunId]:
        return [r.id for r in store.runs.list(**kw)]

    assert ids(statuses=[RunStatus.RUNNING]) == [on_r2.id, on_r1.id]
    assert ids(statuses=[RunStatus.PENDING]) == [resumed.id, named.id, pending.id]
    assert ids(statuses=[RunStatus.PENDING, RunStatus.RUNNING], limit=2) == [resumed.id, named.id]
    assert ids(runner_id=r1.id) == [on_r1.id]
    assert ids(runner_id=r2.id, statuses=[RunStatus.PENDING]) == []
    assert ids(session="feature") == [named.id]
    assert ids(session="sess-1") == [resumed.id]
    assert ids(session="nope") == []


# ---- claim -----------------------------------------------------------------------------------


def test_claim_takes_a_lease(store: Store) -> None:
    runner = register(store)
    run = store.runs.create(command(), NOW)
    claimed = claim_one(store, runner, NOW + 1)
    assert claimed.id == run.id
    assert claimed.status is RunStatus.CLAIMED
    assert claimed.runner_id == runner.id
    assert claimed.attempts == 1
    assert claimed.claimed_at == NOW + 1
    assert store.runs.get(run.id) == claimed
    assert store.runs.claim(runner.id, 5, NOW + 2) == []


def test_a_claim_is_a_heartbeat(store: Store) -> None:
    """The runner that asks is heard: it counts its lease from its claims' answers too."""
    runner = register(store)
    store.runs.create(command(), NOW)
    claim_one(store, runner, NOW + 4)
    assert store.runners.get(runner.id).last_heartbeat_at == NOW + 4
    assert store.runs.claim(runner.id, 1, NOW + 6) == []  # asked, even with nothing to take
    assert store.runners.get(runner.id).last_heartbeat_at == NOW + 6


def test_claim_orders_by_priority_then_fifo(store: Store) -> None:
    low_old = store.runs.create(command(priority=0), NOW)
    high_new = store.runs.create(command(priority=5), NOW + 3)
    low_new = store.runs.create(command(priority=0), NOW + 2)
    high_old = store.runs.create(command(priority=5), NOW + 1)
    runner = register(store)
    first = store.runs.claim(runner.id, 3, NOW + 10)
    assert [r.id for r in first] == [high_old.id, high_new.id, low_old.id]
    assert [r.id for r in store.runs.claim(runner.id, 3, NOW + 10)] == [low_new.id]


def test_claim_respects_max_runs(store: Store) -> None:
    store.runs.create_many([command() for _ in range(5)], NOW)
    runner = register(store)
    assert store.runs.claim(runner.id, 0, NOW) == []
    assert store.runs.claim(runner.id, -1, NOW) == []
    assert len(store.runs.claim(runner.id, 2, NOW)) == 2
    assert len(store.runs.claim(runner.id, 2, NOW)) == 2
    assert len(store.runs.claim(runner.id, 2, NOW)) == 1
    assert store.runs.claim(runner.id, 2, NOW) == []


def test_claim_matches_labels(store: Store) -> None:
    gpu_run = store.runs.create(command(labels=("gpu",)), NOW)
    both_run = store.runs.create(command(labels=("gpu", "linux")), NOW + 1)
    plain = register(store, name="plain")
    linux = register(store, labels=("linux",), name="linux")
    assert store.runs.claim(plain.id, 5, NOW + 2) == []
    assert store.runs.claim(linux.id, 5, NOW + 2) == []
    gpu = register(store, labels=("gpu",), name="gpu")
    assert [r.id for r in store.runs.claim(gpu.id, 5, NOW + 2)] == [gpu_run.id]
    full = register(store, labels=("linux", "gpu", "x86"), name="full")
    assert [r.id for r in store.runs.claim(full.id, 5, NOW + 2)] == [both_run.id]
    unlabeled = store.runs.create(command(), NOW + 3)
    assert [r.id for r in store.runs.claim(plain.id, 5, NOW + 4)] == [unlabeled.id]
    also_unlabeled = store.runs.create(command(), NOW + 5)
    assert [r.id for r in store.runs.claim(gpu.id, 5, NOW + 6)] == [also_unlabeled.id]


def test_claim_is_not_blocked_by_runs_the_runner_cannot_take(store: Store) -> None:
    """Many older runs needing a label this runner lacks must not hide one it can take."""
    store.runs.create_many([command(labels=("gpu",)) for _ in range(200)], NOW)
    reachable = store.runs.create(command(), NOW + 1)
    plain = register(store)
    assert [r.id for r in store.runs.claim(plain.id, 1, NOW + 2)] == [reachable.id]


def test_claim_honours_required_runner(store: Store) -> None:
    a, b = register(store, name="a"), register(store, name="b")
    pinned = store.runs.create(command(required_runner="b"), NOW)
    assert store.runs.claim(a.id, 5, NOW + 1) == []
    assert [r.id for r in store.runs.claim(b.id, 5, NOW + 1)] == [pinned.id]


def test_claim_skips_runs_not_yet_available(store: Store) -> None:
    runner = register(store)
    run = running(store, runner)
    finish(store, run, RunStatus.PENDING, retry_after_s=60.0)
    assert store.runs.claim(runner.id, 5, NOW + 30) == []
    assert [r.id for r in store.runs.claim(runner.id, 5, NOW + 61)] == [run.id]


def test_a_draining_runner_claims_nothing(store: Store) -> None:
    runner = register(store)
    run = store.runs.create(command(), NOW)
    store.runners.set_state(runner.id, RunnerState.DRAINING, NOW + 1)
    assert store.runs.claim(runner.id, 5, NOW + 2) == []
    assert store.runs.get(run.id).status is RunStatus.PENDING


@pytest.mark.parametrize("state", [RunnerState.LOST, RunnerState.STOPPED])
def test_a_lost_runner_is_told_to_register_again(store: Store, state: RunnerState) -> None:
    runner = register(store)
    run = store.runs.create(command(), NOW)
    store.runners.set_state(runner.id, state, NOW + 1)
    with pytest.raises(LeaseLost) as err:
        store.runs.claim(runner.id, 5, NOW + 2)
    assert err.value.code == "runner_lost"
    assert store.runs.get(run.id).status is RunStatus.PENDING
    assert store.runners.get(runner.id).last_heartbeat_at == NOW  # its claim was not heard


def test_claim_by_unknown_runner_is_not_found(store: Store) -> None:
    store.runs.create(command(), NOW)
    with pytest.raises(NotFound):
        store.runs.claim(RunnerId("rnr_missing"), 1, NOW)


# ---- mark_started ----------------------------------------------------------------------------


def test_mark_started_is_idempotent_for_the_same_lease(store: Store) -> None:
    runner = register(store)
    store.runs.create(command(), NOW)
    claimed = claim_one(store, runner)
    store.runs.mark_started(claimed.id, runner.id, 1, NOW + 1)
    started = store.runs.get(claimed.id)
    assert started.status is RunStatus.RUNNING
    assert started.started_at == NOW + 1
    store.runs.mark_started(claimed.id, runner.id, 1, NOW + 5)  # the repeat changes nothing
    assert store.runs.get(claimed.id) == started


def test_mark_started_refuses_another_lease(store: Store) -> None:
    runner, other = register(store, name="a"), register(store, name="b")
    store.runs.create(command(), NOW)
    claimed = claim_one(store, runner)
    with pytest.raises(LeaseLost):
        store.runs.mark_started(claimed.id, other.id, 1, NOW + 1)
    with pytest.raises(LeaseLost):
        store.runs.mark_started(claimed.id, runner.id, 2, NOW + 1)
    assert store.runs.get(claimed.id) == claimed
    with pytest.raises(NotFound):
        store.runs.mark_started("run_missing", runner.id, 1, NOW)


# ---- finish ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED]
)
def test_finish_records_the_outcome(store: Store, status: RunStatus) -> None:
    runner = register(store)
    run = running(store, runner)
    done = finish(
        store,
        run,
        status,
        now=NOW + 9,
        exit_code=3,
        error="boom",
        result="out",
        cost_usd=0.25,
        usage={"input_tokens": 10},
        num_turns=2,
    )
    assert done.status is status
    assert done.finished_at == NOW + 9
    assert (done.exit_code, done.error, done.result) == (3, "boom", "out")
    assert (done.cost_usd, done.usage, done.num_turns) == (0.25, {"input_tokens": 10}, 2)
    assert done.runner_id == runner.id and done.attempts == 1
    assert store.runs.get(run.id) == done


def test_finish_many_ends_the_reports_runs_take_as_they_are(store: Store) -> None:
    runner = register(store, slots=8)
    a, b, c, flagged, other_attempt, given_back = (running(store, runner) for _ in range(6))
    store.runs.request_cancel(flagged.id, NOW + 1)
    ok = RunReport(RunStatus.COMPLETED, exit_code=0)
    failed = RunReport(RunStatus.FAILED, exit_code=1, usage={"input_tokens": 3}, cost_usd=0.5)
    ended = store.runs.finish_many(
        runner.id,
        [
            (a.id, 1, ok),
            (b.id, 1, ok),
            (c.id, 1, failed),
            (a.id, 1, ok),  # a repeat: for the checked path
            (flagged.id, 1, failed),  # ends cancelled: the checked path's
            (other_attempt.id, 2, ok),  # not its lease
            (given_back.id, 1, RunReport(RunStatus.PENDING, retry_after_s=5)),
        ],
        NOW + 2,
    )
    assert set(ended) == {(a.id, 1), (b.id, 1), (c.id, 1)}
    for run_id, status in [(a.id, RunStatus.COMPLETED), (c.id, RunStatus.FAILED)]:
        # Plain runs: not read back whole, but ended as reported.
        assert ended[run_id, 1] == Ended(run_id, status)
        stored = store.runs.get(run_id)
        assert stored.status is status and stored.finished_at == NOW + 2
    stored = store.runs.get(c.id)
    assert (stored.exit_code, stored.usage, stored.cost_usd) == (1, {"input_tokens": 3}, 0.5)
    for run in (flagged, other_attempt, given_back):
        assert store.runs.get(run.id).status is RunStatus.RUNNING


def test_finish_many_reads_back_whole_a_run_whose_end_moves_its_session(store: Store) -> None:
    runner = register(store, slots=2)
    plain, agent = running(store, runner), running(store, runner, agent_run(session_name="s"))
    ok = RunReport(RunStatus.COMPLETED, exit_code=0)
    told = RunReport(RunStatus.COMPLETED, exit_code=0, session_id="sess-m", cost_usd=1.0)
    ended = store.runs.finish_many(runner.id, [(plain.id, 1, ok), (agent.id, 1, told)], NOW + 2)
    assert ended[plain.id, 1] == Ended(plain.id, RunStatus.COMPLETED)
    whole = ended[agent.id, 1]
    assert isinstance(whole, Run) and whole == store.runs.get(agent.id)
    assert whole.session_id == "sess-m" and whole.status is RunStatus.COMPLETED
    # Its session took the run's end, as ``finish`` does it (``sessions.finish_from_run``).
    session = store.sessions.get("sess-m")
    assert (session.runs, session.cost_usd, session.last_run_id) == (1, 1.0, agent.id)


def test_a_claimed_run_may_fail_before_it_starts(store: Store) -> None:
    runner = register(store)
    store.runs.create(command(), NOW)
    claimed = claim_one(store, runner)
    failed = finish(store, claimed, RunStatus.FAILED, error="could not spawn")
    assert failed.status is RunStatus.FAILED


def test_a_repeated_report_is_accepted_and_changes_nothing(store: Store) -> None:
    runner = register(store)
    run = running(store, runner, agent_run(session_name="s"))
    first = finish(store, run, now=NOW + 2, result="ok", cost_usd=1.0, session_id="sess-r")
    again = finish(store, run, now=NOW + 50, result="ok", cost_usd=1.0, session_id="sess-r")
    assert again == first
    assert store.runs.get(run.id) == first
    session = store.sessions.get("sess-r")
    assert (session.runs, session.cost_usd) == (1, 1.0)  # counted once


def test_a_report_from_a_runner_without_the_lease_is_refused(store: Store) -> None:
    runner, other = register(store, name="a"), register(store, name="b")
    run = running(store, runner)
    report = RunReport(status=RunStatus.COMPLETED, result="stolen")
    with pytest.raises(LeaseLost):
        store.runs.finish(run.id, other.id, run.attempts, report, NOW + 1)
    with pytest.raises(LeaseLost):
        store.runs.finish(run.id, runner.id, run.attempts + 1, report, NOW + 1)
    assert store.runs.get(run.id) == run
    done = finish(store, run)
    with pytest.raises(LeaseLost):  # a finished run: still not the other runner's
        store.runs.finish(run.id, other.id, run.attempts, report, NOW + 2)
    assert store.runs.get(run.id) == done


def test_an_illegal_transition_changes_nothing(store: Store) -> None:
    runner = register(store)
    store.runs.create(command(), NOW)
    claimed = claim_one(store, runner)
    with pytest.raises(IllegalTransition):  # claimed → completed skips running
        finish(store, claimed, RunStatus.COMPLETED, result="x")
    assert store.runs.get(claimed.id) == claimed

    run = start(store, claimed)
    done = finish(store, run, RunStatus.COMPLETED)
    with pytest.raises(IllegalTransition) as err:  # the same lease, a different outcome
        finish(store, run, RunStatus.FAILED, now=NOW + 5)
    assert err.value.code == "illegal_transition"
    assert store.runs.get(run.id) == done
    with pytest.raises(NotFound):
        store.runs.finish("run_missing", runner.id, 1, RunReport(RunStatus.COMPLETED), NOW)


def test_rate_limit_requeue_gives_the_attempt_back(store: Store) -> None:
    runner = register(store)
    run = running(store, runner, agent_run(session_name="s"))
    requeued = finish(
        store,
        run,
        RunStatus.PENDING,
        now=NOW + 10,
        error="rate limited",
        retry_after_s=120.0,
        session_id="sess-rl",
    )
    assert requeued.status is RunStatus.PENDING
    assert requeued.attempts == 1  # the lease number stays; rate_limited gives it back
    assert requeued.rate_limited == 1
    assert requeued.available_at == NOW + 130
    assert requeued.runner_id is None
    assert requeued.session_id == "sess-rl"  # a resume picks the conversation up
    assert store.runs.get(run.id) == requeued
    with pytest.raises(LeaseLost):  # the old lease is gone with the requeue
        finish(store, run, RunStatus.COMPLETED, now=NOW + 11)
    assert store.runs.get(run.id) == requeued

    assert store.runs.claim(runner.id, 1, NOW + 129) == []
    again = claim_one(store, runner, NOW + 131)
    assert (again.attempts, again.rate_limited) == (2, 1)
    # A delayed copy of the first attempt's report cannot touch the new attempt.
    with pytest.raises(LeaseLost):
        finish(store, run, RunStatus.PENDING, now=NOW + 132, retry_after_s=1.0)
    assert store.runs.get(run.id).status is RunStatus.CLAIMED


def test_a_rate_limit_does_not_count_against_max_attempts(store: Store) -> None:
    runner = register(store)
    run = running(store, runner, command(max_attempts=1))
    finish(store, run, RunStatus.PENDING, now=NOW + 1, retry_after_s=0.0)
    claim_one(store, runner, NOW + 2)
    # The runner is then lost: its one real attempt is used up, so the run waits lost for
    # its late report, then fails.
    lost_at = NOW + 2 + LOST_AFTER + 1
    result = store.reconcile(lost_at, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE)
    assert (result.waiting, result.requeued) == ([run.id], [])
    result = store.reconcile(
        lost_at + LOST_AFTER + 1, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE
    )
    assert result.failed == [run.id]
    assert "no attempts left (1/1)" in (store.runs.get(run.id).error or "")


def test_a_claimed_run_may_be_requeued(store: Store) -> None:
    runner = register(store)
    store.runs.create(command(), NOW)
    claimed = claim_one(store, runner)
    back = finish(store, claimed, RunStatus.PENDING, retry_after_s=0.0)
    assert (back.status, back.attempts, back.available_at) == (RunStatus.PENDING, 1, NOW + 1)


def test_too_many_rate_limits_fail_the_run(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corral.runs, "MAX_RATE_LIMIT_REQUEUES", 2)
    runner = register(store)
    store.runs.create(command(), NOW)
    now = NOW
    for _ in range(2):
        run = start(store, claim_one(store, runner, now), now)
        assert finish(store, run, RunStatus.PENDING, now=now).status is RunStatus.PENDING
        now += 1
    run = start(store, claim_one(store, runner, now), now)
    failed = finish(store, run, RunStatus.PENDING, now=now, error="429")
    assert failed.status is RunStatus.FAILED
    assert failed.error is not None and "rate limited 3 times" in failed.error


def test_a_failure_after_cancel_is_recorded_as_cancelled(store: Store) -> None:
    runner = register(store)
    run = running(store, runner)
    store.runs.request_cancel(run.id, NOW + 1)
    done = finish(store, run, RunStatus.FAILED, now=NOW + 2, exit_code=-15)
    assert done.status is RunStatus.CANCELLED
    again = finish(store, run, RunStatus.FAILED, now=NOW + 3, exit_code=-15)  # a retry
    assert again == done
    assert store.runs.get(run.id) == done


@pytest.mark.parametrize("started", [False, True])
def test_a_run_given_back_after_a_cancel_ends_cancelled(store: Store, started: bool) -> None:
    """A rate-limited runner gives back the attempt of a run a client asked to cancel: the
    cancel wins. Requeued, the next claim would clear the cancel and run it again."""
    runner = register(store)
    store.runs.create(command(), NOW)
    run = claim_one(store, runner)
    if started:
        run = start(store, run)
    store.runs.request_cancel(run.id, NOW + 1)
    back = finish(store, run, RunStatus.PENDING, now=NOW + 2, retry_after_s=0.0, error="429")
    assert back.status is RunStatus.CANCELLED
    assert back.finished_at == NOW + 2
    assert back.error is not None and back.error.startswith("cancelled")
    assert store.runs.claim(runner.id, 5, NOW + 3) == []
    assert store.runs.get(run.id) == back


def test_a_completion_after_cancel_stays_completed(store: Store) -> None:
    runner = register(store)
    run = running(store, runner)
    store.runs.request_cancel(run.id, NOW + 1)
    assert finish(store, run, RunStatus.COMPLETED).status is RunStatus.COMPLETED


# ---- cancel ----------------------------------------------------------------------------------


def test_cancel_of_a_pending_run_is_immediate(store: Store) -> None:
    run = store.runs.create(command(), NOW)
    cancelled = store.runs.request_cancel(run.id, NOW + 1)
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.finished_at == NOW + 1
    assert store.runs.get(run.id) == cancelled
    runner = register(store)
    assert store.runs.claim(runner.id, 5, NOW + 2) == []
    # Sent again (its answer lost, say), the cancel changes nothing and answers the run.
    assert store.runs.request_cancel(run.id, NOW + 3) == cancelled
    assert store.runs.get(run.id) == cancelled


@pytest.mark.parametrize("started", [False, True])
def test_cancel_of_a_held_run_is_passed_to_its_runner(store: Store, started: bool) -> None:
    runner = register(store)
    store.runs.create(command(), NOW)
    run = claim_one(store, runner)
    if started:
        run = start(store, run)
    other = store.runs.create(command(), NOW)
    other_run = claim_one(store, runner)
    assert other_run.id == other.id
    assert store.commands.unacknowledged(runner.id, 0) == []

    flagged = store.runs.request_cancel(run.id, NOW + 2)
    assert flagged.status is run.status
    assert flagged.cancel_requested
    assert flagged.runner_id == runner.id
    # A command to its runner, stored with the request, numbered as every command is.
    cancel = Command(1, {"type": "cancel_run", "run_id": run.id})
    assert store.commands.unacknowledged(runner.id, 0) == [cancel]
    assert store.runners.heartbeat(runner.id, held(run, other_run), NOW + 3).abandon == []
    assert store.runs.request_cancel(run.id, NOW + 4).cancel_requested  # asking twice is fine
    assert store.commands.unacknowledged(runner.id, 0) == [cancel]  # and stores no second

    done = finish(store, run, RunStatus.CANCELLED, now=NOW + 5)
    assert done.status is RunStatus.CANCELLED
    assert store.runs.get(other_run.id).cancel_requested is False


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED])
def test_cancel_of_a_finished_run_is_illegal(store: Store, status: RunStatus) -> None:
    runner = register(store)
    done = finish(store, running(store, runner), status)
    with pytest.raises(IllegalTransition):
        store.runs.request_cancel(done.id, NOW + 5)
    assert store.runs.get(done.id) == done
    with pytest.raises(NotFound):
        store.runs.request_cancel("run_missing", NOW)


def test_cancel_of_a_cancelled_run_answers_it_unchanged(store: Store) -> None:
    """A cancel sent again (its answer lost) changes nothing, and is not refused."""
    runner = register(store)
    done = finish(store, running(store, runner), RunStatus.CANCELLED)
    assert store.runs.request_cancel(done.id, NOW + 5) == done
    assert store.runs.get(done.id) == done


# ---- sessions --------------------------------------------------------------------------------


def test_record_session_creates_the_session(store: Store) -> None:
    runner = register(store)
    run = running(store, runner, agent_run(session_name="feature", project_dir="/src/app"))
    recorded = store.runs.record_session(run.id, runner.id, run.attempts, "sess-1", NOW + 1)
    assert recorded.session_id == "sess-1"
    assert store.runs.get(run.id).session_id == "sess-1"
    session = store.sessions.get("sess-1")
    assert session.id == "sess-1"
    assert session.name == "feature"
    assert session.agent_name == "coder"
    assert session.runner_id == runner.id
    assert session.project_dir == "/src/app"
    assert session.last_run_id == run.id
    assert (session.runs, session.cost_usd, session.result) == (0, 0.0, None)
    assert store.sessions.get("feature") == session
    # telling it again (a retried request) changes nothing that matters
    store.runs.record_session(run.id, runner.id, run.attempts, "sess-1", NOW + 1)
    assert store.sessions.get("sess-1") == session


def test_record_session_needs_the_lease(store: Store) -> None:
    runner, other = register(store, name="a"), register(store, name="b")
    run = running(store, runner, agent_run())
    with pytest.raises(LeaseLost):
        store.runs.record_session(run.id, other.id, run.attempts, "sess-x", NOW + 1)
    with pytest.raises(NotFound):
        store.sessions.get("sess-x")
    assert store.runs.get(run.id).session_id is None


def test_finishing_runs_sums_session_cost_and_sets_result(store: Store) -> None:
    runner = register(store)
    first = running(store, runner, agent_run(session_name="feature"))
    store.runs.record_session(first.id, runner.id, first.attempts, "sess-1", NOW + 1)
    finish(store, first, now=NOW + 2, result="step one", cost_usd=0.5)
    second = running(
        store,
        runner,
        agent_run(type=RunType.RESUME_SESSION, session_id="sess-1", session_name="feature"),
        now=NOW + 3,
    )
    finish(
        store,
        second,
        RunStatus.FAILED,
        now=NOW + 4,
        result="step two",
        cost_usd=0.25,
        session_id="sess-1",
    )
    session = store.sessions.get("sess-1")
    assert session.cost_usd == pytest.approx(0.75)
    assert session.runs == 2
    assert session.result == "step two"
    assert session.is_error
    assert session.last_run_id == second.id
    assert session.updated_at == NOW + 4


def test_a_session_reported_only_at_the_end_is_created(store: Store) -> None:
    runner = register(store)
    run = running(store, runner, agent_run(session_name="late"))
    finish(store, run, result="done", cost_usd=0.1, session_id="sess-late")
    session = store.sessions.get("late")
    assert (session.id, session.runner_id, session.project_dir) == ("sess-late", runner.id, "/p")
    assert (session.runs, session.result, session.is_error) == (1, "done", False)


def test_get_session_by_name_is_the_most_recent(store: Store) -> None:
    runner = register(store)
    old = running(store, runner, agent_run(session_name="dup"))
    store.runs.record_session(old.id, runner.id, old.attempts, "sess-old", NOW + 1)
    new = running(store, runner, agent_run(session_name="dup"), now=NOW + 2)
    store.runs.record_session(new.id, runner.id, new.attempts, "sess-new", NOW + 3)
    assert store.sessions.get("dup").id == "sess-new"
    assert store.sessions.get("sess-old").id == "sess-old"
    with pytest.raises(NotFound) as err:
        store.sessions.get("nothing")
    assert err.value.code == "session_not_found"


def test_schema_version_is_the_latest_migration(store: Store) -> None:
    assert store.schema_version() == LATEST_VERSION


def test_list_sessions_most_recent_first(store: Store) -> None:
    runner = register(store)
    assert store.sessions.list() == []
    for n, name in enumerate(("first", "second", "third")):
        run = running(store, runner, agent_run(session_name=name), now=NOW + 10 * n)
        finish(store, run, now=NOW + 10 * n + 1, cost_usd=0.5, session_id=f"sess-{name}")
    assert [s.name for s in store.sessions.list()] == ["third", "second", "first"]
    assert [s.name for s in store.sessions.list(limit=2)] == ["third", "second"]
    assert store.sessions.list()[0].cost_usd == pytest.approx(0.5)


# ---- runners and heartbeats ------------------------------------------------------------------


def test_register_a_new_runner(store: Store) -> None:
    runner = register(store, labels=("gpu", "linux"), slots=3, name="box")
    assert runner.id.startswith("rnr_")
    assert runner.state is RunnerState.ACTIVE
    assert (runner.name, runner.hostname, runner.slots) == ("box", "box.host", 3)
    assert runner.labels == ("gpu", "linux")
    assert runner.registered_at == runner.last_heartbeat_at == NOW
    assert store.runners.get(runner.id) == runner
    with pytest.raises(InvalidRequest):
        register(store, slots=0)
    with pytest.raises(NotFound):
        store.runners.get("rnr_missing")


def test_list_runners_counts_used_slots(store: Store) -> None:
    a = register(store, name="a", now=NOW)
    b = register(store, name="b", now=NOW + 1)
    running(store, a)
    store.runs.create(command(), NOW)
    claim_one(store, a)
    listed = store.runners.list()
    assert [r.id for r in listed] == [b.id, a.id]
    assert [r.slots_used for r in listed] == [0, 2]


def test_heartbeat_tells_the_runner_what_to_abandon(store: Store) -> None:
    runner, other = register(store, name="a"), register(store, name="b")
    mine = running(store, runner)
    theirs = running(store, other)
    done = finish(store, running(store, runner))
    sync = store.runners.heartbeat(
        runner.id,
        [
            Held(mine.id, mine.attempts),
            Held(theirs.id, theirs.attempts),  # another runner's run
            Held(done.id, done.attempts),  # already finished
            Held(mine.id, mine.attempts + 1),  # an attempt that is not the current one
            Held(RunId("run_unknown"), 1),
        ],
        NOW + 3,
    )
    assert sorted(sync.abandon) == sorted([theirs.id, done.id, mine.id, RunId("run_unknown")])
    assert store.runners.get(runner.id).last_heartbeat_at == NOW + 3
    assert store.runs.get(mine.id).status is RunStatus.RUNNING
    assert store.runs.get(theirs.id).status is RunStatus.RUNNING


def test_a_claim_the_runner_never_reports_is_released_after_the_grace(store: Store) -> None:
    runner = register(store)
    kept = running(store, runner)
    store.runs.create(command(), NOW)
    forgotten = claim_one(store, runner)  # the answer to this claim never reached the runner
    grace = reconcile_module.UNREPORTED_CLAIM_GRACE_S

    assert store.runners.heartbeat(runner.id, held(kept), NOW + grace - 1).abandon == []
    assert store.runs.get(forgotten.id) == forgotten  # still within the grace

    store.runners.heartbeat(runner.id, held(kept), NOW + grace + 1)
    released = store.runs.get(forgotten.id)
    assert released.status is RunStatus.PENDING
    assert released.runner_id is None
    assert store.runs.get(kept.id).status is RunStatus.RUNNING
    again = claim_one(store, runner, NOW + grace + 2)
    assert (again.id, again.attempts) == (forgotten.id, 2)


def test_heartbeat_of_an_unknown_runner_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as err:
        store.runners.heartbeat("rnr_missing", [], NOW)
    assert err.value.code == "runner_not_found"


def test_heartbeat_of_a_lost_runner_asks_it_to_register_again(store: Store) -> None:
    runner = register(store)
    store.reconcile(NOW + LOST_AFTER + 1, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE)
    with pytest.raises(LeaseLost) as err:
        store.runners.heartbeat(runner.id, [], NOW + LOST_AFTER + 2)
    assert err.value.code == "runner_lost"


def test_register_with_a_known_id_reactivates_and_reconciles_held_runs(store: Store) -> None:
    runner = register(store, labels=("old",))
    taken = running(store, runner)
    kept_claim = store.runs.create(command(), NOW)
    claim_one(store, runner)
    later = NOW + LOST_AFTER + 1
    result = store.reconcile(later, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE)
    assert result.lost_runners == [runner.id]
    assert sorted(result.requeued) == sorted([taken.id, kept_claim.id])
    assert store.runners.get(runner.id).state is RunnerState.LOST

    other = register(store, name="other", now=later)
    stolen = claim_one(store, other, later)
    back, sync = store.runners.register(
        name="r2",
        hostname="h2",
        labels=("new",),
        slots=2,
        version="0.2.0",
        transport="ws",
        now=later + 1,
        runner_id=runner.id,
        held=held(taken),
    )
    assert back.id == runner.id
    assert back.state is RunnerState.ACTIVE
    assert (back.name, back.labels, back.slots, back.version) == ("r2", ("new",), 2, "0.2.0")
    assert back.last_heartbeat_at == later + 1
    assert back.registered_at == NOW
    assert sync.abandon == [taken.id]
    assert store.runs.get(stolen.id).runner_id == other.id
    assert store.runners.heartbeat(runner.id, [], later + 2) == RunnerSync()


def test_a_drain_asked_again_keeps_the_earliest_deadline(store: Store) -> None:
    """Sent again (its answer lost) a drain changes nothing; one that would end sooner
    moves its deadline up, as the runner itself keeps the earliest it was given."""
    runner = register(store)
    first = store.runners.set_state(runner.id, RunnerState.DRAINING, NOW + 1, grace_s=60.0)
    assert store.runners.order(runner.id, NOW + 1).drain_grace_left_s == 60.0
    again = store.runners.set_state(runner.id, RunnerState.DRAINING, NOW + 5, grace_s=60.0)
    assert again == first
    assert store.runners.order(runner.id, NOW + 5).drain_grace_left_s == 56.0  # from the first
    store.runners.set_state(runner.id, RunnerState.DRAINING, NOW + 6, grace_s=10.0)
    assert store.runners.order(runner.id, NOW + 6).drain_grace_left_s == 10.0  # sooner: taken


def test_register_again_while_still_holding_runs_keeps_them(store: Store) -> None:
    runner = register(store)
    run = running(store, runner)
    store.runners.set_state(runner.id, RunnerState.DRAINING, NOW + 1)
    back, sync = store.runners.register(
        name="r",
        hostname="r.host",
        labels=(),
        slots=4,
        version="0.1.0",
        transport="http",
        now=NOW + 100,
        runner_id=runner.id,
        held=held(run),
    )
    assert back.state is RunnerState.ACTIVE
    assert sync.abandon == []
    assert store.runs.get(run.id) == run


def test_stopping_a_runner_releases_its_runs(store: Store) -> None:
    runner = register(store)
    run = running(store, runner)
    stopped = store.runners.set_state(runner.id, RunnerState.STOPPED, NOW + 1)
    assert stopped.state is RunnerState.STOPPED
    released = store.runs.get(run.id)
    assert (released.status, released.runner_id) == (RunStatus.PENDING, None)
    # Sent again, the stop changes nothing (not even when it stopped).
    assert store.runners.set_state(runner.id, RunnerState.STOPPED, NOW + 2) == stopped


# ---- reconcile -------------------------------------------------------------------------------


def test_reconcile_takes_runs_back_from_a_silent_runner(store: Store) -> None:
    silent = register(store, name="silent")
    alive = register(store, name="alive")
    claimed_only = store.runs.create(command(), NOW)
    claim_one(store, silent)
    retryable = running(store, silent)
    last_try = running(store, silent, command(max_attempts=1))
    to_cancel = running(store, silent)
    store.runs.request_cancel(to_cancel.id, NOW + 1)
    alive_run = running(store, alive)

    later = NOW + LOST_AFTER + 1
    store.runners.heartbeat(alive.id, held(alive_run), later - 1)
    result = store.reconcile(later, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE)
    assert result.changed
    assert result.lost_runners == [silent.id]
    assert sorted(result.requeued) == sorted([claimed_only.id, retryable.id])
    assert result.waiting == [last_try.id]  # no attempt left: lost, for a late report
    assert result.failed == [to_cancel.id]
    assert result.timed_out == []
    assert store.runners.get(silent.id).state is RunnerState.LOST
    assert store.runners.get(alive.id).state is RunnerState.ACTIVE

    for run_id in (claimed_only.id, retryable.id):
        run = store.runs.get(run_id)
        assert (run.status, run.runner_id, run.attempts) == (RunStatus.PENDING, None, 1)
        assert run.available_at == later
    waiting = store.runs.get(last_try.id)
    assert (waiting.status, waiting.runner_id, waiting.finished_at) == (
        RunStatus.LOST,
        silent.id,
        None,
    )
    assert store.runs.get(to_cancel.id).status is RunStatus.CANCELLED
    assert store.runs.get(alive_run.id) == alive_run

    before = {r.id: r for r in store.runs.list(limit=100)}
    again = store.reconcile(later + 1, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE)
    assert not again.changed
    assert {r.id: r for r in store.runs.list(limit=100)} == before

    # Its grace (the runner's threshold, from the loss) over, the last try fails, once.
    over = later + LOST_AFTER + 1
    store.runners.heartbeat(alive.id, held(alive_run), over - 1)
    assert store.reconcile(over, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE).failed == [
        last_try.id
    ]
    failed = store.runs.get(last_try.id)
    assert failed.status is RunStatus.FAILED
    assert failed.finished_at == over
    assert failed.error == f"runner {silent.id} was lost; no attempts left (1/1)"
    assert not store.reconcile(over + 1, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE).changed

    retaken = claim_one(store, alive, later + 2)
    assert retaken.attempts == 2


def test_a_runner_is_lost_only_when_a_coordinator_was_up_to_hear_it(store: Store) -> None:
    """The reconciling coordinator just started (``up_since``): a runner silent for a
    threshold is lost if another coordinator was up through that threshold of its silence
    (it had someone to talk to), and not if every coordinator was down for part of it."""
    heard = register(store, name="heard")
    unheard = register(store, name="unheard", now=NOW + 20)
    now = NOW + LOST_AFTER + 5
    # "b" was up from long before to just now: heard for a threshold of both silences.
    # "old" went down 1 s after "heard" fell silent; "a" is the one reconciling.
    coordinators.beat(store.db, "old", NOW - 100, NOW + 1)
    coordinators.beat(store.db, "a", now - 1, now)
    assert not store.reconcile(
        now, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE, up_since=now - 1
    ).changed
    coordinators.beat(store.db, "b", NOW - 100, NOW + 10)
    coordinators.beat(store.db, "b", NOW - 50, now - 0.5)  # a later beat keeps its start
    done = store.reconcile(now, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE, up_since=now - 1)
    assert done.lost_runners == [heard.id]  # silent from NOW: "b" heard 34.5 s of it
    assert store.runners.get(unheard.id).state is RunnerState.ACTIVE  # from NOW + 20: 14.5 s
    # Alone, the reconciling coordinator gives a runner a whole threshold from its start.
    later = now - 1 + LOST_AFTER + 1
    assert store.reconcile(
        later, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE, up_since=now - 1
    ).lost_runners == [unheard.id]


def test_reconcile_times_out_overdue_runs(store: Store) -> None:
    runner = register(store)
    slow = running(store, runner, command(timeout_s=10.0))
    unbounded = running(store, runner)
    claimed = store.runs.create(command(timeout_s=20.0), NOW)
    claim_one(store, runner)

    def reconcile_at(now: float) -> Reconciled:
        store.runners.heartbeat(runner.id, held(slow, unbounded, store.runs.get(claimed.id)), now)
        return store.reconcile(now, lost_after_s=LOST_AFTER, timeout_grace_s=GRACE)

    assert not reconcile_at(NOW + 10 + GRACE).changed  # at the limit, not past it
    result = reconcile_at(NOW + 10 + GRACE + 1)
    assert result.timed_out == [slow.id]
    assert result.lost_runners == [] and result.requeued == []
    timed_out = store.runs.get(slow.id)
    assert timed_out.status is RunStatus.TIMED_OUT
    assert timed_out.finished_at == NOW + 10 + GRACE + 1
    assert timed_out.error is not None and "timeout" in timed_out.error

    assert reconcile_at(NOW + 20 + GRACE + 1).timed_out == [claimed.id]
    assert not reconcile_at(NOW + 1000).changed
    assert store.runs.get(unbounded.id).status is RunStatus.RUNNING
    with pytest.raises(IllegalTransition):  # the runner's late report is refused…
        finish(store, slow, RunStatus.COMPLETED, now=NOW + 1001, exit_code=0)
    assert store.runs.get(slow.id) == timed_out  # …and changes nothing


# ---- logs ------------------------------------------------------------------------------------


def lines(start: int, count: int, stream: str = "stdout") -> list[LogLine]:
    return [LogLine(n, stream, f"line {n}", NOW + n) for n in range(start, start + count)]


def test_logs_append_and_read_after(store: Store) -> None:
    runner = register(store)
    run = running(store, runner)
    assert store.logs.append(run.id, runner.id, 1, lines(0, 3)) == 3
    assert store.logs.append(run.id, runner.id, 1, lines(3, 2, "stderr")) == 2
    assert store.logs.append(run.id, runner.id, 1, []) == 0
    entries = store.logs.read(run.id)
    assert [(e.line_no, e.stream, e.text, e.ts) for e in entries] == [
        (n, "stdout" if n < 3 else "stderr", f"line {n}", NOW + n) for n in range(5)
    ]
    assert all(e.attempt == 1 for e in entries)
    ids = [e.id for e in entries]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert [e.line_no for e in store.logs.read(run.id, after_id=ids[2])] == [3, 4]
    assert [e.line_no for e in store.logs.read(run.id, after_id=ids[0], limit=2)] == [1, 2]
    assert store.logs.read(run.id, after_id=ids[-1]) == []


def test_a_retried_log_batch_is_stored_once(store: Store) -> None:
    runner = register(store)
    run = running(store, runner)
    store.logs.append(run.id, runner.id, 1, lines(0, 3))
    store.logs.append(run.id, runner.id, 1, lines(0, 4))  # the retry, with one more line
    assert [e.line_no for e in store.logs.read(run.id)] == [0, 1, 2, 3]


def test_logs_from_another_runner_or_for_an_unknown_run_are_refused(store: Store) -> None:
    runner, other = register(store, name="a"), register(store, name="b")
    run = running(store, runner)
    with pytest.raises(LeaseLost):
        store.logs.append(run.id, other.id, 1, lines(0, 1))
    assert store.logs.read(run.id) == []
    with pytest.raises(NotFound):
        store.logs.append("run_missing", runner.id, 1, lines(0, 1))
    with pytest.raises(NotFound):
        store.logs.read("run_missing")


# ---- migrations ------------------------------------------------------------------------------


def test_migrate_twice_is_a_no_op(store: Store) -> None:
    run = store.runs.create(command(), NOW)
    assert migrate(store.db) == LATEST_VERSION
    assert migrate(store.db) == LATEST_VERSION
    with store.db.transaction(write=False) as tx:
        versions = [
            r["version"]
            for r in tx.execute("SELECT version FROM schema_migrations ORDER BY version")
        ]
    assert versions == [v for v, _ in MIGRATIONS]
    assert store.runs.get(run.id) == run


# ---- nested transactions --------------------------------------------------------------------


def statuses(store: Store, *run_ids: str) -> list[str]:
    return [str(store.runs.get(r).status) for r in run_ids]


def test_a_transaction_inside_another_is_a_savepoint(store: Store) -> None:
    a, b = (store.runs.create(command(), NOW).id for _ in range(2))
    with store.db.transaction():
        store.runs.request_cancel(a, NOW)  # commits with the outer one
        with pytest.raises(IllegalTransition), store.db.transaction() as tx:
            tx.execute("UPDATE runs SET status = 'failed' WHERE id = ?", (b,))
            raise IllegalTransition("undo only this")
        store.runs.request_cancel(b, NOW)
    assert statuses(store, a, b) == ["cancelled", "cancelled"]


def test_a_failed_outer_transaction_undoes_what_its_savepoints_did(store: Store) -> None:
    run_id = store.runs.create(command(), NOW).id
    with pytest.raises(RuntimeError), store.db.transaction():
        store.runs.request_cancel(run_id, NOW)  # a savepoint, released
        raise RuntimeError("the outer one fails")
    assert statuses(store, run_id) == ["pending"]
    store.runs.request_cancel(run_id, NOW)  # the thread's next transaction is a fresh one
    assert statuses(store, run_id) == ["cancelled"]


def test_rows_name_a_column_added_after_the_statement_was_first_read(store: Store) -> None:
    # SQLite's rows are named from a cache by statement text (``_SqliteTx.execute``).
    with store.db.transaction() as tx:
        tx.execute("CREATE TABLE named (a INTEGER)")
        tx.execute("INSERT INTO named (a) VALUES (1)")
        assert tx.execute("SELECT * FROM named") == [{"a": 1}]
        tx.execute("ALTER TABLE named ADD COLUMN b INTEGER DEFAULT 2")
        assert tx.execute("SELECT * FROM named") == [{"a": 1, "b": 2}]
        assert tx.execute("SELECT * FROM named WHERE a = 0") == []
        tx.execute("DROP TABLE named")


# ---- slots freed by final reports not yet applied ---------------------------------------------


def test_runs_whose_final_report_is_in_flight_free_their_slots(store: Store) -> None:
    runner = register(store, slots=2)
    for _ in range(4):
        store.runs.create(command(), NOW)

    def start(run: Run) -> dict[str, Any]:
        return {"type": "start_run", "run_id": run.id}

    first, free = store.commands.claim_into_commands(runner.id, NOW, start)
    a, b = (c.body["run_id"] for c in first)
    assert free == 0
    # Both slots busy: nothing claimed, none free.
    assert store.commands.claim_into_commands(runner.id, NOW, start) == ([], 0)
    # A report of another attempt of ``a`` frees nothing; ``b``'s own report frees one.
    assert store.commands.claim_into_commands(runner.id, NOW, start, finishing={(a, 2)}) == (
        [],
        0,
    )
    (third,), free = store.commands.claim_into_commands(runner.id, NOW, start, finishing={(b, 1)})
    assert third.body["run_id"] not in (a, b) and free == 0
    # Slots still free once the pending runs are all taken are counted.
    both = {(a, 1), (b, 1)}
    (fourth,), free = store.commands.claim_into_commands(runner.id, NOW, start, finishing=both)
    assert free == 0
    finishing = {*both, (fourth.body["run_id"], 1)}
    assert store.commands.claim_into_commands(runner.id, NOW, start, finishing) == ([], 1)


def test_commands_pushed_at_once_are_numbered_and_stored_in_order(store: Store) -> None:
    runner = register(store)
    bodies = [{"type": "cancel_run", "run_id": f"run_{n}"} for n in range(2500)]
    pushed = store.commands.push(runner.id, bodies, NOW)  # more than one statement's worth
    assert [c.idx for c in pushed] == list(range(1, 2501))
    stored = store.commands.unacknowledged(runner.id, 0)
    assert stored == pushed and [c.body for c in stored] == bodies


def test_a_stored_command_holding_a_lone_surrogates_escape_still_reads(store: Store) -> None:
    """A command stored before lone surrogates were refused may hold one's escape: it reads
    as ``json.loads`` reads it (the faster parser the store reads bodies with refuses it)."""
    runner = register(store)
    body = '{"type":"cancel_run","run_id":"run_1","note":"a\\ud800b"}'
    with store.db.transaction() as tx:
        tx.execute(
            "INSERT INTO runner_commands (runner_id, idx, body, created_at) VALUES (?, 1, ?, ?)",
            (runner.id, body, NOW),
        )
    (command,) = store.commands.unacknowledged(runner.id, 0)
    assert command.body == {"type": "cancel_run", "run_id": "run_1", "note": "a\ud800b"}
    assert command.stored == body
