"""The runner's end of the link (``corral.protocol.runner.RunnerConnection``), phase by phase
of seed 000's Connection, Reconnect and Shutdown diagrams. Pure: no event loop, no sleeps;
time is a number the test advances."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from corral.errors import IllegalTransition
from corral.ids import RunnerId
from corral.protocol.messages import (
    ACKS_IN_COMMANDS,
    DUPLICATE_INIT,
    EXPECTED_INIT,
    REASON_COORDINATOR_LEAVING,
    REASON_EVICTED,
    REASON_RUNNER_SHUTDOWN,
    REASON_STOPPED,
    UNEXPECTED_MESSAGE,
    Indexed,
    ProtocolError,
    ToClientAckEvents,
    ToClientClose,
    ToClientCommands,
    ToClientDrain,
    ToClientInit,
    ToClientPong,
    ToServerAckCommands,
    ToServerEvents,
    ToServerInit,
    ToServerPing,
    ToServerStopping,
)
from corral.protocol.outputs import (
    Closed,
    Connected,
    Disconnected,
    DrainRequested,
    Execute,
    Reconnect,
    Send,
    StopAllWork,
)
from corral.protocol.runner import (
    HOLD_ON_RETRY_S,
    RETRY_ELSEWHERE_S,
    ConnectionState,
    RunnerConnection,
)

T0 = 1_000.0
RID = RunnerId("rnr_000000000001")
ACKS = {ACKS_IN_COMMANDS: 1}  # every Init says it reads acknowledgements in Commands
META = {"runner_lost_threshold": 15, "ping_interval": 3, "ack_interval": 300}


class FixedDraw(random.Random):
    """An rng whose every draw is ``value``: the backoff's jitter becomes exact."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def make(rng: random.Random | None = None, **kwargs: Any) -> RunnerConnection:
    return RunnerConnection(
        name="host-a",
        version="0.1.0",
        total_slots=4,
        labels=["gpu"],
        metadata={"hostname": "host-a"},
        rng=rng or FixedDraw(0.0),
        **kwargs,
    )


def init(runner_id: str = RID, last_event_idx: int = 0, meta: Any = None) -> ToClientInit:
    return ToClientInit(RunnerId(runner_id), last_event_idx, META if meta is None else meta)


def command(idx: int, run: str = "run_a") -> Indexed:
    return Indexed(idx, {"type": "start_run", "run": {"id": f"{run}{idx}"}})


def ev(n: int) -> dict[str, Any]:
    return {"type": "logs", "run_id": "run_a", "attempt": 1, "n": n}


def connected(now: float = T0, meta: Any = None, **kwargs: Any) -> RunnerConnection:
    runner = make(**kwargs)
    runner.connect(now)
    runner.receive(init(meta=meta), now)
    return runner


def sent(outputs: list[Any]) -> list[Any]:
    return [o.message for o in outputs if isinstance(o, Send)]


# ---- Phase 1-2: connect and init -----------------------------------------------------------


def test_connect_sends_init_with_no_identity_yet() -> None:
    runner = make()
    assert runner.state.value == "idle"
    assert runner.connect(T0) == [
        Send(
            ToServerInit("host-a", "0.1.0", 1, 4, 0, None, ("gpu",), {"hostname": "host-a", **ACKS})
        )
    ]
    assert runner.state is ConnectionState.CONNECTING
    # Only the wait for an answer (half the 15 s lease); no lost timer: no work to lose yet.
    assert runner.next_deadline() == T0 + 7.5


def test_connect_twice_is_illegal_and_changes_nothing() -> None:
    runner = make()
    runner.connect(T0)
    with pytest.raises(IllegalTransition):
        runner.connect(T0)
    assert runner.state is ConnectionState.CONNECTING


def test_init_stores_identity_and_metadata_and_connects_fresh() -> None:
    runner = make()
    runner.connect(T0)
    meta = {"runner_lost_threshold": 20, "ping_interval": 5.5, "ack_interval": 60}
    assert runner.receive(init(meta=meta), T0) == [Connected(RID, fresh=True)]
    assert runner.state is ConnectionState.ACTIVE
    assert runner.runner_id == RID
    assert (runner.lost_threshold_s, runner.ping_interval_s, runner.ack_interval_s) == (20, 5.5, 60)


