"""The runner sockets' one timer (``coordinator.deadlines``), driven by a fake clock."""

from __future__ import annotations

import asyncio

from corral.clock import FakeClock
from corral.coordinator.deadlines import RECHECK_S, SocketDeadlines
from corral.ids import RunnerId
from corral.protocol.messages import PROTOCOL_VERSION, ToServerInit, ToServerPing
from corral.protocol.server import ServerSession

LOST_S = 20.0


class Socket:
    """A socket as the timer sees it: a session, ticked; it closes when its time is up."""

    def __init__(self, clock: FakeClock) -> None:
        self.session = ServerSession(clock.now(), lost_threshold_s=LOST_S)
        self.closed = asyncio.Event()
        self.ticks = 0

    def tick(self, now: float) -> float | None:
        self.ticks += 1
        if self.session.tick(now):
            self.closed.set()
            return None
        return self.session.next_deadline()


def test_a_socket_silent_past_its_init_deadline_is_closed_and_others_are_not_ticked() -> None:
    clock = FakeClock()
    deadlines = SocketDeadlines(clock)
    silent, others = Socket(clock), [Socket(clock) for _ in range(1000)]
    deadlines.add(silent, silent.session.next_deadline())
    clock.advance(4.0)
    for other in others:  # they opened later: their Init is due later
        other.session = ServerSession(clock.now(), lost_threshold_s=LOST_S)
        deadlines.add(other, other.session.next_deadline())
    assert deadlines.tick(clock.now()) == 0
    clock.advance(1.0)
    assert deadlines.tick(clock.now()) == 1
    assert silent.closed.is_set() and len(deadlines) == 1000
    assert all(o.ticks == 0 for o in others)


def test_frames_read_move_the_deadline_on_without_touching_the_timer() -> None:
    clock = FakeClock()
    deadlines = SocketDeadlines(clock)
    sockets = [Socket(clock) for _ in range(3)]
    for socket in sockets:
        socket.session.receive(init(), clock.now())
        socket.session.registered(RunnerId("r"), 0, [], clock.now())
        deadlines.add(socket, socket.session.next_deadline())
    pinging, silent = sockets[:2], sockets[2]
    # Pinging every 3 s for a minute: each one is looked at once per threshold, not per ping.
    for _ in range(20):
        clock.advance(3.0)
        for socket in pinging:
            socket.session.receive(ping(clock.now()), clock.now())
        deadlines.tick(clock.now())
    assert silent.closed.is_set()
    assert not any(s.closed.is_set() for s in pinging)
    assert all(s.ticks <= 3 for s in pinging), [s.ticks for s in pinging]
    assert len(deadlines) == 2  # the closed one left the heap


def test_a_socket_without_a_deadline_is_looked_at_again_within_the_recheck() -> None:
    clock = FakeClock()
    deadlines = SocketDeadlines(clock)
    socket = Socket(clock)
    deadlines.add(socket, None)
    assert deadlines.next_wait(clock.now()) == RECHECK_S
    clock.advance(RECHECK_S)
    assert deadlines.tick(clock.now()) == 1


def test_a_tick_that_fails_keeps_the_socket_on_the_timer() -> None:
    clock = FakeClock()
    deadlines = SocketDeadlines(clock)

    class Broken(Socket):
        def tick(self, now: float) -> float | None:
            super().tick(now)
            raise RuntimeError("boom")

    broken = Broken(clock)
    deadlines.add(broken, clock.now())
    assert deadlines.tick(clock.now()) == 1
    clock.advance(RECHECK_S)
    assert deadlines.tick(clock.now()) == 1 and broken.ticks == 2


def init() -> ToServerInit:
    return ToServerInit(
        name="r",
        version="test",
        protocol_version=PROTOCOL_VERSION,
        total_slots=1,
        last_command_idx=0,
        runner_id=None,
        labels=(),
        metadata={},
    )


def ping(now: float) -> ToServerPing:
    return ToServerPing(now)
