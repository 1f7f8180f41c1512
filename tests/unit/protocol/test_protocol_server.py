"""The coordinator's end of one socket (``corral.protocol.server.ServerSession``): init and
its timeout, the order of the greeting, dedup of events by index, acks only after commits,
liveness, drain and eviction. Pure: the test plays the pump and the store."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from corral.errors import IllegalTransition
from corral.ids import RunnerId
from corral.protocol.messages import (
    ACKS_IN_COMMANDS,
    MALFORMED_FRAME,
    TUNNEL_WHOLE,
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
    Alive,
    Apply,
    Close,
    CommandsAcked,
    Register,
    Send,
    Stopping,
)
from corral.protocol.server import ServerSession, SessionState

T0 = 1_000.0
RID = RunnerId("rnr_000000000001")
META = {
    "runner_lost_threshold": 15.0,
    "ping_interval": 3.0,
    "ack_interval": 300.0,
    "tunnel": TUNNEL_WHOLE,
    "late_reports": 1,
}


def hello(runner_id: str | None = None, last_command_idx: int = 0, version: int = 1) -> Any:
    rid = None if runner_id is None else RunnerId(runner_id)
    return ToServerInit("host-a", "0.1.0", version, 4, last_command_idx, rid, ("gpu",), {})


def cmd(idx: int) -> Indexed:
    return Indexed(idx, {"type": "cancel_run", "run_id": f"run_{idx}"})


def event(idx: int) -> Indexed:
    return Indexed(idx, {"type": "started", "run_id": "run_a", "attempt": 1, "i": idx})


def events(*idxs: int) -> ToServerEvents:
    return ToServerEvents(tuple(event(i) for i in idxs))


def active(last_event_idx: int = 0, now: float = T0) -> ServerSession:
    session = ServerSession(now)
    session.receive(hello(RID), now)
    session.registered(RID, last_event_idx, [], now)
    return session


# ---- Connection phases 1-4 -----------------------------------------------------------------


def test_init_asks_the_pump_to_register_the_runner() -> None:
    session = ServerSession(T0)
    init = hello()
    assert session.receive(init, T0) == [Register(init)]
    assert session.state is SessionState.REGISTERING and session.init == init


def test_registered_greets_then_sends_missed_commands() -> None:
    session = ServerSession(T0)
    session.receive(hello(), T0)
    out = session.registered(RID, 5, [cmd(2), cmd(1)], T0)
    assert out == [
        Send(ToClientInit(RID, 5, META)),
        Send(ToClientCommands((cmd(1), cmd(2)))),
    ]
    assert session.state is SessionState.ACTIVE and session.runner_id == RID


def test_registered_without_missed_commands_only_greets() -> None:
    session = ServerSession(T0)
    session.receive(hello(), T0)
    assert session.registered(RID, 0, [], T0) == [Send(ToClientInit(RID, 0, META))]


def test_metadata_carries_the_session_settings() -> None:
    session = ServerSession(T0, lost_threshold_s=20, ping_interval_s=2, ack_interval_s=60)
    session.receive(hello(), T0)
    [greeting] = session.registered(RID, 0, [], T0)
    assert greeting == Send(
        ToClientInit(
            RID,
            0,
            {
                "runner_lost_threshold": 20,
                "ping_interval": 2,
                "ack_interval": 60,
                "tunnel": TUNNEL_WHOLE,
                "late_reports": 1,
            },
        )
    )


def test_commands_the_runner_already_has_are_not_resent_to_the_same_identity() -> None:
    session = ServerSession(T0)
    session.receive(hello(RID, last_command_idx=2), T0)
    out = session.registered(RID, 0, [cmd(1), cmd(2), cmd(3)], T0)
    assert out[1:] == [Send(ToClientCommands((cmd(3),)))]


def test_a_new_identity_gets_every_command_whatever_the_init_said() -> None:
    session = ServerSession(T0)
    session.receive(hello("rnr_old", last_command_idx=7), T0)
    out = session.registered(RID, 0, [cmd(1)], T0)
    assert out[1:] == [Send(ToClientCommands((cmd(1),)))]


def test_pushes_while_registering_are_delivered_with_the_greeting() -> None:
    session = ServerSession(T0)
    session.receive(hello(), T0)
    assert session.push([cmd(3)]) == []  # stored after the pump's lookup
    assert session.drain(60.0) == []
    out = session.registered(RID, 0, [cmd(2), cmd(3)], T0)
    assert out == [
        Send(ToClientInit(RID, 0, META)),
        Send(ToClientCommands((cmd(2), cmd(3)))),  # merged, once each
        Send(ToClientDrain(60.0)),
    ]


def test_push_sends_stored_commands_when_active() -> None:
    session = active()
    assert session.push([cmd(1), cmd(2)]) == [Send(ToClientCommands((cmd(1), cmd(2))))]
    assert session.push([]) == []


# ---- protocol errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "message", [ToServerPing(T0), events(1), ToServerStopping(), ToServerAckCommands(1)]
)
def test_anything_before_init_closes_the_socket(message: Any) -> None:
    session = ServerSession(T0)
    assert session.receive(message, T0) == [Close(1008, "corral.protocol_error:expected_init")]
    assert session.state is SessionState.CLOSED
    assert session.receive(hello(), T0) == []  # late frames are ignored


def test_an_init_from_a_future_protocol_closes_the_socket() -> None:
    session = ServerSession(T0)
    out = session.receive(hello(version=2), T0)
    assert out == [Close(1008, "corral.protocol_error:unsupported_version")]


def test_a_second_init_closes_the_socket() -> None:
    session = active()
    assert session.receive(hello(), T0) == [Close(1008, "corral.protocol_error:duplicate_init")]


def test_messages_while_registering_close_the_socket() -> None:
    session = ServerSession(T0)
    session.receive(hello(), T0)
    out = session.receive(ToServerPing(T0), T0)
    assert out == [Close(1008, "corral.protocol_error:unexpected_message")]
    assert session.registered(RID, 0, [], T0) == []  # the store answered too late: no-op


def test_undecodable_frames_close_the_socket_with_their_code() -> None:
    session = active()
    error = ProtocolError(MALFORMED_FRAME, "not JSON")
    assert session.receive_error(error) == [Close(1008, "corral.protocol_error:malformed_frame")]
    assert session.receive_error(error) == []


def test_registered_is_only_legal_while_registering() -> None:
    session = ServerSession(T0)
    with pytest.raises(IllegalTransition):
        session.registered(RID, 0, [], T0)
    assert session.state is SessionState.AWAITING_INIT


# ---- events: dedup by index, ack after commit ----------------------------------------------


def test_new_events_are_applied_in_order_and_acked_after_the_commit() -> None:
    session = active(last_event_idx=2)
    # 1 and 2 were applied before this socket (the runner replays them): dropped.
    out = session.receive(ToServerEvents((event(4), event(1), event(3), event(2))), T0)
    assert out == [Apply((event(3), event(4)))]
    assert session.applied(4) == [Send(ToClientAckEvents(4))]
    assert session.last_applied_event_idx == 4


def test_events_handed_out_but_not_yet_committed_are_not_applied_twice() -> None:
    session = active()
    assert session.receive(events(1, 2), T0) == [Apply((event(1), event(2)))]
    assert session.receive(events(1, 2, 3), T0) == [Apply((event(3),))]
    assert session.receive(events(3, 3), T0) == []
    assert session.applied(2) == [Send(ToClientAckEvents(2))]
    assert session.applied(3) == [Send(ToClientAckEvents(3))]
    assert session.applied(3) == []  # stale confirmations ack nothing


def test_duplicates_inside_one_message_are_applied_once() -> None:
    session = active()
    assert session.receive(events(1, 1, 2), T0) == [Apply((event(1), event(2)))]


def test_an_index_gap_is_applied_and_counted() -> None:
    session = active()
    assert session.receive(events(1, 3), T0) == [Apply((event(1), event(3)))]
    assert session.gaps == 1


def test_applied_beyond_what_was_handed_out_is_illegal() -> None:
    session = active()
    session.receive(events(1), T0)
    with pytest.raises(IllegalTransition):
        session.applied(2)


def test_applied_after_close_is_a_no_op() -> None:
    session = active()
    session.receive(events(1), T0)
    session.evict()
    assert session.applied(1) == []


# ---- an acknowledgement in the Commands frame that follows (ACKS_IN_COMMANDS) ----------------


def reading_acks_in_commands() -> ServerSession:
    session = ServerSession(T0)
    init = hello(RID)
    session.receive(replace(init, metadata={ACKS_IN_COMMANDS: 1}), T0)
    session.registered(RID, 0, [], T0)
    return session


def test_a_held_ack_goes_in_the_commands_pushed_next() -> None:
    session = reading_acks_in_commands()
    session.receive(events(1, 2), T0)
    assert session.applied(2, hold=True) == []
    assert session.push([cmd(1)]) == [Send(ToClientCommands((cmd(1),), ack_events=2))]
    assert session.release_ack() == []  # taken: not sent twice
    assert session.push([cmd(2)]) == [Send(ToClientCommands((cmd(2),)))]


def test_a_held_ack_no_commands_took_is_sent_alone_on_release() -> None:
    session = reading_acks_in_commands()
    session.receive(events(1), T0)
    assert session.applied(1, hold=True) == []
    assert session.push([]) == []  # nothing to push: it is still held
    assert session.release_ack() == [Send(ToClientAckEvents(1))]
    assert session.release_ack() == []


def test_a_runner_that_does_not_read_acks_in_commands_is_acked_at_once() -> None:
    session = active()  # its Init says nothing of ACKS_IN_COMMANDS: it would miss the field
    session.receive(events(1), T0)
    assert session.applied(1, hold=True) == [Send(ToClientAckEvents(1))]
    assert session.push([cmd(1)]) == [Send(ToClientCommands((cmd(1),)))]
    assert session.release_ack() == []


def test_a_held_ack_is_dropped_with_the_socket() -> None:
    """The runner replays those events on its next socket; the store drops them by index."""
    session = reading_acks_in_commands()
    session.receive(events(1), T0)
    session.applied(1, hold=True)
    session.evict()
    assert session.release_ack() == []


# ---- commands acked, pings, liveness -------------------------------------------------------


def test_command_acks_are_persisted_only_when_they_advance() -> None:
    session = active()
    assert session.receive(ToServerAckCommands(0), T0) == []
    assert session.receive(ToServerAckCommands(3), T0) == [CommandsAcked(3)]
    assert session.receive(ToServerAckCommands(3), T0) == []
    assert session.receive(ToServerAckCommands(2), T0) == []


def test_ping_answers_pong_and_reports_alive() -> None:
    session = active()
    assert session.receive(ToServerPing(123.5), T0 + 1) == [
        Send(ToClientPong(123.5)),
        Alive(T0 + 1),
    ]


def test_init_timeout() -> None:
    session = ServerSession(T0, init_timeout_s=5)
    assert session.next_deadline() == T0 + 5
    assert session.tick(T0 + 4.9) == []
    assert session.tick(T0 + 5) == [Close(1008, "corral.init_timeout")]
    assert session.state is SessionState.CLOSED and session.next_deadline() is None


def test_registering_has_no_deadline() -> None:
    session = ServerSession(T0)
    session.receive(hello(), T0)
    assert session.next_deadline() is None and session.tick(T0 + 1000) == []


def test_a_silent_runner_is_lost() -> None:
    session = active(now=T0)
    assert session.next_deadline() == T0 + 15
    session.receive(ToServerPing(T0 + 10), T0 + 10)  # any frame pushes the deadline
    assert session.tick(T0 + 24.9) == []
    assert session.tick(T0 + 25) == [Close(1001, "corral.runner_lost")]


# ---- Shutdown ------------------------------------------------------------------------------


def test_stopping_marks_the_runner_draining_once() -> None:
    session = active()
    assert session.receive(ToServerStopping(), T0) == [Stopping()]
    assert session.state is SessionState.DRAINING
    assert session.receive(ToServerStopping(), T0) == []
    # A draining runner still reports and pings; commands (cancels) still reach it.
    assert session.receive(events(1), T0) == [Apply((event(1),))]
    assert session.push([cmd(1)]) == [Send(ToClientCommands((cmd(1),)))]


def test_drain_asks_the_runner_to_stop_its_work() -> None:
    session = active()
    assert session.drain(120.0) == [Send(ToClientDrain(120.0))]


def test_evict_tells_the_runner_then_closes() -> None:
    session = active()
    assert session.evict() == [
        Send(ToClientClose("corral.evicted")),
        Close(1000, "corral.evicted"),
    ]
    assert session.evict() == [] and session.stop() == []
    assert session.push([cmd(1)]) == [] and session.drain(1.0) == []


def test_stop_tells_the_runner_then_closes() -> None:
    session = active()
    assert session.stop() == [Send(ToClientClose("corral.stopped")), Close(1000, "corral.stopped")]
