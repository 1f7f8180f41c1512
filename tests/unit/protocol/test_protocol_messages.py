"""The runner-link codec (``corral.protocol.messages``): every message survives a round trip,
and every malformed frame is refused with its stable ``ProtocolError`` code."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest

from corral.errors import CorralError
from corral.ids import RunnerId
from corral.protocol.messages import (
    MALFORMED_FRAME,
    PROTOCOL_VERSION,
    UNKNOWN_MESSAGE,
    UNSUPPORTED_VERSION,
    Indexed,
    Message,
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
    decode,
    encode,
    protocol_error_reason,
)
from corral.protocol.replay import ReplayBuffer

START = Indexed(1, {"type": "start_run", "run": {"id": "run_0123456789ab", "prompt": "hi"}})
CANCEL = Indexed(2, {"type": "cancel_run", "run_id": "run_0123456789ab"})
STARTED = Indexed(7, {"type": "started", "run_id": "run_0123456789ab", "attempt": 1})

TO_SERVER: list[Message] = [
    ToServerInit(
        name="host-a",
        version="0.1.0",
        protocol_version=PROTOCOL_VERSION,
        total_slots=4,
        last_command_idx=12,
        runner_id=RunnerId("rnr_000000000001"),
        labels=("gpu", "linux"),
        metadata={"hostname": "host-a", "nested": {"x": [1, 2]}},
    ),
    ToServerInit("host-b", "0.1.0", 1, 1, 0, None, (), {}),
    ToServerEvents((STARTED, Indexed(8, {"type": "logs", "run_id": "r", "data": "é\n"}))),
    ToServerEvents(()),
    ToServerAckCommands(12),
    ToServerPing(1_700_000_000.25),
    ToServerStopping(),
]
TO_CLIENT: list[Message] = [
    ToClientInit(RunnerId("rnr_1"), 7, {"runner_lost_threshold": 15.0, "ping_interval": 3}),
    ToClientCommands((START, CANCEL)),
    ToClientCommands((START,), ack_events=7),
    ToClientAckEvents(7),
    ToClientPong(1_700_000_000.25),
    ToClientDrain(120.0),
    ToClientClose("corral.evicted"),
]
SAMPLES = [("server", m) for m in TO_SERVER] + [("client", m) for m in TO_CLIENT]


def frame(type_: str, **fields: Any) -> str:
    return json.dumps({"v": 1, "type": type_, **fields})


def init_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": "h",
        "version": "1",
        "protocol_version": 1,
        "total_slots": 1,
        "last_command_idx": 0,
        "runner_id": None,
        "labels": [],
        "metadata": {},
    }
    return {**fields, **overrides}


def expect(code: str, text: str | bytes, side: Literal["server", "client"] = "server") -> None:
    with pytest.raises(ProtocolError) as caught:
        decode(text, side=side)
    assert caught.value.code == code, caught.value.reason


# ---- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize(("side", "message"), SAMPLES, ids=lambda x: type(x).__name__)
def test_every_message_round_trips(side: Literal["server", "client"], message: Message) -> None:
    text = encode(message)
    assert decode(text, side=side) == message
    assert decode(text.encode(), side=side) == message  # bytes frames too


@pytest.mark.parametrize(
    "ts", [1_700_000_000.25, 1795715547.4722311, 0.1, 1e-7, 1e22, 3, -2.5, 5e-324]
)
def test_a_pong_is_written_as_json_would_write_it(ts: float) -> None:
    """Pongs take a shortcut (they are most of the frames a coordinator sends)."""
    expected = json.dumps(
        {"v": PROTOCOL_VERSION, "type": "ToClientPong", "ts": ts},
        separators=(",", ":"),
        allow_nan=False,
    )
    assert encode(ToClientPong(ts)) == expected
    assert decode(expected, side="client") == ToClientPong(float(ts))


def test_commands_as_stored_are_sent_as_json_would_write_them() -> None:
    """Commands the store kept as JSON are written around it, not encoded again: the same
    bytes, and the runner reads the same commands."""
    bodies = [START.body, CANCEL.body, {"type": "start_run", "run": {"prompt": 'é " \n'}}]
    plain = ToClientCommands(tuple(Indexed(n, b) for n, b in enumerate(bodies, 1)))
    stored = ToClientCommands(
        tuple(Indexed(n, b, json.dumps(b, separators=(",", ":"))) for n, b in enumerate(bodies, 1))
    )
    assert encode(stored) == encode(plain)
    assert decode(encode(stored), side="client") == plain
    # What goes out is the stored JSON itself, not the body encoded again.
    sent = encode(ToClientCommands((Indexed(1, {"type": "a"}, '{"type":"b"}'),)))
    assert decode(sent, side="client") == ToClientCommands((Indexed(1, {"type": "b"}),))
    # Unless every command has its JSON, the frame is encoded as any other.
    mixed = ToClientCommands((stored.commands[0], plain.commands[1]))
    assert encode(mixed) == encode(ToClientCommands(plain.commands[:2]))


def test_an_ack_in_commands_is_written_as_json_would_write_it() -> None:
    """Both ways of writing the frame agree; without an acknowledgement it is the frame an
    older runner knows, byte for byte (no ``ack_events`` field)."""
    stored = Indexed(1, START.body, json.dumps(START.body, separators=(",", ":")))
    for ack in (0, 9):
        as_json = json.dumps(
            {"v": 1, "type": "ToClientCommands", "commands": [{"idx": 1, "body": START.body}]}
            | ({"ack_events": ack} if ack else {}),
            separators=(",", ":"),
        )
        assert encode(ToClientCommands((stored,), ack)) == as_json
        assert encode(ToClientCommands((Indexed(1, START.body),), ack)) == as_json
        assert decode(as_json, side="client") == ToClientCommands((Indexed(1, START.body),), ack)


def test_events_the_replay_buffer_encoded_are_sent_as_json_would_write_them() -> None:
    """The runner encodes an event once (its size, then its frame): the same bytes as an
    event encoded with its frame, and the coordinator reads the same events."""
    buffer = ReplayBuffer()
    bodies = [STARTED.body, {"type": "logs", "lines": [{"text": 'é " \n \ud800'}]}]
    appended = buffer.append(bodies)
    assert all(event.encoded is not None for event in appended)
    plain = ToServerEvents(tuple(Indexed(e.idx, e.body) for e in appended))
    (frame,) = buffer.frames()
    assert encode(frame) == encode(plain)
    assert decode(encode(frame), side="server") == plain
    sent = encode(ToServerEvents((Indexed(1, {"type": "a"}, '{"type":"b"}'),)))
    assert decode(sent, side="server") == ToServerEvents((Indexed(1, {"type": "b"}),))
    with pytest.raises(ValueError):  # not JSON: refused before it is numbered
        buffer.append([{"type": "x", "value": float("nan")}])
    assert [e.idx for e in buffer.append([{"type": "next"}])] == [3]


@pytest.mark.parametrize(("side", "message"), SAMPLES, ids=lambda x: type(x).__name__)
def test_wire_shape_is_versioned_and_tagged(
    side: Literal["server", "client"], message: Message
) -> None:
    wire = json.loads(encode(message))
    assert wire["v"] == PROTOCOL_VERSION == 1
    assert wire["type"] == type(message).__name__


def test_wire_fields_are_plain_json() -> None:
    wire = json.loads(encode(TO_SERVER[0]))
    assert wire["labels"] == ["gpu", "linux"]
    assert wire["runner_id"] == "rnr_000000000001"
    events = json.loads(encode(ToServerEvents((STARTED,))))["events"]
    assert events == [{"idx": 7, "body": STARTED.body}]


@pytest.mark.parametrize("message", TO_SERVER, ids=lambda m: type(m).__name__)
def test_the_client_refuses_messages_for_the_server(message: Message) -> None:
    expect(UNKNOWN_MESSAGE, encode(message), side="client")


@pytest.mark.parametrize("message", TO_CLIENT, ids=lambda m: type(m).__name__)
def test_the_server_refuses_messages_for_the_client(message: Message) -> None:
    expect(UNKNOWN_MESSAGE, encode(message), side="server")


def test_unknown_extra_fields_are_ignored() -> None:
    assert decode(frame("ToServerPing", ts=1.0, later="x"), side="server") == ToServerPing(1.0)


def test_an_integer_timestamp_is_a_float() -> None:
    message = decode(frame("ToServerPing", ts=5), side="server")
    assert message == ToServerPing(5.0)
    assert isinstance(message, ToServerPing) and type(message.ts) is float


# ---- malformed frames ----------------------------------------------------------------------

EVENT = {"idx": 1, "body": {"type": "started"}}
MALFORMED: dict[str, str | bytes] = {
    "not JSON": "{not json",
    "empty": "",
    "not UTF-8": b'{"v":1,"type":"ToServerStopping","x":"\xff"}',
    "array": "[1, 2]",
    "string": '"ToServerPing"',
    "null": "null",
    "NaN literal": '{"v":1,"type":"ToServerPing","ts":NaN}',
    "infinite number": '{"v":1,"type":"ToServerPing","ts":1e999}',
    "missing v": json.dumps({"type": "ToServerStopping"}),
    "v as string": json.dumps({"v": "1", "type": "ToServerStopping"}),
    "v as bool": json.dumps({"v": True, "type": "ToServerStopping"}),
    "missing type": json.dumps({"v": 1}),
    "type not a string": json.dumps({"v": 1, "type": 3}),
    "missing field": frame("ToServerAckCommands"),
    "idx as string": frame("ToServerAckCommands", last_command_idx="3"),
    "idx as float": frame("ToServerAckCommands", last_command_idx=3.0),
    "idx as bool": frame("ToServerAckCommands", last_command_idx=True),
    "negative ack idx": frame("ToServerAckCommands", last_command_idx=-1),
    "ts as string": frame("ToServerPing", ts="now"),
    "ts as bool": frame("ToServerPing", ts=False),
    "events not a list": frame("ToServerEvents", events={"idx": 1}),
    "event not an object": frame("ToServerEvents", events=[1]),
    "event without idx": frame("ToServerEvents", events=[{"body": {"type": "x"}}]),
    "negative event idx": frame("ToServerEvents", events=[{**EVENT, "idx": -1}]),
    "event idx zero": frame("ToServerEvents", events=[{**EVENT, "idx": 0}]),
    "event body not an object": frame("ToServerEvents", events=[{"idx": 1, "body": []}]),
    "event body without type": frame("ToServerEvents", events=[{"idx": 1, "body": {}}]),
    "event body type not str": frame("ToServerEvents", events=[{"idx": 1, "body": {"type": 1}}]),
    "init missing labels": frame(
        "ToServerInit", **{k: v for k, v in init_fields().items() if k != "labels"}
    ),
    "init labels not strings": frame("ToServerInit", **init_fields(labels=["a", 1])),
    "init labels a string": frame("ToServerInit", **init_fields(labels="gpu")),
    "init metadata a list": frame("ToServerInit", **init_fields(metadata=[])),
    "init runner_id a number": frame("ToServerInit", **init_fields(runner_id=5)),
    "init name null": frame("ToServerInit", **init_fields(name=None)),
    "init negative slots": frame("ToServerInit", **init_fields(total_slots=-1)),
    "init negative last_command_idx": frame("ToServerInit", **init_fields(last_command_idx=-2)),
    "init protocol_version zero": frame("ToServerInit", **init_fields(protocol_version=0)),
}
MALFORMED_FOR_CLIENT: dict[str, str] = {
    "init runner_id null": frame("ToClientInit", runner_id=None, last_event_idx=0, metadata={}),
    "init negative last_event_idx": frame(
        "ToClientInit", runner_id="r", last_event_idx=-1, metadata={}
    ),
    "command idx negative": frame(
        "ToClientCommands", commands=[{"idx": -5, "body": {"type": "cancel_run"}}]
    ),
    "commands' ack_events negative": frame("ToClientCommands", commands=[], ack_events=-1),
    "commands' ack_events a bool": frame("ToClientCommands", commands=[], ack_events=True),
    "negative drain grace": frame("ToClientDrain", grace_s=-1),
    "close reason missing": frame("ToClientClose"),
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_are_refused(text: str | bytes) -> None:
    expect(MALFORMED_FRAME, text, side="server")


@pytest.mark.parametrize("text", MALFORMED_FOR_CLIENT.values(), ids=MALFORMED_FOR_CLIENT.keys())
def test_malformed_frames_to_the_client_are_refused(text: str) -> None:
    expect(MALFORMED_FRAME, text, side="client")


def test_unknown_types_are_refused() -> None:
    expect(UNKNOWN_MESSAGE, frame("ToServerTeleport"), side="server")
    expect(UNKNOWN_MESSAGE, frame("toserverping", ts=1.0), side="server")


def test_another_envelope_version_is_refused() -> None:
    expect(UNSUPPORTED_VERSION, json.dumps({"v": 2, "type": "ToServerStopping"}))
    expect(UNSUPPORTED_VERSION, json.dumps({"v": 0, "type": "ToClientPong", "ts": 1}), "client")


def test_an_init_from_a_future_protocol_is_refused() -> None:
    expect(UNSUPPORTED_VERSION, frame("ToServerInit", **init_fields(protocol_version=2)))


def test_protocol_errors_carry_a_stable_code() -> None:
    error = ProtocolError(MALFORMED_FRAME, "not JSON")
    assert isinstance(error, CorralError)
    assert (error.code, error.reason, error.message) == ("malformed_frame", "not JSON", "not JSON")
    assert protocol_error_reason("expected_init") == "corral.protocol_error:expected_init"


def test_a_50_event_batch_round_trips() -> None:
    body = {"type": "logs", "run_id": "run_0123456789ab", "attempt": 1, "data": "x" * 200}
    batch = ToServerEvents(tuple(Indexed(i, dict(body, seq=i)) for i in range(1, 51)))
    assert decode(encode(batch), side="server") == batch


def _init_frame(**extra: Any) -> dict[str, Any]:
    return {
        "v": PROTOCOL_VERSION, "type": "ToServerInit", "name": "r", "version": "1",
        "protocol_version": PROTOCOL_VERSION, "total_slots": 2, "last_command_idx": 0,
        "runner_id": None, "labels": [], "metadata": {}, **extra,
    }  # fmt: skip


def test_an_init_without_actor_fields_hosts_no_actors() -> None:
    init = decode(json.dumps(_init_frame()), side="server")
    assert isinstance(init, ToServerInit)
    assert (init.actor_names, init.pool, init.actor_slots) == ((), "default", 0)


def test_an_init_advertising_actors_round_trips_and_is_checked() -> None:
    hosting = ToServerInit(
        "r", "1", PROTOCOL_VERSION, 2, 0, None, (), {}, ("agent", "echo"), "gpu", 8
    )
    assert decode(encode(hosting), side="server") == hosting
    for bad, code in (
        ({"actor_names": ["ok", 3]}, MALFORMED_FRAME),
        ({"actor_slots": -1}, MALFORMED_FRAME),
        ({"actor_slots": 10**6}, "invalid_init"),
        ({"pool": ""}, "invalid_init"),
        ({"actor_names": ["a\nb"]}, "invalid_init"),
    ):
        with pytest.raises(ProtocolError) as refused:
            decode(json.dumps(_init_frame(**bad)), side="server")
        assert refused.value.code == code, bad