@pytest.mark.parametrize("bad", [None, 0, -3, "5", True, float("nan"), float("inf")])
def test_missing_or_invalid_metadata_falls_back_to_defaults(bad: Any) -> None:
    runner = make(default_lost_threshold_s=9.0, default_ping_interval_s=2.0)
    runner.connect(T0)
    runner.receive(init(meta={"runner_lost_threshold": bad, "ping_interval": bad}), T0)
    assert (runner.lost_threshold_s, runner.ping_interval_s, runner.ack_interval_s) == (9, 2, 300)


def test_anything_but_init_first_is_a_protocol_error() -> None:
    runner = make()
    runner.connect(T0)
    with pytest.raises(ProtocolError) as caught:
        runner.receive(ToClientCommands((command(1),)), T0)
    assert caught.value.code == EXPECTED_INIT
    assert runner.state is ConnectionState.CONNECTING and runner.last_command_idx == 0


def test_a_second_init_on_one_socket_is_a_protocol_error() -> None:
    runner = connected()
    with pytest.raises(ProtocolError) as caught:
        runner.receive(init(), T0)
    assert caught.value.code == DUPLICATE_INIT


def test_frames_from_a_dropped_socket_are_ignored() -> None:
    runner = connected()
    runner.socket_closed(T0)
    assert runner.receive(ToClientCommands((command(1),)), T0) == []
    assert runner.last_command_idx == 0


# ---- commands ------------------------------------------------------------------------------


def test_commands_execute_in_index_order_once_each() -> None:
    runner = connected()
    out = runner.receive(ToClientCommands((command(2), command(1), command(1))), T0)
    assert out == [Execute(command(1)), Execute(command(2))]
    # A resend of what was executed, with one new command: only the new one runs.
    out = runner.receive(ToClientCommands((command(1), command(2), command(3))), T0)
    assert out == [Execute(command(3))]
    assert runner.last_command_idx == 3 and runner.gaps == 0


def test_a_gap_is_still_executed_and_counted() -> None:
    runner = connected()
    assert runner.receive(ToClientCommands((command(3),)), T0) == [Execute(command(3))]
    assert runner.gaps == 1
    assert runner.receive(ToClientCommands((command(2),)), T0) == []  # older than 3: dropped


def test_drain_request_is_passed_to_the_app() -> None:
    runner = connected()
    assert runner.receive(ToClientDrain(30.0), T0) == [DrainRequested(30.0)]


def test_pong_records_the_round_trip() -> None:
    runner = connected()
    assert runner.receive(ToClientPong(T0), T0 + 0.25) == []
    assert runner.rtt == 0.25


# ---- events --------------------------------------------------------------------------------


def test_events_are_numbered_from_one_and_sent_when_active() -> None:
    runner = connected()
    assert runner.send_event(ev(1), T0) == [Send(ToServerEvents((Indexed(1, ev(1)),)))]
    out = runner.send_events([ev(2), ev(3)], T0)
    assert out == [Send(ToServerEvents((Indexed(2, ev(2)), Indexed(3, ev(3)))))]  # one message
    assert [e.idx for e in runner.unacked_events] == [1, 2, 3]


def test_acknowledged_events_are_dropped() -> None:
    runner = connected()
    runner.send_events([ev(1), ev(2), ev(3)], T0)
    runner.receive(ToClientAckEvents(2), T0)
    assert [e.idx for e in runner.unacked_events] == [3]
    runner.receive(ToClientAckEvents(1), T0)  # a stale ack changes nothing
    assert [e.idx for e in runner.unacked_events] == [3]


def test_an_ack_in_a_commands_frame_drops_acknowledged_events_too() -> None:
    runner = connected()
    runner.send_events([ev(1), ev(2), ev(3)], T0)
    start = Indexed(1, {"type": "cancel_run", "run_id": "run_1"})
    assert runner.receive(ToClientCommands((start,), ack_events=2), T0) == [Execute(start)]
    assert [e.idx for e in runner.unacked_events] == [3]
    runner.receive(ToClientCommands((), ack_events=1), T0)  # a stale ack changes nothing
    assert [e.idx for e in runner.unacked_events] == [3]


def test_a_bad_event_body_is_refused_and_numbers_nothing() -> None:
    runner = connected()
    with pytest.raises(ValueError):
        runner.send_events([ev(1), {"no": "type"}], T0)
    assert runner.unacked_events == ()
    assert runner.send_event(ev(1), T0) == [Send(ToServerEvents((Indexed(1, ev(1)),)))]


def test_events_wait_while_disconnected() -> None:
    runner = connected()
    runner.socket_closed(T0)
    assert runner.send_event(ev(1), T0) == []
    assert runner.unacked_events == (Indexed(1, ev(1)),)


