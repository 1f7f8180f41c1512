"""Late reports in the runner's link (``corral.protocol.runner``): work finished before
the lease ran out keeps its final report across the new identity the runner gets, so
that the coordinator can still end the run instead of running it again (issue 16 §2).
Pure: no event loop, no sleeps; time is a number the test advances."""

from __future__ import annotations

import random
from typing import Any

from corral.ids import RunnerId
from corral.protocol.messages import (
    ACKS_IN_COMMANDS,
    LATE_REPORTS_TO_SEND,
    Indexed,
    ToClientAckEvents,
    ToClientInit,
    ToServerInit,
)
from corral.protocol.outputs import Connected, Send, StopAllWork
from corral.protocol.runner import RunnerConnection, late_reports

T0 = 1_000.0
OLD = RunnerId("rnr_000000000001")
NEW = RunnerId("rnr_000000000002")
NEWER = RunnerId("rnr_000000000003")
META = {"runner_lost_threshold": 15, "ping_interval": 3, "ack_interval": 300}
TAKES_LATE = {**META, "late_reports": 1}


def connected(runner_id: RunnerId = OLD) -> RunnerConnection:
    runner = RunnerConnection(
        name="host-a",
        version="0.1.0",
        total_slots=4,
        labels=[],
        metadata={},
        rng=random.Random(0),
    )
    runner.connect(T0)
    runner.receive(ToClientInit(runner_id, 0, TAKES_LATE), T0)
    return runner


def report(kind: str, run: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "run_id": run, "attempt": 1, **fields}


def events_sent(outputs: list[Any]) -> list[Indexed]:
    return [e for o in outputs if isinstance(o, Send) for e in getattr(o.message, "events", ())]


def lose_the_lease(runner: RunnerConnection, at: float) -> float:
    """The socket breaks and stays away past the lease: all work stops; returns the time."""
    runner.socket_closed(at)
    assert StopAllWork() in runner.tick(at + 15)
    runner.connect(at + 16)
    return at + 16


# What run_a (done) and run_b (stopped by the lease's end) left unacknowledged.
DONE = [
    report("started", "run_a"),
    report("logs", "run_b", lines=[]),
    report("logs", "run_a", lines=[{"line_no": 0}]),
    report("session", "run_a", session_id="s"),
    report("finished", "run_a", status="completed", exit_code=0),
]


def test_the_final_reports_of_the_former_identity_go_to_the_new_one() -> None:
    runner = connected()
    runner.send_events(DONE, T0)
    now = lose_the_lease(runner, T0)

    out = runner.receive(ToClientInit(NEW, 0, TAKES_LATE), now)

    # run_a's events in order, numbered for the new identity, each naming the one that
    # held the attempt; run_b reported no end (the lease ended it): nothing of it goes.
    a_events = [DONE[0], DONE[2], DONE[3], DONE[4]]
    carried = [Indexed(i + 1, {**body, "former_runner_id": OLD}) for i, body in enumerate(a_events)]
    assert events_sent(out) == carried
    assert out[-1] == Connected(NEW, True, ((1, 1), (3, 2), (4, 3), (5, 4)))
    assert runner.unacked_events == tuple(carried)
    # The new identity's own events come after them; an ack ends their replay.
    assert events_sent(runner.send_event(report("logs", "run_c"), now)) == [
        Indexed(5, report("logs", "run_c"))
    ]
    runner.receive(ToClientAckEvents(5), now)
    assert runner.unacked_events == ()


def test_a_coordinator_that_does_not_take_late_reports_gets_none() -> None:
    """An older coordinator would refuse ``former_runner_id``: as before, nothing goes."""
    runner = connected()
    runner.send_events(DONE, T0)
    now = lose_the_lease(runner, T0)
    out = runner.receive(ToClientInit(NEW, 0, META), now)
    assert events_sent(out) == []
    assert out[-1] == Connected(NEW, True)
    assert runner.unacked_events == ()


def test_a_new_identity_while_the_lease_holds_carries_them_too() -> None:
    """The coordinator gave a new id before the runner's lease ran out (it was declared lost
    or stopped meanwhile): the work stops now, and its finished reports go on."""
    runner = connected()
    runner.send_events(DONE, T0)
    runner.socket_closed(T0)
    runner.connect(T0 + 1)
    out = runner.receive(ToClientInit(NEW, 0, TAKES_LATE), T0 + 1)
    assert out[0] == StopAllWork()
    assert [e.body["type"] for e in events_sent(out)] == ["started", "logs", "session", "finished"]


def test_reports_carried_twice_keep_naming_the_identity_that_held_the_attempt() -> None:
    runner = connected()
    runner.send_events(DONE, T0)
    now = lose_the_lease(runner, T0)
    runner.receive(ToClientInit(NEW, 0, TAKES_LATE), now)
    runner.send_event(report("finished", "run_c", status="failed"), now)  # the new id's own
    later = lose_the_lease(runner, now)
    out = runner.receive(ToClientInit(NEWER, 0, TAKES_LATE), later)
    holders = [(e.body["run_id"], e.body["former_runner_id"]) for e in events_sent(out)]
    assert holders == [("run_a", OLD)] * 4 + [("run_c", NEW)]


def test_nothing_is_carried_when_every_report_was_acknowledged() -> None:
    runner = connected()
    runner.send_events(DONE, T0)
    runner.receive(ToClientAckEvents(5), T0)
    now = lose_the_lease(runner, T0)
    out = runner.receive(ToClientInit(NEW, 0, TAKES_LATE), now)
    assert events_sent(out) == [] and out[-1] == Connected(NEW, True)


def test_late_reports_are_the_events_of_finished_attempts_only() -> None:
    events = [
        Indexed(1, report("logs", "run_a")),
        Indexed(2, {**report("logs", "run_a"), "attempt": 2}),  # another attempt
        Indexed(3, {"type": "actor_state", "actor_id": "act_1"}),
        Indexed(4, report("finished", "run_a", status="completed")),
    ]
    kept = late_reports(events, OLD)
    assert [e.idx for e in kept] == [1, 4]
    assert all(e.body["former_runner_id"] == OLD for e in kept)
    assert late_reports(events[:3], OLD) == []


def test_the_init_of_a_spent_identity_announces_the_final_reports_to_come() -> None:
    """So that the coordinator claims nothing for the new identity before they are applied
    (it would claim back the very run a late report says is done)."""
    runner = connected()
    runner.send_events(DONE, T0)
    runner.socket_closed(T0)
    assert StopAllWork() in runner.tick(T0 + 15)
    (hello,) = [o.message for o in runner.connect(T0 + 16) if isinstance(o, Send)]
    assert isinstance(hello, ToServerInit)
    assert hello.runner_id is None
    assert hello.metadata == {LATE_REPORTS_TO_SEND: 1, ACKS_IN_COMMANDS: 1}


def test_an_identity_kept_or_with_nothing_to_carry_announces_nothing() -> None:
    runner = connected()
    runner.send_events(DONE[:2], T0)  # nothing finished
    runner.socket_closed(T0)
    (kept,) = [o.message for o in runner.connect(T0 + 1) if isinstance(o, Send)]
    assert kept.runner_id == OLD  # the lease holds: same identity
    assert kept.metadata == {ACKS_IN_COMMANDS: 1}
    runner.connect_failed(T0 + 1)
    assert StopAllWork() in runner.tick(T0 + 15)
    (spent,) = [o.message for o in runner.connect(T0 + 16) if isinstance(o, Send)]
    assert spent.runner_id is None and spent.metadata == {ACKS_IN_COMMANDS: 1}
