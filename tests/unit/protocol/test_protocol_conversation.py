"""A ``RunnerConnection`` and a ``ServerSession`` talking through an in-memory pipe, with the
test as both pumps and a dict as the store: every frame goes through the JSON codec, sockets
drop mid-way, the runner reconnects with missed commands and unacknowledged events, and in
the end every command ran exactly once and every event was applied exactly once."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from corral.ids import RunnerId
from corral.protocol.messages import (
    REASON_RUNNER_SHUTDOWN,
    Indexed,
    ToClientCommands,
    ToServerEvents,
    ToServerInit,
    decode,
    encode,
)
from corral.protocol.outputs import (
    Alive,
    Apply,
    Close,
    Closed,
    CommandsAcked,
    Connected,
    Disconnected,
    DrainRequested,
    Execute,
    Reconnect,
    Register,
    Send,
    StopAllWork,
    Stopping,
)
from corral.protocol.runner import ConnectionState, RunnerConnection
from corral.protocol.server import ServerSession

T0 = 1_000.0


@dataclass
class RunnerRow:
    commands: list[Indexed] = field(default_factory=list)
    acked_command_idx: int = 0
    applied: list[Indexed] = field(default_factory=list)
    alive_at: float = 0.0
    draining: bool = False
    stopped: bool = False  # the coordinator gave up on this identity

    @property
    def last_event_idx(self) -> int:
        return self.applied[-1].idx if self.applied else 0


class Store:
    """The coordinator's database, reduced to what the protocol needs."""

    def __init__(self) -> None:
        self.runners: dict[RunnerId, RunnerRow] = {}

    def register(self, init: ToServerInit) -> tuple[RunnerId, int, list[Indexed]]:
        row = self.runners.get(init.runner_id) if init.runner_id else None
        runner_id = init.runner_id
        if runner_id is None or row is None or row.stopped:
            runner_id = RunnerId(f"rnr_{len(self.runners) + 1:012d}")
            row = self.runners[runner_id] = RunnerRow()
        unacked = [c for c in row.commands if c.idx > row.acked_command_idx]
        return runner_id, row.last_event_idx, unacked

    def add_command(self, runner_id: RunnerId, body: dict[str, Any]) -> Indexed:
        row = self.runners[runner_id]
        command = Indexed(len(row.commands) + 1, body)
        row.commands.append(command)
        return command

    def apply(self, runner_id: RunnerId, events: tuple[Indexed, ...]) -> None:
        row = self.runners[runner_id]
        for event in events:
            # Applied exactly once, in order: the session must never hand out an old index.
            assert event.idx > row.last_event_idx, (event, row.last_event_idx)
            row.applied.append(event)