def test_big_backlogs_are_sent_in_bounded_frames() -> None:
    runner = connected(max_batch_events=2)
    runner.socket_closed(T0)
    runner.send_events([ev(n) for n in range(5)], T0)
    runner.connect(T0 + 1)
    frames = sent(runner.receive(init(), T0 + 1))
    assert [[e.idx for e in f.events] for f in frames] == [[1, 2], [3, 4], [5]]


# ---- Reconnect phase 1-3: resend, missed commands, identity ---------------------------------


def test_a_batch_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        make(max_batch_events=0)


def test_reconnect_keeps_identity_and_command_index() -> None:
    runner = connected()
    runner.receive(ToClientCommands((command(1), command(2))), T0)
    runner.socket_closed(T0)
    [hello] = sent(runner.connect(T0 + 1))
    assert isinstance(hello, ToServerInit)
    assert (hello.runner_id, hello.last_command_idx) == (RID, 2)


def test_reconnect_resends_only_what_the_server_has_not_applied() -> None:
    runner = connected()
    runner.send_events([ev(1), ev(2)], T0)
    runner.receive(ToClientAckEvents(1), T0)
    runner.socket_closed(T0)
    runner.send_events([ev(3), ev(4)], T0 + 0.5)  # buffered
    runner.connect(T0 + 1)
    # The server had applied 2 (its ack was lost with the socket): 3 and 4 are resent, in
    # one message, before the app hears Connected.
    out = runner.receive(init(last_event_idx=2), T0 + 1)
    assert out == [
        Send(ToServerEvents((Indexed(3, ev(3)), Indexed(4, ev(4))))),
        Connected(RID, fresh=False),
    ]
    assert [e.idx for e in runner.unacked_events] == [3, 4]


def test_reconnect_with_missed_commands() -> None:
    runner = connected()
    runner.receive(ToClientCommands((command(1),)), T0)
    runner.socket_closed(T0)
    runner.connect(T0 + 1)
    runner.receive(init(), T0 + 1)
    # Seed: the server sends every unacknowledged command right after its Init.
    out = runner.receive(ToClientCommands((command(1), command(2), command(3))), T0 + 1)
    assert out == [Execute(command(2)), Execute(command(3))]


def test_reconnect_without_missed_commands_executes_nothing() -> None:
    runner = connected()
    runner.receive(ToClientCommands((command(1),)), T0)
    runner.socket_closed(T0)
    runner.connect(T0 + 1)
    assert runner.receive(init(), T0 + 1) == [Connected(RID, fresh=False)]
    assert runner.last_command_idx == 1


def test_a_new_identity_clears_event_history_and_restarts_numbering() -> None:
    runner = connected()
    runner.receive(ToClientCommands((command(1), command(2))), T0)
    runner.send_events([ev(1), ev(2)], T0)
    runner.socket_closed(T0)
    runner.connect(T0 + 1)
    # The coordinator forgot us (runner stopped): a different id, nothing applied for it.
    new = RunnerId("rnr_000000000002")
    out = runner.receive(init(new, last_event_idx=0), T0 + 1)
    # The old identity's runs were reclaimed: stop them, or they would run twice.
    assert out == [StopAllWork(), Connected(new, fresh=True)]
    assert runner.unacked_events == () and runner.last_command_idx == 0
    assert runner.send_event(ev(9), T0 + 1) == [Send(ToServerEvents((Indexed(1, ev(9)),)))]
    assert runner.receive(ToClientCommands((command(1),)), T0 + 1) == [Execute(command(1))]


def test_a_new_identity_after_the_lost_timer_does_not_stop_work_twice() -> None:
    runner = connected()
    runner.socket_closed(T0)
    assert StopAllWork() in runner.tick(T0 + 15)
    runner.connect(T0 + 16)
    out = runner.receive(init("rnr_000000000002"), T0 + 16)
    assert out == [Connected(RunnerId("rnr_000000000002"), fresh=True)]


def test_new_events_are_never_numbered_at_or_below_what_the_server_applied() -> None:
    runner = make()
    runner.connect(T0)
    runner.receive(init(last_event_idx=40), T0)  # a coordinator ahead of us (its bug or ours)
    assert runner.send_event(ev(1), T0) == [Send(ToServerEvents((Indexed(41, ev(1)),)))]


# ---- acks and pings ------------------------------------------------------------------------


