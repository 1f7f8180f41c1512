"""The tunnel across the link, pure: its wire format, the ledger (numbering, acknowledgements,
window, rewind, duplicates, gaps, orphans), the runner's connection keeping its replies
through a disconnection and the coordinator's session handing tunnel messages on."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from corral.ids import RunnerId
from corral.protocol.limits import MAX_TUNNEL_CHUNK_BYTES
from corral.protocol.messages import (
    MALFORMED_FRAME,
    TUNNEL_END,
    TUNNEL_GAP,
    TUNNEL_STARTING,
    TUNNEL_WITH,
    ProtocolError,
    ToClientInit,
    ToClientRequestAbort,
    ToClientRequestChunk,
    ToClientRequestEnd,
    ToClientRequestStart,
    ToClientTunnelAck,
    ToClientTunnelAcks,
    ToServerInit,
    ToServerResponseAbort,
    ToServerResponseChunk,
    ToServerResponseEnd,
    ToServerResponseStart,
    ToServerTunnelAck,
    decode,
    encode,
)
from corral.protocol.outputs import Send, TunnelAcked, TunnelDropped, Tunnelled, TunnelReceived
from corral.protocol.runner import RunnerConnection
from corral.protocol.server import ServerSession
from corral.protocol.tunnel import Receipt, TunnelLedger

T0 = 1_000.0
RID = RunnerId("rnr_000000000001")
META = {"runner_lost_threshold": 15, "ping_interval": 3, "ack_interval": 300}
START = ToClientRequestStart(
    "req_1", 0, "act_1", 3, "POST", "/hello?x=1", (("a", "1"), ("a", "2")), False
)


def connected() -> RunnerConnection:
    conn = RunnerConnection(
        name="host-a", version="0.1.0", total_slots=1, labels=(), metadata={}, rng=random.Random(0)
    )
    conn.connect(T0)
    conn.receive(ToClientInit(RID, 0, META), T0)
    return conn


def sent(outputs: list[object]) -> list[object]:
    return [o.message for o in outputs if isinstance(o, Send)]


@pytest.mark.parametrize(
    "message",
    [
        START,
        ToClientRequestChunk("req_1", 1, b"\x00\xffbody", False),
        ToClientRequestChunk("req_1", 1, "héllo".encode(), True),
        ToClientRequestChunk("req_1", 1, b"part of a message", False, more=True),
        ToClientRequestStart("req_2", 0, "act_1", 1, "GET", "/", (), False, end=True),
        ToClientRequestEnd("req_1", 2),
        ToClientRequestAbort("req_1", 3),
        ToClientTunnelAck("req_1", 4),
        ToClientTunnelAcks((("req_1", 4), ("req_2", 0))),
    ],
)
def test_messages_to_the_runner_round_trip(message: object) -> None:
    assert decode(encode(message), side="client") == message  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message",
    [
        ToServerResponseStart("req_1", 0, 200, (("content-type", "text/plain"),)),
        ToServerResponseStart("req_1", 0, 200, (), b"the whole body", end=True),
        ToServerResponseChunk("req_1", 1, bytes(range(256)), False),
        ToServerResponseChunk("req_1", 1, b"part of a message", True, more=True),
        ToServerResponseEnd("req_1", 2),
        ToServerResponseAbort("req_1", 3, "actor_gone", "the actor exited"),
        ToServerTunnelAck("req_1", 0),
    ],
)
def test_messages_to_the_coordinator_round_trip(message: object) -> None:
    assert decode(encode(message), side="server") == message  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "frame",
    [
        '{"v":1,"type":"ToServerResponseChunk","request_id":"r","seq":0,"data":"%%%","text":false}',
        '{"v":1,"type":"ToServerResponseStart","request_id":"r","seq":0,"status":99,"headers":[]}',
        '{"v":1,"type":"ToServerResponseStart","request_id":"r","seq":0,"status":200,'
        '"headers":[["a"]]}',
        '{"v":1,"type":"ToServerTunnelAck","request_id":"","seq":0}',
        '{"v":1,"type":"ToServerResponseEnd","request_id":"r","seq":-1}',
        '{"v":1,"type":"ToServerResponseChunk","request_id":"r","seq":0,"data":"","text":0}',
        '{"v":1,"type":"ToServerResponseChunk","request_id":"r","seq":0,"data":"","text":false,'
        '"more":1}',
        '{"v":1,"type":"ToServerResponseStart","request_id":"r","seq":0,"status":200,'
        '"headers":[],"data":"%%%"}',
        '{"v":1,"type":"ToServerResponseStart","request_id":"r","seq":0,"status":200,'
        '"headers":[],"end":1}',
    ],
)
def test_malformed_tunnel_frames_are_refused(frame: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode(frame, side="server")
    assert refused.value.code == MALFORMED_FRAME


@pytest.mark.parametrize(
    "acks",
    ['[["r",-1]]', '[["",0]]', '[["r"]]', '{"r":0}', "[" + ",".join(['["r",0]'] * 1025) + "]"],
)
def test_malformed_acknowledgements_are_refused(acks: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode(f'{{"v":1,"type":"ToClientTunnelAcks","acks":{acks}}}', side="client")
    assert refused.value.code == MALFORMED_FRAME


def test_a_response_start_before_tunnel_whole_has_no_body_and_no_end() -> None:
    """What a runner before TUNNEL_WHOLE sends: no ``data``, no ``end``."""
    frame = (
        '{"v":1,"type":"ToServerResponseStart","request_id":"r","seq":0,"status":200,"headers":[]}'
    )
    assert decode(frame, side="server") == ToServerResponseStart("r", 0, 200, (), b"", end=False)


def test_a_chunk_over_the_limit_is_refused() -> None:
    big = ToServerResponseChunk("r", 0, b"x" * (MAX_TUNNEL_CHUNK_BYTES + 3), False)
    with pytest.raises(ProtocolError):
        decode(encode(big), side="server")
    at_limit = ToServerResponseChunk("r", 0, b"x" * MAX_TUNNEL_CHUNK_BYTES, False)
    assert decode(encode(at_limit), side="server") == at_limit


# ---- the ledger ------------------------------------------------------------------------------


def ledger(window: int = 1000) -> TunnelLedger[ToServerResponseChunk, ToServerTunnelAck]:
    return TunnelLedger(ToServerTunnelAck, window=window)


def chunk(data: bytes = b"x" * 100) -> ToServerResponseChunk:
    return ToServerResponseChunk("req_1", 0, data, False)


def test_messages_are_numbered_kept_and_dropped_when_acknowledged() -> None:
    tunnel = ledger()
    assert [tunnel.send(chunk()).seq for _ in range(3)] == [0, 1, 2]
    assert [m.seq for m in tunnel.take_unsent()] == [0, 1, 2]
    assert tunnel.take_unsent() == []
    assert tunnel.room("req_1") == 700
    tunnel.acknowledge("req_1", 1)
    assert [m.seq for m in tunnel.kept("req_1")] == [2]
    assert tunnel.room("req_1") == 900


def test_a_rewind_sends_everything_unacknowledged_again_in_order() -> None:
    tunnel = ledger()
    for _ in range(3):
        tunnel.send(chunk())
    tunnel.take_unsent()
    tunnel.acknowledge("req_1", 0)
    tunnel.rewind()
    assert [m.seq for m in tunnel.take_unsent()] == [1, 2]


def test_receipts_new_duplicate_gap_and_orphan() -> None:
    tunnel = ledger()
    assert tunnel.receive("req_1", 1, opening=True) is Receipt.ORPHAN  # not a start
    assert tunnel.receive("req_1", 0, opening=True) is Receipt.NEW
    assert tunnel.receive("req_1", 0) is Receipt.DUPLICATE
    assert tunnel.receive("req_1", 2) is Receipt.GAP
    assert tunnel.receive("req_1", 1) is Receipt.NEW
    assert tunnel.receive("req_2", 0) is Receipt.ORPHAN  # never opened here
    tunnel.open("req_2")
    assert tunnel.receive("req_2", 0) is Receipt.NEW


def test_a_request_that_is_over_is_never_taken_again() -> None:
    tunnel = ledger()
    tunnel.receive("req_1", 0, opening=True)
    tunnel.receive("req_1", 1)
    tunnel.forget("req_1")
    # Its start sent again (our ack was lost) is a duplicate, acknowledged again: not run twice.
    assert tunnel.receive("req_1", 0, opening=True) is Receipt.DUPLICATE
    assert tunnel.duplicate_ack("req_1") == ToServerTunnelAck("req_1", 1)
    assert tunnel.receive("req_1", 2) is Receipt.ORPHAN  # sent after we gave up: acked, dropped


def test_consumption_is_acknowledged_a_quarter_window_at_a_time_and_at_the_end() -> None:
    tunnel = ledger(window=1000)
    tunnel.receive("req_1", 0, opening=True)
    assert tunnel.consumed("req_1", 0, 200) is None
    assert tunnel.consumed("req_1", 1, 100) == ToServerTunnelAck("req_1", 1)
    assert tunnel.consumed("req_1", 1, 100) is None  # already counted
    assert tunnel.consumed("req_1", 2, 1, final=True) == ToServerTunnelAck("req_1", 2)
    assert tunnel.acks() == [ToServerTunnelAck("req_1", 2)]


# ---- the runner's connection ---------------------------------------------------------------


def test_the_runner_delivers_each_request_message_once_and_in_order() -> None:
    conn = connected()
    assert conn.receive(START, T0) == [TunnelReceived(START)]
    assert conn.receive(START, T0) == []  # a duplicate, nothing consumed yet: nothing to say
    end = ToClientRequestEnd("req_1", 1)
    assert conn.receive(end, T0) == [TunnelReceived(end)]
    assert sent(conn.tunnel_consumed("req_1", 1, 0, T0, final=True)) == [
        ToServerTunnelAck("req_1", 1)
    ]
    with pytest.raises(ProtocolError) as gap:
        conn.receive(ToClientRequestChunk("req_1", 5, b"", False), T0)
    assert gap.value.code == TUNNEL_GAP


def test_replies_wait_while_disconnected_and_go_again_after_the_init() -> None:
    conn = connected()
    conn.receive(START, T0)
    first = conn.tunnel_send(ToServerResponseStart("req_1", 0, 200, ()), T0)
    assert sent(first) == [ToServerResponseStart("req_1", 0, 200, ())]
    conn.socket_closed(T0 + 1)  # the response start may have been lost with the socket
    assert conn.tunnel_send(ToServerResponseChunk("req_1", 0, b"hi", False), T0 + 1) == []
    assert conn.tunnel_send(ToServerResponseEnd("req_1", 0), T0 + 1) == []
    conn.connect(T0 + 2)
    again = sent(conn.receive(ToClientInit(RID, 0, META), T0 + 2))
    tunnel = [m for m in again if not isinstance(m, ToServerInit)]
    assert tunnel[-3:] == [
        ToServerResponseStart("req_1", 0, 200, ()),
        ToServerResponseChunk("req_1", 1, b"hi", False),
        ToServerResponseEnd("req_1", 2),
    ]
    assert conn.receive(ToClientTunnelAck("req_1", 2), T0 + 2) == [TunnelAcked("req_1")]
    assert conn.tunnel_unacknowledged("req_1") == 0


def test_acknowledgements_several_to_a_frame_release_each_request() -> None:
    conn = connected()
    for request_id in ("req_1", "req_2"):
        conn.receive(replace(START, request_id=request_id), T0)
        whole = ToServerResponseStart(request_id, 0, 200, (), b"ok", end=True)
        assert sent(conn.tunnel_send(whole, T0)) == [whole]
    acks = ToClientTunnelAcks((("req_1", 0), ("req_2", 0)))
    assert conn.receive(acks, T0) == [TunnelAcked("req_1"), TunnelAcked("req_2")]
    assert conn.tunnel_unacknowledged("req_1") == conn.tunnel_unacknowledged("req_2") == 0


def test_a_new_identity_ends_every_tunnelled_request() -> None:
    conn = connected()
    conn.receive(START, T0)
    conn.tunnel_send(ToServerResponseStart("req_1", 0, 200, ()), T0)
    conn.socket_closed(T0 + 1)
    conn.connect(T0 + 2)
    out = conn.receive(ToClientInit(RunnerId("rnr_000000000002"), 0, META), T0 + 2)
    assert not [m for m in sent(out) if isinstance(m, ToServerResponseStart)]
    assert conn.tunnel_unacknowledged("req_1") == 0


def test_a_runner_that_moves_to_another_coordinator_drops_the_last_ones_requests() -> None:
    """Its answers would go to a coordinator that never asked (and drops them); when it
    comes back, its Init says where it was, and the first one ends what it waits for."""
    hello = {"tunnel": TUNNEL_STARTING}
    conn = RunnerConnection(
        name="host-a",
        version="0.1.0",
        total_slots=1,
        labels=(),
        metadata=hello,
        rng=random.Random(0),
    )
    first = conn.connect(T0)[0]
    assert isinstance(first, Send) and TUNNEL_WITH not in first.message.metadata
    on_a = ToClientInit(RID, 0, {**META, TUNNEL_END: "end-a"})
    assert not any(isinstance(o, TunnelDropped) for o in conn.receive(on_a, T0 + 1))
    conn.receive(START, T0 + 1)
    conn.tunnel_send(ToServerResponseStart("req_1", 0, 200, ()), T0 + 1)
    conn.socket_closed(T0 + 2)
    init = conn.connect(T0 + 3)[0]
    assert isinstance(init, Send) and init.message.metadata[TUNNEL_WITH] == "end-a"
    again = conn.receive(ToClientInit(RID, 0, {**META, TUNNEL_END: "end-a"}), T0 + 3)
    assert ToServerResponseStart("req_1", 0, 200, ()) in sent(again)  # the same end: kept
    assert not any(isinstance(o, TunnelDropped) for o in again)
    conn.socket_closed(T0 + 4)
    conn.connect(T0 + 5)
    on_b = conn.receive(ToClientInit(RID, 0, {**META, TUNNEL_END: "end-b"}), T0 + 5)
    assert TunnelDropped() in on_b
    assert not [m for m in sent(on_b) if isinstance(m, ToServerResponseStart)]
    assert conn.tunnel_unacknowledged("req_1") == 0
    assert not any(isinstance(o, TunnelReceived) for o in conn.receive(START, T0 + 5))
    conn.socket_closed(T0 + 6)
    back = conn.connect(T0 + 7)[0]
    assert isinstance(back, Send) and back.message.metadata[TUNNEL_WITH] == "end-b"


# ---- the coordinator's session -------------------------------------------------------------


def test_the_session_hands_tunnel_messages_to_the_pump_once_registered() -> None:
    session = ServerSession(T0)
    session.receive(ToServerInit("host-a", "0.1.0", 1, 1, 0, None, (), {"tunnel": 1}), T0)
    session.registered(RID, 0, (), T0)
    reply = ToServerResponseChunk("req_1", 1, b"x", False)
    assert session.receive(reply, T0) == [Tunnelled(reply)]


def test_a_chunk_without_more_is_a_whole_message() -> None:
    """What a runner or coordinator before TUNNEL_PARTS sends: no ``more``."""
    frame = '{"v":1,"type":"ToServerResponseChunk","request_id":"r","seq":0,"data":"","text":false}'
    assert decode(frame, side="server") == ToServerResponseChunk("r", 0, b"", False, more=False)