class World:
    """One runner process, the coordinator's store, and at most one socket between them."""

    def __init__(self, *, repeat_frames: bool = False) -> None:
        self.now = T0
        self.store = Store()
        self.runner = RunnerConnection(
            name="host-a",
            version="0.1.0",
            total_slots=2,
            labels=(),
            metadata={},
            rng=random.Random(42),
        )
        self.session: ServerSession | None = None
        self.session_runner: RunnerId | None = None
        self.to_server: deque[str] = deque()
        self.to_client: deque[str] = deque()
        self.reachable = True
        self.repeat_frames = repeat_frames  # resend every command/event frame (a buggy peer)
        self.executed: list[tuple[RunnerId | None, Indexed]] = []
        self.app: list[Any] = []  # what the runner told its app, apart from Execute

    # ---- the runner's pump -----------------------------------------------------------------

    def on_runner(self, outputs: list[Any]) -> None:
        for output in outputs:
            if isinstance(output, Send):
                if self.session is not None:
                    self.to_server.append(encode(output.message))
                    if self.repeat_frames and isinstance(output.message, ToServerEvents):
                        self.to_server.append(encode(output.message))
            elif isinstance(output, Execute):
                self.executed.append((self.runner.runner_id, output.command))
                # The app starts the run and reports it: one event per command.
                report = {"type": "started", "command": output.command.idx}
                self.on_runner(self.runner.send_event(report, self.now))
            elif isinstance(output, Reconnect):
                self.open_socket()
            else:
                self.app.append(output)
                if isinstance(output, Closed):
                    self.drop_socket()

    def open_socket(self) -> None:
        self.session = ServerSession(self.now)
        self.on_runner(self.runner.connect(self.now))
        if not self.reachable:
            self.session = None
            self.to_server.clear()
            self.on_runner(self.runner.connect_failed(self.now))

    def report(self, body: dict[str, Any]) -> None:
        self.on_runner(self.runner.send_event(body, self.now))

    # ---- the coordinator's pump ------------------------------------------------------------

    def on_server(self, outputs: list[Any]) -> None:
        session = self.session
        assert session is not None
        for output in outputs:
            row = self.store.runners.get(self.session_runner)  # type: ignore[arg-type]
            if isinstance(output, Send):
                self.to_client.append(encode(output.message))
                if self.repeat_frames and isinstance(output.message, ToClientCommands):
                    self.to_client.append(encode(output.message))
            elif isinstance(output, Register):
                runner_id, last_event_idx, unacked = self.store.register(output.init)
                self.session_runner = runner_id
                self.on_server(session.registered(runner_id, last_event_idx, unacked, self.now))
            elif isinstance(output, Apply):
                assert self.session_runner is not None
                self.store.apply(self.session_runner, output.events)
                self.on_server(session.applied(output.events[-1].idx))
            elif isinstance(output, CommandsAcked):
                assert row is not None
                row.acked_command_idx = output.last_command_idx
            elif isinstance(output, Alive):
                assert row is not None
                row.alive_at = output.now
            elif isinstance(output, Stopping):
                assert row is not None
                row.draining = True
            elif isinstance(output, Close):
                # A clean close: frames already written reach the runner, then the socket ends.
                self.session = None
                self.to_server.clear()
                while self.to_client:
                    self.on_runner(self.runner.receive(self.pop_to_client(), self.now))
                self.on_runner(self.runner.socket_closed(self.now))
            else:
                raise AssertionError(output)

    def push(self, body: dict[str, Any], runner_id: RunnerId | None = None) -> Indexed:
        """Store a command durably, then push it on the socket if the runner has one."""
        target = runner_id or self.session_runner
        assert target is not None
        command = self.store.add_command(target, body)
        if self.session is not None and self.session_runner == target:
            self.on_server(self.session.push([command]))
        return command

    # ---- the pipe --------------------------------------------------------------------------

    def pop_to_client(self) -> Any:
        return decode(self.to_client.popleft(), side="client")

    def step_server(self) -> None:
        assert self.session is not None
        message = decode(self.to_server.popleft(), side="server")
        self.on_server(self.session.receive(message, self.now))

    def step_client(self) -> None:
        self.on_runner(self.runner.receive(self.pop_to_client(), self.now))

    def pump(self) -> None:
        while self.session is not None and (self.to_server or self.to_client):
            if self.to_server:
                self.step_server()
            if self.to_client and self.session is not None:
                self.step_client()

    def drop_socket(self) -> None:
        """The network drops the socket: frames in flight are lost, both ends notice."""
        self.session = None
        self.to_server.clear()
        self.to_client.clear()
        self.on_runner(self.runner.socket_closed(self.now))

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        for _ in range(10_000):
            deadlines = [self.runner.next_deadline()]
            if self.session is not None:
                deadlines.append(self.session.next_deadline())
            due = [d for d in deadlines if d is not None and d <= end]
            if not due:
                break
            self.now = max(self.now, min(due))
            self.on_runner(self.runner.tick(self.now))
            if self.session is not None:
                self.on_server(self.session.tick(self.now))
            self.pump()
        self.now = end


def start(world: World, run: str) -> Indexed:
    return world.push({"type": "start_run", "run": {"id": run}})