def test_commands_are_acked_right_after_connect_then_periodically_when_advanced() -> None:
    # A lease so long that the unanswered pings of this test never drop the socket.
    runner = connected(T0, meta={**META, "runner_lost_threshold": 1e6})
    assert runner.next_deadline() == T0
    assert runner.tick(T0) == [Send(ToServerAckCommands(0))]  # ack on (re)connect
    runner.receive(ToClientCommands((command(1), command(2))), T0 + 1)
    assert not [m for m in sent(runner.tick(T0 + 299)) if isinstance(m, ToServerAckCommands)]
    acks = [m for m in sent(runner.tick(T0 + 300)) if isinstance(m, ToServerAckCommands)]
    assert acks == [ToServerAckCommands(2)]
    # Nothing new: the next interval sends no ack.
    assert not [m for m in sent(runner.tick(T0 + 600)) if isinstance(m, ToServerAckCommands)]


def test_commands_are_acked_again_after_a_reconnect() -> None:
    runner = connected(T0)
    runner.receive(ToClientCommands((command(1),)), T0)
    runner.tick(T0)
    runner.socket_closed(T0 + 1)
    runner.connect(T0 + 2)
    runner.receive(init(), T0 + 2)
    assert runner.tick(T0 + 2) == [Send(ToServerAckCommands(1))]  # even though not advanced


def test_pings_every_interval_while_active() -> None:
    runner = connected(T0)
    runner.tick(T0)  # the connect ack
    assert runner.next_deadline() == T0 + 3
    assert runner.tick(T0 + 2.9) == []
    assert runner.tick(T0 + 3) == [Send(ToServerPing(T0 + 3))]
    assert runner.receive(ToClientPong(T0 + 3), T0 + 3.1) == []
    assert runner.tick(T0 + 4) == []
    assert runner.tick(T0 + 6.5) == [Send(ToServerPing(T0 + 6.5))]
    assert runner.next_deadline() == T0 + 9.5


def test_no_pings_or_acks_while_disconnected() -> None:
    runner = connected(T0)
    runner.socket_closed(T0)
    assert not sent(runner.tick(T0 + 10))


# ---- Reconnect: lost timer and backoff ------------------------------------------------------


def test_lost_timer_stops_all_work_once() -> None:
    runner = connected(T0)
    assert runner.socket_closed(T0) == [Disconnected()]
    assert StopAllWork() not in runner.tick(T0 + 14.9)
    assert runner.tick(T0 + 15).count(StopAllWork()) == 1
    runner.connect(T0 + 16)
    runner.connect_failed(T0 + 16)  # more failures do not restart the timer
    assert StopAllWork() not in runner.tick(T0 + 100)


def test_lost_timer_fires_while_a_connect_is_pending() -> None:
    runner = connected(T0)
    runner.socket_closed(T0)
    runner.connect(T0 + 1)  # a socket that opens but never gets its Init
    assert runner.next_deadline() == T0 + 8.5  # given up on after the silence window
    assert runner.tick(T0 + 8.5)[1:] == [Disconnected()]
    assert StopAllWork() in runner.tick(T0 + 15)


def test_a_successful_init_renews_the_lease_and_answered_pings_keep_it() -> None:
    runner = connected(T0)
    runner.socket_closed(T0)
    runner.connect(T0 + 1)
    runner.receive(init(), T0 + 1)  # the coordinator heard from us at T0 + 1
    for t in range(4, 100, 3):  # a ping every 3 s, each answered
        assert Send(ToServerPing(T0 + t)) in runner.tick(T0 + t)
        assert runner.receive(ToClientPong(T0 + t), T0 + t + 0.5) == []
    assert StopAllWork() not in runner.tick(T0 + 100)
    runner.socket_closed(T0 + 100)  # the lease runs from the last answered ping, T0 + 97
    assert StopAllWork() not in runner.tick(T0 + 111.9)
    assert runner.tick(T0 + 112).count(StopAllWork()) == 1


def test_the_lease_counts_from_the_last_answered_ping_not_the_disconnection() -> None:
    # The coordinator counts its silence from the last ping it read: after T0 + 3 it may
    # have read none, so it may give our runs away from T0 + 18 on, not T0 + 23.
    runner = connected(T0)
    runner.tick(T0)
    assert Send(ToServerPing(T0 + 3)) in runner.tick(T0 + 3)
    runner.receive(ToClientPong(T0 + 3), T0 + 3.2)
    assert Send(ToServerPing(T0 + 6)) in runner.tick(T0 + 6)  # never answered
    runner.socket_closed(T0 + 8)
    assert runner.next_deadline() == T0 + 9  # the reconnect; the lease ends at T0 + 18
    runner.receive(ToClientPong(T0 + 1), T0 + 8)  # late, from a closed socket: no effect
    assert StopAllWork() not in runner.tick(T0 + 17.9)
    assert StopAllWork() in runner.tick(T0 + 18)


