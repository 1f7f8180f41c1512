"""The coordinator's pure end of one runner socket (``link_core.RunnerChannel``) and the
registry of sockets (``connections.Connections``): what the pump used to keep by hand.
The simulation (``tests/sim``) drives them through faults; these pin each rule alone."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from pydantic import TypeAdapter

from corral.actors.wire import ActorEvent
from corral.coordinator.connections import Connections
from corral.coordinator.link_core import (
    Applied,
    ApplyEvents,
    ChannelOutput,
    Pushed,
    PushWork,
    Registration,
    RunnerChannel,
    Wake,
    parse_events,
    ping_interval_s,
    wakeups,
)
from corral.coordinator.notifier import RUNS_AVAILABLE, actor_topic, runner_topic
from corral.coordinator.settings import CoordinatorSettings
from corral.ids import RunnerId
from corral.protocol import messages as wire
from corral.protocol.outputs import Close, Register, Send
from corral.protocol.runner import RunnerConnection
from corral.runners import RunnerState
from corral.store.actors import Changes
from corral.store.runners import Order

T0 = 1_000.0
RUNNER = RunnerId("rnr_000000000001")


def init(runner_id: RunnerId | None = None, last_command_idx: int = 0) -> wire.ToServerInit:
    return wire.ToServerInit(
        name="r",
        version="1",
        protocol_version=wire.PROTOCOL_VERSION,
        total_slots=2,
        last_command_idx=last_command_idx,
        runner_id=runner_id,
        labels=(),
        metadata={},
    )


def registered(missed: list[wire.Indexed] | None = None, seq: int = 1) -> RunnerChannel:
    channel = RunnerChannel.open(seq, T0, CoordinatorSettings())
    assert isinstance(channel.receive(init(), T0)[0], Register)
    channel.registered(Registration(RUNNER, 0, missed or []), T0)
    return channel


def finished(idx: int, run_id: str, attempt: int = 1) -> wire.Indexed:
    body = {"type": "finished", "run_id": run_id, "attempt": attempt, "status": "completed"}
    return wire.Indexed(idx, body)


def events(*items: wire.Indexed) -> wire.ToServerEvents:
    return wire.ToServerEvents(tuple(items))


def sent(outputs: list[ChannelOutput]) -> list[Any]:
    return [out.message for out in outputs if isinstance(out, Send)]


def test_registering_greets_the_runner_wakes_pollers_and_starts_the_push_loop() -> None:
    channel = RunnerChannel.open(1, T0, CoordinatorSettings())
    channel.receive(init(), T0)
    missed = [wire.Indexed(4, {"type": "cancel_run", "run_id": "run_1"})]
    out = channel.registered(Registration(RUNNER, 0, missed), T0)
    assert isinstance(sent(out)[0], wire.ToClientInit)
    assert Wake((RUNS_AVAILABLE,)) in out and PushWork() in out
    # The push loop sends from after the commands sent again at registration.
    assert channel.push_request().after == 4


def test_a_final_report_read_frees_its_slot_until_it_is_applied() -> None:
    channel = registered()
    out = channel.receive(events(finished(1, "run_1")), T0)
    (apply,) = [o for o in out if isinstance(o, ApplyEvents)]
    assert apply.last_idx == 1 and apply.events[0].type == "finished"
    assert PushWork() in out  # fill the slot while the report is committed
    assert channel.push_request().finishing == {("run_1", 1)}

    out = channel.applied(Applied(last_idx=1, abandon=[], wake=[], finished=True))
    assert channel.push_request().finishing == frozenset()
    assert sent(out) == [wire.ToClientAckEvents(1)]  # acknowledged once committed


def test_a_malformed_event_closes_the_socket_and_nothing_is_applied() -> None:
    channel = registered()
    bad = wire.Indexed(1, {"type": "logs", "run_id": "run_1", "attempt": 1})  # no lines
    out = channel.receive(events(bad), T0)
    assert not [o for o in out if isinstance(o, ApplyEvents)]
    assert (
        Close(wire.CLOSE_POLICY_VIOLATION, wire.protocol_error_reason(wire.MALFORMED_EVENT)) in out
    )


def test_a_frame_of_events_is_parsed_whole_and_a_malformed_one_named_by_its_index() -> None:
    started = {"type": "started", "run_id": "run_1", "attempt": 1}
    done = {"type": "finished", "run_id": "run_1", "attempt": 1, "status": "completed"}
    parsed = parse_events([wire.Indexed(4, started), wire.Indexed(5, done)])
    assert [type(e).__name__ for e in parsed] == ["StartedEvent", "FinishedEvent"]
    no_lines = {"type": "logs", "run_id": "run_1", "attempt": 1}
    frame = [wire.Indexed(4, started), wire.Indexed(5, no_lines), wire.Indexed(6, {"type": "x"})]
    with pytest.raises(wire.ProtocolError) as refused:
        parse_events(frame)
    assert refused.value.code == wire.MALFORMED_EVENT
    assert refused.value.reason == "event 5: logs.lines: Field required"


def test_the_cursor_moves_with_what_was_sent() -> None:
    channel = registered()
    cancel = wire.Indexed(1, {"type": "cancel_run", "run_id": "run_1"})
    out = channel.pushed(Pushed([cancel]))
    assert sent(out) == [wire.ToClientCommands((cancel,))]
    assert channel.push_request().after == 1  # the next push reads from after it
    assert not [o for o in out if isinstance(o, Wake)]  # it is the runner's newest socket


def test_a_replaced_socket_wakes_the_newest_for_commands_it_stored() -> None:
    channel = registered()
    late = wire.Indexed(1, {"type": "started", "run_id": "run_1", "attempt": 1})
    channel.receive(events(late), T0)  # being applied when a newer socket takes over
    channel.evict()
    abandon = [wire.Indexed(3, {"type": "abandon_run", "run_id": "run_1", "attempt": 1})]
    out = channel.applied(Applied(last_idx=1, abandon=abandon, wake=[], finished=False))
    assert Wake((runner_topic(RUNNER),)) in out


def test_a_drain_stops_claims() -> None:
    channel = registered()
    assert channel.push_request().claim
    out = channel.drain(30.0)
    assert sent(out) == [wire.ToClientDrain(30.0)]
    assert not channel.push_request().claim


def test_a_drain_asked_through_another_coordinator_is_passed_on_once() -> None:
    channel = registered()
    assert channel.ordered(Order(RunnerState.ACTIVE, None)) == []
    assert sent(channel.ordered(Order(RunnerState.DRAINING, 42.0))) == [wire.ToClientDrain(42.0)]
    assert not channel.push_request().claim
    assert channel.ordered(Order(RunnerState.DRAINING, 41.0)) == []  # told already


def test_a_drain_asked_here_is_not_sent_again_when_the_store_says_it() -> None:
    channel = registered()
    channel.drain(30.0)
    assert channel.ordered(Order(RunnerState.DRAINING, 30.0)) == []


def test_a_stop_asked_through_another_coordinator_closes_the_socket_for_good() -> None:
    channel = registered()
    out = channel.ordered(Order(RunnerState.STOPPED, None))
    assert sent(out) == [wire.ToClientClose(wire.REASON_STOPPED)]
    assert Close(wire.CLOSE_NORMAL, wire.REASON_STOPPED) in out


def test_a_drain_asked_while_the_runner_was_away_is_sent_after_its_greeting() -> None:
    channel = RunnerChannel.open(1, T0, CoordinatorSettings())
    channel.receive(init(), T0)
    out = channel.registered(Registration(RUNNER, 0, [], drain_grace_s=12.0), T0)
    assert [type(m) for m in sent(out)] == [wire.ToClientInit, wire.ToClientDrain]
    assert not channel.push_request().claim


def test_the_runner_is_stopped_for_good_only_if_it_said_so_and_then_left() -> None:
    channel = registered()
    channel.receive(wire.ToServerStopping(), T0)
    channel.disconnected(1006, None)  # the socket broke: it may come back
    assert not channel.stopped_for_good
    channel.disconnected(wire.CLOSE_NORMAL, wire.REASON_RUNNER_SHUTDOWN)
    assert channel.stopped_for_good


class Link:
    def __init__(self, seq: int) -> None:
        self.seq = seq


def test_the_newer_socket_wins_whichever_registers_first() -> None:
    connections = Connections()
    older, newer = Link(connections.accepted()), Link(connections.accepted())
    assert connections.take_over(RUNNER, older) is None  # type: ignore[arg-type]
    assert connections.take_over(RUNNER, newer) is older  # type: ignore[arg-type]
    # The older one's registration came back late: it is the one evicted.
    connections2 = Connections()
    older, newer = Link(connections2.accepted()), Link(connections2.accepted())
    assert connections2.take_over(RUNNER, newer) is None  # type: ignore[arg-type]
    assert connections2.take_over(RUNNER, older) is older  # type: ignore[arg-type]
    assert connections2.by_runner[RUNNER] is newer
    assert not connections2.forget(RUNNER, older)  # type: ignore[arg-type]
    assert connections2.forget(RUNNER, newer)  # type: ignore[arg-type]


def late(idx: int, run_id: str, kind: str = "finished") -> wire.Indexed:
    body = {"type": kind, "run_id": run_id, "attempt": 1, "former_runner_id": "rnr_old"}
    body.update({"status": "completed"} if kind == "finished" else {"lines": []})
    return wire.Indexed(idx, body)


def registered_announcing(late_reports: int) -> RunnerChannel:
    channel = RunnerChannel.open(1, T0, CoordinatorSettings())
    hello = init()
    announced = wire.ToServerInit(
        **{
            **{f: getattr(hello, f) for f in hello.__slots__},
            "metadata": {wire.LATE_REPORTS_TO_SEND: late_reports},
        }
    )
    channel.receive(announced, T0)
    channel.registered(Registration(RUNNER, 0, []), T0)
    return channel


def applied(last_idx: int) -> Applied:
    return Applied(last_idx=last_idx, abandon=[], wake=[], finished=True)


def test_a_runner_announcing_late_reports_claims_nothing_until_they_are_applied() -> None:
    """A run a late report ends is pending until the report is applied: the runner's new
    identity must not claim it back meanwhile (it would run finished work again)."""
    channel = registered_announcing(2)
    assert not channel.push_request().claim  # none read yet
    channel.receive(events(late(1, "run_1", "logs"), late(2, "run_1")), T0)
    assert not channel.push_request().claim  # one of two read, being applied
    channel.receive(events(late(3, "run_2")), T0)
    # Late reports free no slot of this identity: they are not counted as finishing.
    assert channel.push_request().finishing == frozenset()
    channel.applied(applied(2))
    assert not channel.push_request().claim
    out = channel.applied(applied(3))
    assert PushWork() in out and channel.push_request().claim


def test_a_frame_without_late_reports_ends_the_wait_for_them() -> None:
    """They come first: if the runner sends its own events instead (fewer were carried
    than announced, or the coordinator was not asked), none is to come."""
    channel = registered_announcing(3)
    channel.receive(events(finished(1, "run_9")), T0)
    channel.applied(applied(1))
    assert channel.push_request().claim


def test_late_reports_not_sent_within_a_lease_are_waited_for_no_longer() -> None:
    """A runner sends them first, right after its Init: one that announced some and, still
    pinging, sent none within a lease would otherwise never claim again."""
    channel = registered_announcing(2)
    lease = CoordinatorSettings().ws_lost_after_s
    assert channel.next_deadline() == T0 + lease
    channel.receive(wire.ToServerPing(ts=T0), T0 + lease / 2)  # alive: the session goes on
    assert channel.tick(T0 + lease - 0.1) == [] and not channel.push_request().claim
    assert channel.next_deadline() == T0 + lease  # before the session's own, now later
    assert channel.tick(T0 + lease) == [PushWork()]
    assert channel.push_request().claim
    assert channel.next_deadline() == T0 + lease * 1.5  # the session's alone again


def test_an_init_announcing_nothing_sensible_waits_for_nothing() -> None:
    for announced in (0, -1, "3", 10**9, True):
        assert registered_announcing(announced).push_request().claim  # type: ignore[arg-type]


def test_actor_reports_wake_their_followers_and_the_runners_given_commands() -> None:
    """What the store did decides (``Changes``): a report that an actor runs makes no
    command and wakes no push loop; an intent's stop command wakes the runner's; a stop
    that placed an actor on another runner wakes that runner's."""

    def event(**fields: Any) -> ActorEvent:
        body = {"actor_id": "act_1", "generation": 1, **fields}
        return TypeAdapter(ActorEvent).validate_python(body)  # type: ignore[no-any-return]

    running = event(type="actor_state", state="running")
    assert wakeups([running], [], Changes({"act_1"})) == [actor_topic("act_1")]
    intent = event(type="actor_intent", intent="sleep")
    stop_sent = Changes({"act_1"}, {RUNNER})
    assert wakeups([running, intent], [], stop_sent) == [actor_topic("act_1"), runner_topic(RUNNER)]
    stopped = event(type="actor_state", state="stopped", code=0)
    placed_elsewhere = Changes({"act_1", "act_2"}, {"rnr_other"})
    assert wakeups([stopped], [], placed_elsewhere) == [
        actor_topic("act_1"),
        actor_topic("act_2"),
        runner_topic("rnr_other"),
    ]