@pytest.mark.parametrize("repeat_frames", [False, True], ids=["plain", "repeated-frames"])
def test_a_disconnect_mid_conversation_loses_and_repeats_nothing(repeat_frames: bool) -> None:
    world = World(repeat_frames=repeat_frames)
    runner = world.runner
    world.open_socket()
    world.pump()
    rid = runner.runner_id
    assert rid is not None and runner.state is ConnectionState.ACTIVE
    row = world.store.runners[rid]

    start(world, "run_1")
    start(world, "run_2")
    world.pump()
    assert not runner.unacked_events  # both "started" events applied and acknowledged
    world.advance(300)  # pings keep the session alive; the periodic ack goes out
    assert row.acked_command_idx == 2 and row.alive_at > T0

    # Mid-way: command 3 arrives and its event is applied, but the ack is lost with the
    # socket; command 4 was stored and pushed but never arrived.
    start(world, "run_3")
    world.step_client()
    world.step_server()
    start(world, "run_4")
    world.drop_socket()
    assert [e.idx for e in runner.unacked_events] == [3]
    assert row.last_event_idx == 3

    # While disconnected: the coordinator stores a cancel, the app logs a line.
    world.push({"type": "cancel_run", "run_id": "run_1"}, rid)
    world.report({"type": "logs", "run_id": "run_3", "data": "still working"})
    assert [e.idx for e in runner.unacked_events] == [3, 4]

    world.advance(10)  # the backoff (1-1.25 s) passes: reconnect, resync, carry on
    assert runner.runner_id == rid
    assert [c.idx for _, c in world.executed] == [1, 2, 3, 4, 5]  # once each, in order
    assert [e.idx for e in row.applied] == [1, 2, 3, 4, 5, 6]
    assert [e.body.get("command") for e in row.applied] == [1, 2, 3, None, 4, 5]
    world.advance(300)
    assert row.acked_command_idx == 5 and runner.unacked_events == ()
    assert world.app == [Connected(rid, fresh=True), Disconnected(), Connected(rid, fresh=False)]


def test_a_runner_lost_for_too_long_starts_over_under_a_new_identity() -> None:
    world = World()
    runner = world.runner
    world.open_socket()
    world.pump()
    old = runner.runner_id
    assert old is not None
    start(world, "run_1")
    world.pump()

    world.reachable = False
    world.drop_socket()
    world.report({"type": "finished", "run_id": "run_1", "attempt": 1})  # never delivered
    world.advance(20)
    assert world.app.count(StopAllWork()) == 1  # at the lost threshold, 15 s after the drop
    world.store.runners[old].stopped = True  # the coordinator's reconciler gave up on it

    world.reachable = True
    world.advance(60)
    new = runner.runner_id
    assert new is not None and new != old
    assert world.app.count(StopAllWork()) == 1  # not again on the identity change
    assert world.app[-1] == Connected(new, fresh=True, carried=((2, 1),))
    # The old identity's final report goes on as a late report, naming the identity that
    # held the attempt (the coordinator decides whether the run still takes it).
    late = {"type": "finished", "run_id": "run_1", "attempt": 1, "former_runner_id": old}
    assert world.store.runners[new].applied == [Indexed(1, late)]
    assert runner.unacked_events == ()

    start(world, "run_9")
    world.pump()
    assert [(who, c.idx) for who, c in world.executed] == [(old, 1), (new, 1)]
    assert [e.idx for e in world.store.runners[new].applied] == [1, 2]


def test_an_evicted_runner_stays_away() -> None:
    world = World()
    world.open_socket()
    world.pump()
    assert world.session is not None
    world.on_server(world.session.evict())
    assert world.app[-1] == Closed("corral.evicted", reconnect=False)
    world.advance(600)
    assert world.runner.state is ConnectionState.CLOSED and world.session is None


def test_drain_then_graceful_shutdown() -> None:
    world = World()
    world.open_socket()
    world.pump()
    rid = world.runner.runner_id
    assert world.session is not None and rid is not None
    start(world, "run_1")
    world.pump()

    world.on_server(world.session.drain(120.0))
    world.pump()
    assert world.app[-1] == DrainRequested(120.0)
    world.on_runner(world.runner.stopping(world.now))
    world.pump()
    assert world.store.runners[rid].draining
    world.report({"type": "finished", "run_id": "run_1", "attempt": 1})
    world.pump()
    world.on_runner(world.runner.shutdown(world.now))
    assert world.app[-1] == Closed(REASON_RUNNER_SHUTDOWN, reconnect=False)
    assert [e.body["type"] for e in world.store.runners[rid].applied] == ["started", "finished"]
    world.advance(600)
    assert world.session is None and world.runner.state is ConnectionState.CLOSED