def answered_pings(runner: RunnerConnection, start: float, end: float) -> None:
    """Tick every second from ``start`` to ``end``, each ping answered 0.1 s later."""
    for t in range(int(start), int(end) + 1):
        for message in sent(runner.tick(T0 + t)):
            if isinstance(message, ToServerPing):
                assert runner.receive(ToClientPong(message.ts), T0 + t + 0.1) == []


def test_a_link_whose_pings_are_answered_stays_up() -> None:
    runner = connected(T0)
    answered_pings(runner, 0, 120)
    assert runner.state is ConnectionState.ACTIVE


def test_a_silent_socket_is_dropped_and_work_stops_a_margin_before_the_lease_ends() -> None:
    # Half-open: the socket looks open but nothing comes back. Lease 15 - 5 = 10 s, from
    # the last answered ping at T0 + 3; dropped when silent for max(2 pings, lease / 2).
    runner = connected(T0, stop_margin_s=6.0)  # the margin is at most a third: 5 s
    assert (runner.lease_s, runner.silence_s) == (10.0, 6.0)
    answered_pings(runner, 0, 3)
    assert Send(ToServerPing(T0 + 6)) in runner.tick(T0 + 6)  # never answered
    assert runner.tick(T0 + 8.9) == []
    closed, disconnected = runner.tick(T0 + 9)
    assert isinstance(closed, Closed) and closed.reconnect and "6 s" in closed.reason
    assert disconnected == Disconnected() and runner.state is ConnectionState.DISCONNECTED
    assert runner.tick(T0 + 10) == [Reconnect()]
    runner.connect(T0 + 10)  # this socket is no better: no Init comes back
    assert StopAllWork() not in runner.tick(T0 + 12.9)
    assert runner.tick(T0 + 13) == [StopAllWork()]  # T0 + 3 + 10, before the coordinator's 18


def test_a_slow_answer_to_the_init_leaves_the_first_ping_time_to_come_back() -> None:
    # Found by the chaos soak: an Init answered long after it was sent (a loaded
    # coordinator), the first ping due a third of the lease after that. Counted from the
    # Init sent, the silence window (6 s) ended before that ping (T0 + 4 + 3.3) could be
    # answered, and a healthy socket was dropped — then a database outage kept the runner
    # from connecting again within its lease, and its runs were started again elsewhere.
    runner = make(stop_margin_s=6.0)
    runner.connect(T0)
    assert runner.receive(init(), T0 + 4) == [Connected(RunnerId(RID), fresh=True)]
    assert not any(isinstance(o, Closed) for o in runner.tick(T0 + 6.5))  # not dropped
    answered_pings(runner, 7, 60)
    assert runner.state is ConnectionState.ACTIVE


def test_a_dropped_silent_socket_that_reconnects_in_time_keeps_its_identity_and_work() -> None:
    runner = connected(T0)
    runner.receive(ToClientCommands((command(1),)), T0)
    runner.tick(T0)
    assert isinstance(runner.tick(T0 + 7.5)[0], Closed)  # silent since the Init at T0
    assert runner.tick(T0 + 8.5) == [Reconnect()]
    (init_sent,) = sent(runner.connect(T0 + 8.5))
    assert (init_sent.runner_id, init_sent.last_command_idx) == (RID, 1)
    assert runner.receive(init(), T0 + 8.6) == [Connected(RunnerId(RID), fresh=False)]
    answered_pings(runner, 9, 60)
    assert runner.state is ConnectionState.ACTIVE


def test_pings_come_at_least_three_times_a_lease() -> None:
    # A coordinator asking for pings as rare as its lost threshold would make a healthy
    # link look silent: the runner pings more often than it is told.
    runner = connected(T0, meta={"runner_lost_threshold": 6, "ping_interval": 6})
    runner.tick(T0)
    assert runner.next_deadline() == T0 + 2
    answered_pings(runner, 1, 60)
    assert runner.state is ConnectionState.ACTIVE


