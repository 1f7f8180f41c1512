"""KV requests across the link: the runner's pending requests (sent when active, kept while
disconnected, sent again after every Init until answered, failed when its work stops) and
the coordinator's session handing them to its pump and answering. Pure, time passed in."""

from __future__ import annotations

import random

import pytest

from corral.errors import IllegalTransition
from corral.ids import RunnerId
from corral.protocol.messages import (
    EXPECTED_INIT,
    ToClientClose,
    ToClientInit,
    ToClientKvResponse,
    ToServerInit,
    ToServerKvRequest,
    decode,
    encode,
)
from corral.protocol.outputs import Close, KvAnswered, KvRequested, Send, StopAllWork
from corral.protocol.runner import RunnerConnection
from corral.protocol.server import ServerSession

T0 = 1_000.0
RID = RunnerId("rnr_000000000001")
META = {"runner_lost_threshold": 15, "ping_interval": 3, "ack_interval": 300}
GET = {"op": "get", "keys": ["a"]}
PUT = {"op": "put", "entries": {"a": "1"}}
OK = {"ok": True}


def runner() -> RunnerConnection:
    return RunnerConnection(
        name="host-a",
        version="0.1.0",
        total_slots=1,
        labels=(),
        metadata={},
        rng=random.Random(0),
    )


def connected(now: float = T0, runner_id: RunnerId = RID) -> RunnerConnection:
    conn = runner()
    conn.connect(now)
    conn.receive(ToClientInit(runner_id, 0, META), now)
    return conn


def kv_sent(outputs: list[object]) -> list[ToServerKvRequest]:
    return [
        o.message
        for o in outputs
        if isinstance(o, Send) and isinstance(o.message, ToServerKvRequest)
    ]


def test_the_wire_format_round_trips() -> None:
    request = ToServerKvRequest(7, "act_1", PUT)
    assert decode(encode(request), side="server") == request
    of_a_generation = ToServerKvRequest(8, "act_1", PUT, generation=3)
    assert decode(encode(of_a_generation), side="server") == of_a_generation
    response = ToClientKvResponse(7, {"ok": True, "values": [None]})
    assert decode(encode(response), side="client") == response


def test_a_request_is_sent_at_once_when_active_and_its_answer_delivered_once() -> None:
    conn = connected()
    request_id, out = conn.kv_request("act_1", GET, T0)
    assert kv_sent(out) == [ToServerKvRequest(request_id, "act_1", GET)]
    answer = ToClientKvResponse(request_id, {"ok": True, "values": ["1"]})
    assert conn.receive(answer, T0) == [KvAnswered(request_id, {"ok": True, "values": ["1"]})]
    assert conn.receive(answer, T0) == []  # a second answer (asked twice) is dropped
    assert conn.pending_kv == ()


def test_requests_wait_while_disconnected_and_go_after_the_init_in_order() -> None:
    conn = connected()
    sent_id, _ = conn.kv_request("act_1", PUT, T0)  # its answer is lost with the socket
    conn.socket_closed(T0 + 1)
    waiting_id, out = conn.kv_request("act_1", GET, T0 + 1)
    assert out == []
    conn.connect(T0 + 2)
    out = conn.receive(ToClientInit(RID, 0, META), T0 + 2)
    assert [r.request_id for r in kv_sent(out)] == [sent_id, waiting_id]
    assert conn.pending_kv == (sent_id, waiting_id)


def test_waiting_requests_fail_when_the_lease_runs_out() -> None:
    conn = connected()
    request_id, _ = conn.kv_request("act_1", PUT, T0)
    conn.socket_closed(T0)
    out = conn.tick(T0 + 15)
    assert out[0] == StopAllWork()
    (failed,) = [o for o in out if isinstance(o, KvAnswered)]
    assert failed.request_id == request_id and failed.result["code"] == "lease_lost"
    conn.connect(T0 + 16)
    out = conn.receive(ToClientInit(RunnerId("rnr_000000000002"), 0, META), T0 + 16)
    assert kv_sent(out) == []  # never sent late, after the actor may have moved


def test_waiting_requests_fail_on_a_new_identity() -> None:
    conn = connected()
    request_id, _ = conn.kv_request("act_1", PUT, T0)
    conn.socket_closed(T0)
    conn.connect(T0 + 1)
    out = conn.receive(ToClientInit(RunnerId("rnr_000000000002"), 0, META), T0 + 1)
    assert StopAllWork() in out
    assert [o.request_id for o in out if isinstance(o, KvAnswered)] == [request_id]
    assert kv_sent(out) == []


def test_closing_for_good_fails_what_waits_and_refuses_new_requests() -> None:
    conn = connected()
    request_id, _ = conn.kv_request("act_1", GET, T0)
    out = conn.receive(ToClientClose("corral.evicted"), T0)
    assert [o.request_id for o in out if isinstance(o, KvAnswered)] == [request_id]
    with pytest.raises(IllegalTransition):
        conn.kv_request("act_1", GET, T0)


def test_the_session_hands_requests_to_its_pump_and_answers_them() -> None:
    session = ServerSession(T0)
    session.receive(ToServerInit("host-a", "0.1.0", 1, 1, 0, RID, (), {}), T0)
    session.registered(RID, 0, [], T0)
    out = session.receive(ToServerKvRequest(3, "act_1", GET), T0)
    assert out == [KvRequested(3, "act_1", GET)]
    out = session.receive(ToServerKvRequest(5, "act_1", GET, generation=2), T0)
    assert out == [KvRequested(5, "act_1", GET, generation=2)]
    assert session.kv_answered(3, OK) == [Send(ToClientKvResponse(3, OK))]
    session.evict()
    assert session.kv_answered(4, OK) == []  # the socket is gone: the runner asks again


def test_a_request_before_init_is_a_protocol_error() -> None:
    session = ServerSession(T0)
    (close,) = session.receive(ToServerKvRequest(1, "act_1", GET), T0)
    assert isinstance(close, Close) and EXPECTED_INIT in close.reason