def greeting(channel: RunnerChannel) -> wire.ToClientInit:
    channel.receive(init(), T0)
    hello = sent(channel.registered(Registration(RUNNER, 0, []), T0))[0]
    assert isinstance(hello, wire.ToClientInit)
    return hello


def test_runners_joining_a_crowded_coordinator_are_told_to_ping_less_often() -> None:
    settings = CoordinatorSettings()  # pings every 3 s, lost after 20 s

    def told(sockets: int) -> float:
        hello = greeting(RunnerChannel.open(1, T0, settings, sockets=sockets))
        return float(hello.metadata["ping_interval"])

    # Up to 1,000 pings a second at 3 s each; then longer, up to 5 s.
    assert [told(n) for n in (0, 3_000, 4_000, 5_000, 100_000)] == [3.0, 3.0, 4.0, 5.0, 5.0]
    # Never past a quarter of the lost threshold, never below the configured interval.
    assert ping_interval_s(CoordinatorSettings(ws_lost_after_s=14.0), 100_000) == 3.5
    assert ping_interval_s(CoordinatorSettings(ws_ping_interval_s=8.0), 100_000) == 8.0


def test_a_runner_told_the_longest_interval_is_never_taken_for_lost() -> None:
    """The runner's own pacing (its lease and silence window) and the coordinator's lost
    threshold agree at the longest interval: a minute of pings, less often, none late."""
    channel = RunnerChannel.open(1, T0, CoordinatorSettings(), sockets=100_000)
    runner = RunnerConnection(
        name="runner",
        version="1",
        total_slots=2,
        labels=(),
        metadata={},
        rng=random.Random(0),
        stop_margin_s=11.0,  # a runner's default: its kill grace and a second
    )
    runner.connect(T0)
    runner.receive(greeting(channel), T0)
    pings, now = [], T0
    while now < T0 + 60:
        now += 0.25
        for out in runner.tick(now):
            assert isinstance(out, Send), out  # never a reconnect or a stop of its work
            if isinstance(out.message, wire.ToServerPing):
                pings.append(now)
                answer = channel.receive(out.message, now)
                pong = sent(answer)[0]
                assert isinstance(pong, wire.ToClientPong)
                runner.receive(pong, now)
        assert not any(isinstance(out, Close) for out in channel.tick(now))
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    # Less often than every 3 s: within a third of its lease (20 s less its stop margin).
    assert min(gaps) > 4.0 and max(gaps) <= 5.0 and len(pings) >= 12


def test_a_final_report_applied_asks_for_no_second_round() -> None:
    """Its slot was filled when the report was read: the socket waits for new runs while
    the report is committed, not in a second claim."""
    channel = registered()
    assert PushWork() in channel.receive(events(finished(1, "run_1")), T0)
    out = channel.applied(Applied(last_idx=1, abandon=[], wake=[], finished=True))
    assert PushWork() not in out