def test_after_stopping_all_work_the_next_init_presents_no_identity() -> None:
    # Runs it stopped must not stay assigned to its identity: it comes back as a new runner
    # and the coordinator takes back what the old one held.
    runner = connected(T0)
    runner.receive(ToClientCommands((command(1), command(2))), T0)
    runner.socket_closed(T0)
    assert StopAllWork() in runner.tick(T0 + 15)
    (init_sent,) = sent(runner.connect(T0 + 16))
    assert init_sent.runner_id is None and init_sent.last_command_idx == 0
    new = RunnerId("rnr_000000000002")
    assert runner.receive(init(new), T0 + 16) == [Connected(new, fresh=True)]
    runner.socket_closed(T0 + 17)  # a plain reconnect keeps the new identity
    (init_sent,) = sent(runner.connect(T0 + 18))
    assert init_sent.runner_id == new


def test_an_init_answered_after_the_lease_ran_out_is_refused() -> None:
    runner = connected(T0)
    runner.socket_closed(T0)
    runner.connect(T0 + 14)  # presents its identity: the lease still holds
    assert runner.tick(T0 + 15) == [StopAllWork()]
    with pytest.raises(ProtocolError) as refused:  # the pump closes that socket
        runner.receive(init(), T0 + 16)
    assert refused.value.code == UNEXPECTED_MESSAGE
    assert runner.socket_closed(T0 + 16) == [Disconnected()]
    (init_sent,) = sent(runner.connect(T0 + 17))
    assert init_sent.runner_id is None


def test_lost_threshold_comes_from_the_server() -> None:
    runner = make()
    runner.connect(T0)
    runner.receive(init(meta={"runner_lost_threshold": 4}), T0)
    runner.socket_closed(T0)
    assert StopAllWork() in runner.tick(T0 + 4)


def reconnect_delay(runner: RunnerConnection, since: float) -> float:
    """How long after ``since`` the runner announces ``Reconnect`` (its only timer here)."""
    deadline = runner.next_deadline()
    assert deadline is not None
    assert Reconnect() not in runner.tick(deadline - 1e-6)
    assert runner.tick(deadline) == [Reconnect()]
    return deadline - since


def test_backoff_doubles_to_the_cap_and_resets_on_success() -> None:
    # No lost threshold from the server: the huge default keeps StopAllWork out of the way.
    runner = connected(T0, meta={}, rng=FixedDraw(0.0), default_lost_threshold_s=1e6)
    runner.socket_closed(T0)
    delays, now = [], T0
    for n in range(7):
        assert runner.attempt == n + 1
        delays.append(reconnect_delay(runner, now))
        now += delays[-1]
        runner.connect(now)
        runner.connect_failed(now)
    assert delays == [1, 2, 4, 8, 16, 30, 30]  # min(1 s·2^n, 30 s)
    runner.connect(now)
    runner.receive(init(meta={}), now)
    assert runner.attempt == 0  # reset by the successful Init
    runner.socket_closed(now)
    assert reconnect_delay(runner, now) == 1


def test_backoff_jitter_adds_0_to_25_percent() -> None:
    runner = connected(T0, meta={}, rng=random.Random(7), default_lost_threshold_s=1e6)
    same_draws = random.Random(7)
    runner.socket_closed(T0)
    now, jitters = T0, []
    for n in range(8):
        plain = min(2.0**n, 30.0)
        delay = reconnect_delay(runner, now)
        assert delay == pytest.approx(plain * (1 + 0.25 * same_draws.random()))
        jitters.append(delay / plain - 1)
        now += delay
        runner.connect(now)
        runner.connect_failed(now)
    assert all(0 <= j <= 0.25 for j in jitters)
    assert len(set(jitters)) == len(jitters)  # drawn each time, not a constant


def test_reconnect_is_announced_once() -> None:
    runner = connected(T0)
    runner.socket_closed(T0)
    assert runner.tick(T0 + 1) == [Reconnect()]
    assert runner.tick(T0 + 2) == []  # the app calls connect when it is ready
    assert runner.state is ConnectionState.DISCONNECTED


def test_socket_closed_is_idempotent() -> None:
    runner = connected(T0)
    assert runner.socket_closed(T0) == [Disconnected()]
    assert runner.socket_closed(T0) == []
    assert runner.attempt == 1


# ---- close, eviction, shutdown -------------------------------------------------------------


@pytest.mark.parametrize("reason", [REASON_EVICTED, REASON_STOPPED])
def test_evicted_or_stopped_runners_do_not_reconnect(reason: str) -> None:
    runner = connected(T0)
    assert runner.receive(ToClientClose(reason), T0) == [Closed(reason, reconnect=False)]
    assert runner.state is ConnectionState.CLOSED
    assert runner.socket_closed(T0) == []  # the transport's close that follows
    assert runner.tick(T0 + 1000) == [] and runner.next_deadline() is None
    with pytest.raises(IllegalTransition):
        runner.connect(T0 + 1)


