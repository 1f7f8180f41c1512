"""Sub-agent sessions in the store, on SQLite and PostgreSQL alike: a child's parent is
checked when the child is written (nothing is written on a refusal), an async_callback
child's end is recorded with it, and the parent is resumed once with every child that
ended, whoever delivers and however often."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from corral.errors import CorralError
from corral.runs import AgentSpec, NewRun, Run, RunReport, RunStatus, RunType
from corral.store import Store
from corral.store.retention import Retention
from corral.subagents import Limits

NOW = 1_700_000_000.0
AGENT = AgentSpec(name="coder", executor="claude", model="sonnet", budget_usd=1.0)


def session_run(
    store: Store, session_id: str, *, end: RunStatus | None = RunStatus.COMPLETED, **kw: Any
) -> Run:
    """A start_session run that announced ``session_id`` (and ended as ``end``, or runs)."""
    runner = store.runners.register(
        name="r", hostname="h", labels=(), slots=8, version="0", transport="http", now=NOW
    )[0]
    fields: dict[str, Any] = {"prompt": "work", "agent": AGENT, "project_dir": "/p"}
    run = store.runs.create(NewRun(type=RunType.START_SESSION, **{**fields, **kw}), NOW)
    claimed = store.runs.claim(runner.id, 8, NOW)
    run = next(r for r in claimed if r.id == run.id)
    store.runs.mark_started(run.id, runner.id, run.attempts, NOW)
    store.runs.record_session(run.id, runner.id, run.attempts, session_id, NOW)
    if end is not None:
        return end_run(store, run, end, result=f"result of {session_id}", cost_usd=0.25)
    return store.runs.get(run.id)


def end_run(store: Store, run: Run, status: RunStatus, now: float = NOW + 1, **kw: Any) -> Run:
    assert run.runner_id is not None
    report = RunReport(status=status, **kw)
    return store.runs.finish(run.id, run.runner_id, run.attempts, report, now)


def child(store: Store, parent: str, session_id: str, **kw: Any) -> Run:
    return session_run(store, session_id, parent_session=parent, callback="async_callback", **kw)


def refused(store: Store, specs: list[NewRun]) -> str:
    before = store.runs.list(limit=1000)
    with pytest.raises(CorralError) as caught:
        store.runs.create_many(specs, NOW)
    assert store.runs.list(limit=1000) == before  # nothing written
    return caught.value.code


def spec(parent: str, **kw: Any) -> NewRun:
    fields: dict[str, Any] = {"prompt": "sub", "agent": AGENT, "project_dir": "/p"}
    return NewRun(
        type=RunType.START_SESSION,
        parent_session=parent,
        callback="async_callback",
        **{**fields, **kw},
    )


def test_two_children_that_ended_resume_their_parent_once_with_both_results(
    store: Store,
) -> None:
    session_run(store, "parent", session_name="lead")
    first = child(store, "lead", "kid-1")  # named by the parent's name: resolved to its id
    second = child(store, "parent", "kid-2")
    assert (first.parent_session_id, first.depth) == ("parent", 1)

    done = store.callbacks.deliver(NOW + 2)
    assert len(done.resumes) == 1
    resume = done.resumes[0]
    assert (resume.type, resume.session_id, resume.required_runner) == (
        RunType.RESUME_SESSION,
        "parent",
        "r",
    )
    assert resume.prompt is not None
    assert "result of kid-1" in resume.prompt and "result of kid-2" in resume.prompt
    assert store.callbacks.delivered_by(first.id) == (resume.id, None)
    assert store.callbacks.delivered_by(second.id) == (resume.id, None)
    read = store.runs.get(first.id)
    assert (read.callback_state, read.callback_run_id) == ("delivered", resume.id)
    # Delivered: nothing more, from this store or another on the same database.
    assert store.callbacks.deliver(NOW + 3).resumes == []
    assert store.callbacks.pending() == []


def test_a_repeated_end_report_records_the_callback_once(store: Store) -> None:
    session_run(store, "parent")
    kid = child(store, "parent", "kid")
    assert end_run(store, kid, RunStatus.COMPLETED, result="result of kid").id == kid.id
    assert store.callbacks.pending() == [kid.id]


def test_a_busy_parent_gets_its_children_in_one_resume_after_its_run_ends(
    store: Store,
) -> None:
    parent_run = session_run(store, "parent", end=None)  # still running
    kids = [child(store, "parent", f"kid-{n}") for n in range(3)]
    assert store.callbacks.deliver(NOW + 2).resumes == []  # held while the parent is busy
    assert {r.callback_state for r in store.runs.list() if r.parent_session_id} == {"pending"}
    assert sorted(store.callbacks.pending()) == sorted(k.id for k in kids)

    end_run(store, parent_run, RunStatus.COMPLETED, result="parent done")
    done = store.callbacks.deliver(NOW + 3)
    assert len(done.resumes) == 1
    assert all(f"result of kid-{n}" in (done.resumes[0].prompt or "") for n in range(3))
    # The parent's pending resume makes it busy: a child ending now waits for the next one.
    late = child(store, "parent", "kid-late")
    assert store.callbacks.deliver(NOW + 4).resumes == []
    assert store.callbacks.pending() == [late.id]


def test_the_callbacks_of_a_failed_parent_are_dropped_as_parent_gone(store: Store) -> None:
    parent_run = session_run(store, "parent", end=None)
    kid = child(store, "parent", "kid")
    end_run(store, parent_run, RunStatus.FAILED, error="boom")
    done = store.callbacks.deliver(NOW + 2)
    assert (done.resumes, done.dropped) == ([], [kid.id])
    assert store.callbacks.delivered_by(kid.id) == (None, "parent_gone")
    assert store.runs.get(kid.id).callback_state == "parent_gone"
    assert store.callbacks.deliver(NOW + 3).dropped == []


def test_a_delivery_that_never_committed_is_made_again_once(store: Store, store_url: str) -> None:
    """A coordinator killed between a child's end and its parent's resume: the end and
    its callback are stored; the next coordinator (a new Store) delivers it, once."""
    session_run(store, "parent")
    kid = child(store, "parent", "kid")
    restarted = Store.open(store_url)
    try:
        assert [len(restarted.callbacks.deliver(NOW + 2).resumes)] == [1]
        assert store.callbacks.deliver(NOW + 3).resumes == []
        assert restarted.callbacks.deliver(NOW + 3).resumes == []
        resumes = [r for r in store.runs.list(session="parent") if r.type == "resume_session"]
        assert len(resumes) == 1
        assert store.callbacks.delivered_by(kid.id) == (resumes[0].id, None)
    finally:
        restarted.close()


def test_an_unknown_parent_is_refused_and_nothing_is_written(store: Store) -> None:
    session_run(store, "parent")
    assert refused(store, [spec("parent"), spec("nobody")]) == "parent_not_found"


def test_async_callback_needs_a_parent(store: Store) -> None:
    assert (
        refused(store, [NewRun(type=RunType.START_SESSION, prompt="x", callback="async_callback")])
        == "invalid_request"
    )


def test_depth_over_the_limit_is_refused(store: Store) -> None:
    store.runs.subagent_limits = Limits(max_depth=1)
    session_run(store, "root")
    assert child(store, "root", "kid").depth == 1
    assert refused(store, [spec("kid")]) == "depth_exceeded"


def test_fan_out_over_the_limit_is_refused_counting_the_same_request(store: Store) -> None:
    store.runs.subagent_limits = Limits(max_children=2)
    session_run(store, "parent")
    assert refused(store, [spec("parent"), spec("parent"), spec("parent")]) == ("fan_out_exceeded")
    store.runs.create_many([spec("parent"), spec("parent")], NOW)  # unfinished: two
    assert refused(store, [spec("parent")]) == "fan_out_exceeded"


def test_a_parent_whose_children_spent_its_budget_may_start_no_more(store: Store) -> None:
    session_run(store, "parent")  # cost 0.25 of AGENT's 1.00
    for n in range(3):
        child(store, "parent", f"kid-{n}")  # 0.25 each: the tree has cost 1.00
    assert refused(store, [spec("parent")]) == "budget_exceeded"


def test_children_that_outlived_their_parents_budget_are_dropped_as_budget_exceeded(
    store: Store,
) -> None:
    parent_run = session_run(store, "parent", end=None)  # busy: the children end first
    kids = [child(store, "parent", f"kid-{n}") for n in range(3)]  # 0.25 each
    end_run(store, parent_run, RunStatus.COMPLETED, cost_usd=0.25)  # the tree: 1.00 of 1.00
    done = store.callbacks.deliver(NOW + 2)
    assert (done.resumes, sorted(done.dropped)) == ([], sorted(k.id for k in kids))
    assert store.callbacks.delivered_by(kids[0].id) == (None, "budget_exceeded")


@pytest.mark.parametrize("dialect", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_deliverers_racing_on_postgres_resume_each_parent_once(
    store: Store, store_url: str
) -> None:
    """Four threads, each with its own Store (its own connections), deliver at once: each
    callback is delivered once, each parent resumed once with both its children."""
    parents = [f"parent-{n}" for n in range(8)]
    kids: dict[str, list[str]] = {}
    for parent in parents:
        session_run(store, parent)
        kids[parent] = [child(store, parent, f"{parent}-kid-{k}").id for k in range(2)]
    deliverers = [Store.open(store_url) for _ in range(4)]
    barrier = threading.Barrier(len(deliverers))
    lost_races: list[BaseException] = []

    def deliver(deliverer: Store) -> None:
        barrier.wait()
        while deliverer.callbacks.pending():
            try:
                deliverer.callbacks.deliver(NOW + 2)
            except Exception as exc:  # the other won (callback_settled, or a deadlock victim)
                lost_races.append(exc)

    threads = [threading.Thread(target=deliver, args=(d,)) for d in deliverers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for deliverer in deliverers:
            deliverer.close()
    assert not any(thread.is_alive() for thread in threads)
    for parent in parents:
        resumes = [r for r in store.runs.list(session=parent) if r.type == "resume_session"]
        assert len(resumes) == 1, (parent, resumes, lost_races)
        for kid in kids[parent]:
            assert store.callbacks.delivered_by(kid) == (resumes[0].id, None)


def test_retention_keeps_a_child_until_its_parent_has_heard_of_it(store: Store) -> None:
    session_run(store, "parent", end=None)  # busy: the callback stays owed
    kid = child(store, "parent", "kid")
    # A session's last run is kept anyway: let a later run of kid's session be its last.
    later = session_run(store, "kid", session_name="kid-again")
    everything = Retention(runs_s=0, runners_s=None, log_chars=None, events_s=None)
    assert store.collect_garbage(everything, NOW + 10).runs == 0
    assert store.runs.get(kid.id).callback_state == "pending"  # kept, and still owed
    assert store.runs.get(later.id).session_id == "kid"