def test_another_close_reason_is_a_disconnect() -> None:
    runner = connected(T0)
    out = runner.receive(ToClientClose("corral.restarting"), T0)
    assert out == [Closed("corral.restarting", reconnect=True), Disconnected()]
    assert runner.state is ConnectionState.DISCONNECTED
    assert runner.socket_closed(T0) == []
    assert runner.tick(T0 + 1) == [Reconnect()]


def test_stopping_is_sent_once_while_active() -> None:
    runner = connected(T0)
    assert runner.stopping(T0) == [Send(ToServerStopping())]
    assert runner.stopping(T0) == []
    assert runner.draining


def test_a_draining_runner_reconnects_and_says_stopping_again() -> None:
    runner = connected(T0)
    runner.stopping(T0)
    runner.send_event(ev(1), T0)
    runner.socket_closed(T0)
    assert runner.tick(T0 + 1) == [Reconnect()]  # still reconnects: it has work to report
    runner.connect(T0 + 1)
    out = runner.receive(init(), T0 + 1)
    assert out == [
        Send(ToServerEvents((Indexed(1, ev(1)),))),
        Send(ToServerStopping()),
        Connected(RID, fresh=False),
    ]


def test_stopping_while_disconnected_is_sent_after_the_next_init() -> None:
    runner = connected(T0)
    runner.socket_closed(T0)
    assert runner.stopping(T0) == []
    runner.connect(T0 + 1)
    assert Send(ToServerStopping()) in runner.receive(init(), T0 + 1)


def test_shutdown_says_stopping_if_not_said_and_closes_for_good() -> None:
    runner = connected(T0)
    assert runner.shutdown(T0) == [
        Send(ToServerStopping()),
        Closed(REASON_RUNNER_SHUTDOWN, reconnect=False),
    ]
    assert runner.state is ConnectionState.CLOSED and runner.next_deadline() is None
    assert runner.shutdown(T0) == []

    runner = connected(T0)
    runner.stopping(T0)
    assert runner.shutdown(T0) == [Closed(REASON_RUNNER_SHUTDOWN, reconnect=False)]


def test_with_several_coordinators_the_next_is_tried_at_once_then_all_after_a_backoff() -> None:
    runner = connected(T0, meta={}, default_lost_threshold_s=1e6, addresses=2)
    runner.socket_closed(T0)
    delays, now = [], T0
    for _ in range(6):
        delays.append(reconnect_delay(runner, now))
        now += delays[-1]
        runner.connect(now)
        runner.connect_failed(now)
    # The other coordinator at once; when both failed, a backoff, as for one.
    assert delays == pytest.approx([RETRY_ELSEWHERE_S, 1, RETRY_ELSEWHERE_S, 2, 0.1, 4])


def test_reconnect_attempts_fit_inside_the_lease_and_quicken_near_its_end() -> None:
    # Lease 30 - 5 = 25 s from the Init at T0. A backoff alone would try at +1, +3, +7,
    # +15 and +31: past the lease, so a coordinator back at +20 would find the runner's
    # work stopped. Each wait is at most a quarter of what is left of the lease.
    runner = connected(T0, meta={"runner_lost_threshold": 30}, stop_margin_s=5.0)
    lease_end = T0 + runner.lease_s
    runner.socket_closed(T0)
    attempts, now = [], T0
    while True:
        now = runner.next_deadline() or now
        assert runner.tick(now) == [Reconnect()]  # never the lease's end first
        attempts.append(now - T0)
        runner.connect(now)
        if now >= lease_end - 1:
            break  # this one gets in: the coordinator is back
        runner.connect_failed(now)
    assert attempts[:4] == pytest.approx([1, 3, 7, 11.5])
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(b <= a for a, b in itertools.pairwise(gaps[3:]))  # ever closer together
    assert runner.lease_s - attempts[-1] <= 1  # still trying in the lease's last second
    assert runner.receive(init(meta={"runner_lost_threshold": 30}), now)[-1] == Connected(
        RID, fresh=False
    )
    assert StopAllWork() not in runner.tick(lease_end + 1)


def failing_reconnects_until_the_work_stops(
    runner: RunnerConnection, now: float
) -> tuple[float, int]:
    """Every reconnect fails until the lease runs out: when the work stopped, and how many
    attempts were made meanwhile."""
    stopped, attempts = False, 0
    while not stopped:
        now = runner.next_deadline() or now
        out = runner.tick(now)
        stopped = StopAllWork() in out
        if Reconnect() in out:
            runner.connect(now)
            runner.connect_failed(now)
            attempts += 1
    return now, attempts


def test_once_the_lease_ran_out_the_backoff_starts_over() -> None:
    # The quick attempts inside the lease (a dozen) are not a backoff's rounds: once the
    # work has stopped, the next waits are 1 s, 2 s … again, not the 30 s cap, so a
    # coordinator back a moment after the lease ended finds the runner at once.
    runner = connected(T0, meta={"runner_lost_threshold": 30}, stop_margin_s=5.0)
    runner.socket_closed(T0)
    now, quick = failing_reconnects_until_the_work_stops(runner, T0)
    assert quick >= 8
    waits = []
    for _ in range(3):
        waits.append(reconnect_delay(runner, now))
        now += waits[-1]
        runner.connect(now)
        runner.connect_failed(now)
    assert waits[1:] == pytest.approx([1, 2])


def test_with_a_final_report_unsent_attempts_fit_inside_the_coordinators_grace_for_it() -> None:
    # The work stopped at the lease's end, but a run's final report waits to be sent: the
    # coordinator keeps that run waiting lost for it until its grace ends, a threshold
    # after it found the runner lost (T0 + 30 at the soonest): T0 + 60. A backoff from
    # the stop (+25) would try at +26, +28, +32, +40 and +56, then +86: a coordinator back
    # at +57 would be found too late, and the done run failed.
    runner = connected(T0, meta={"runner_lost_threshold": 30}, stop_margin_s=5.0)
    finished = {"type": "finished", "run_id": "run_a", "attempt": 1, "status": "completed"}
    runner.socket_closed(T0)
    runner.send_events([finished], T0 + 0.5)  # ended just as the link went
    now, _ = failing_reconnects_until_the_work_stops(runner, T0)
    grace_end = T0 + 60
    attempts = []
    while now < grace_end - 1:
        now += reconnect_delay(runner, now)
        attempts.append(now - T0)
        runner.connect(now)
        runner.connect_failed(now)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[:2] == pytest.approx([1, 2])  # the backoff starts over, as without
    assert 59 <= attempts[-1] < 60  # still trying in the grace's last second
    assert all(gap <= (60 - at) / 4 + 1e-9 for gap, at in zip(gaps, attempts, strict=False))
    # Once the grace is over the report cannot count: the plain backoff again.
    runner.connect(now := grace_end + 1)
    runner.connect_failed(now)
    assert reconnect_delay(runner, now) > 1


# ---- a coordinator that stops (a deploy) ----------------------------------------------------


def test_a_coordinator_leaving_sends_its_runner_to_the_next_at_once_keeping_its_work() -> None:
    runner = connected(T0, meta={}, default_lost_threshold_s=1e6, addresses=2)
    out = runner.receive(ToClientClose(REASON_COORDINATOR_LEAVING), T0)
    assert out == [Closed(REASON_COORDINATOR_LEAVING, reconnect=True), Disconnected()]
    assert runner.tick(T0) == [Reconnect()]  # at once, not after RETRY_ELSEWHERE_S
    assert runner.attempt == 0  # not a failure
    runner.connect(T0)
    out = runner.receive(init(meta={}), T0 + 0.01)
    assert out[-1] == Connected(RID, fresh=False)  # the same identity: its runs go on
    assert StopAllWork() not in out


def test_with_one_coordinator_the_runner_holds_on_and_tries_often_until_it_is_back() -> None:
    # A backoff would wait 1, 2, 4, 8 s: a coordinator back after 3 s would wait for it
    # until +7 s. Told the coordinator stops, the runner tries every HOLD_ON_RETRY_S.
    runner = connected(T0, meta={}, rng=FixedDraw(0.0), default_lost_threshold_s=1e6)
    runner.receive(ToClientClose(REASON_COORDINATOR_LEAVING), T0)
    delays, now = [], T0
    for _ in range(6):
        delays.append(reconnect_delay(runner, now))
        now += delays[-1]
        runner.connect(now)
        runner.connect_failed(now)
    assert delays == pytest.approx([0, *[HOLD_ON_RETRY_S] * 5])
    runner.connect(now)
    runner.receive(init(meta={}), now)
    runner.socket_closed(now)  # a failure after it was back: the usual backoff again
    assert reconnect_delay(runner, now) == 1
