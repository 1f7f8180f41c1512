"""Runner-link wire messages: the versioned tagged union both ends speak, and its JSON codec.

Every frame is one JSON object ``{"v": 1, "type": "<Name>", ...fields}`` (seed 000):

    runner                                       coordinator
      ToServerInit ─────────────────────────────▶
                   ◀──────────────────────────── ToClientInit, ToClientCommands (missed ones)
      ToServerEvents (unacked ones, resent) ────▶
                   ◀──────────────────────────── ToClientAckEvents (after the commit; or
                                                 in the next ToClientCommands: ack_events)
      ToServerPing, ToServerAckCommands, ToServerStopping ─▶
                   ◀──── ToClientPong, ToClientCommands, ToClientDrain, ToClientClose
      ToServerKvRequest (pending ones, resent) ─▶
                   ◀──────────────────────────── ToClientKvResponse
                   ◀──── ToClientRequestStart, …Chunk, …End, …Abort   (the tunnel, below)
      ToServerResponseStart, …Chunk, …End, …Abort ─▶
      ToServerTunnelAck ─▶  ◀─ ToClientTunnelAck, ToClientTunnelAcks

Commands (coordinator → runner) and events (runner → coordinator) are ``Indexed``: numbered
per runner from 1, so each side drops duplicates by index. KV requests (an actor's durable
key-value state) carry a request id the answer echoes. Bodies are opaque to the protocol
(a JSON object with a string ``type``).

The tunnel carries HTTP requests (and WebSocket upgrades) for actors through the gateway
(seed 002): each message names its request and is numbered per request and direction
from 0 (``seq``); the receiver acknowledges what it has consumed (``…TunnelAck``), the
sender keeps what is unacknowledged, sends it again on the next socket, and sends no more
than a window ahead (``corral.protocol.tunnel``). Bodies travel base64-encoded in chunks
of at most ``limits.MAX_TUNNEL_CHUNK_BYTES``. Only a runner whose Init says
``metadata.tunnel`` is sent tunnel messages, so older runners are never surprised by
them, and a runner sends them only in answer to a tunnelled request.

Decoding is strict and every problem raises ``ProtocolError`` with a stable code; unknown
extra fields are ignored so that adding an optional field does not need a version bump.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, NoReturn, TypeVar, overload

from corral import runners
from corral.errors import CorralError
from corral.ids import RunnerId
from corral.protocol.limits import (
    MAX_TUNNEL_ACKS,
    MAX_TUNNEL_CHUNK_BYTES,
    MAX_TUNNEL_HEADER_BYTES,
    MAX_TUNNEL_REQUEST_ID_CHARS,
)

PROTOCOL_VERSION = 1
# What each end's Init says in ``metadata.tunnel``: 1, it takes tunnel messages; 2
# (TUNNEL_PARTS), a WebSocket message may also come in several chunks (``more``), and a
# request without a body in its start alone (``end``); 3 (TUNNEL_WHOLE), a response may
# come whole in its start (``data``, ``end``), and acknowledgements several to a frame
# (``ToClientTunnelAcks``); 4 (TUNNEL_STARTING, a runner's), a request for a generation it
# was told to start waits until that generation accepts connections (or answers that the
# actor is not here if it never does), so the gateway may send it before the runner
# reports the actor running.
TUNNEL_PARTS = 2
TUNNEL_WHOLE = 3
TUNNEL_STARTING = 4
# Late reports (``corral.protocol.runner``): the coordinator's Init says ``late_reports``
# (1) when it takes events of an attempt a former identity of the runner held
# (``former_runner_id``); the Init of a runner whose identity is spent says how many final
# reports of that kind it will send once answered, and the coordinator claims nothing for
# it before they are applied.
LATE_REPORTS = "late_reports"
LATE_REPORTS_TO_SEND = "late_reports_to_send"
# A runner whose Init says ``acks_in_commands`` (1) reads a Commands frame's ``ack_events``:
# the coordinator may then acknowledge events in the frame that starts the next runs rather
# than in an AckEvents frame of its own (one frame a round, not two). An older runner would
# ignore the field and never see those acknowledgements: it is sent AckEvents only.
ACKS_IN_COMMANDS = "acks_in_commands"
# Each end of the tunnel holds its requests in memory: a coordinator process its own, a
# runner those of the coordinator it is connected to. A coordinator's Init names its end
# (``tunnel_end``, made when it starts); a runner's Init names the end it spoke to last
# (``tunnel_with``). A runner that connects to another end (another coordinator, or this
# one restarted) drops the requests of the last one: their answers can no longer reach
# who asked. A coordinator told so by a runner's Init ends its own requests the runner
# may have taken (503 ``tunnel_lost``) instead of waiting for answers that will never come.
TUNNEL_END = "tunnel_end"
TUNNEL_WITH = "tunnel_with"
INT64_MAX = 2**63 - 1  # every integer on the wire fits the store's columns

# WebSocket close codes and the reasons that travel with them.
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_INTERNAL_ERROR = 1011
REASON_RUNNER_SHUTDOWN = "corral.runner_shutdown"  # the runner leaves on purpose (code 1000)
REASON_EVICTED = "corral.evicted"  # a newer socket of the same runner took over
REASON_INIT_TIMEOUT = "corral.init_timeout"
REASON_RUNNER_LOST = "corral.runner_lost"
REASON_STOPPED = "corral.stopped"  # the coordinator stopped the runner after its drain
# The coordinator stops (a deploy): move to the next coordinator now, keeping the runs, or
# hold on until it is back. A runner older than this reason reconnects as after any close.
REASON_COORDINATOR_LEAVING = "corral.coordinator_leaving"
REASON_INTERNAL_ERROR = "corral.internal_error"  # handling a frame failed (code 1011)

# ProtocolError codes.
MALFORMED_FRAME = "malformed_frame"
UNKNOWN_MESSAGE = "unknown_message"
UNSUPPORTED_VERSION = "unsupported_version"
EXPECTED_INIT = "expected_init"  # anything but Init opened the conversation
DUPLICATE_INIT = "duplicate_init"
UNEXPECTED_MESSAGE = "unexpected_message"  # a valid message at a point where it is not allowed
INVALID_INIT = "invalid_init"  # an Init whose fields break the runner limits (corral.runners)
MALFORMED_EVENT = "malformed_event"  # an event body the coordinator cannot apply (too big …)
TUNNEL_GAP = "tunnel_gap"  # a tunnel message skipped a number: drop the socket, replay fills it


def protocol_error_reason(code: str) -> str:
    return f"corral.protocol_error:{code}"


class ProtocolError(CorralError):
    """The peer broke the protocol; ``code`` is one of the constants above."""

    code = "protocol_error"
    http_status = 400

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason, code=code)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Indexed:
    """A numbered command or event; ``body`` is ``{"type": str, ...}``. ``encoded``: the
    body as compact JSON already, where the sender has it (a command as the store keeps it,
    an event as the runner's replay buffer sized it): a frame of such items is written
    around it, not encoded again (``encode``)."""

    idx: int
    body: dict[str, Any]
    encoded: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ToServerInit:
    name: str
    version: str
    protocol_version: int
    total_slots: int
    last_command_idx: int
    runner_id: RunnerId | None
    labels: tuple[str, ...]
    metadata: dict[str, Any]
    # Actors it can host (``[actors.NAME]`` of its config), in which pool, how many at once.
    # Optional on the wire: a runner without them hosts none; a coordinator that does not
    # know them ignores them.
    actor_names: tuple[str, ...] = ()
    pool: str = "default"
    actor_slots: int = 0


@dataclass(frozen=True, slots=True)
class ToServerEvents:
    events: tuple[Indexed, ...]


@dataclass(frozen=True, slots=True)
class ToServerAckCommands:
    last_command_idx: int


@dataclass(frozen=True, slots=True)
class ToServerPing:
    ts: float


@dataclass(frozen=True, slots=True)
class ToServerStopping:
    pass  # the runner is shutting down gracefully: stop giving it work


@dataclass(frozen=True, slots=True)
class ToServerKvRequest:
    """One operation on an actor's key-value store; ``op`` is ``{"op": "get"|"put"|...}``.
    ``generation``: the actor's generation that asked (a runner before it sends none)."""

    request_id: int
    actor_id: str
    op: dict[str, Any]
    generation: int | None = None


@dataclass(frozen=True, slots=True)
class ToClientInit:
    runner_id: RunnerId
    last_event_idx: int
    metadata: dict[str, Any]  # runner_lost_threshold, ping_interval, ack_interval (seconds)


@dataclass(frozen=True, slots=True)
class ToClientCommands:
    """``ack_events``: also an acknowledgement, as ``ToClientAckEvents`` (0: none; only to a
    runner whose Init says ``ACKS_IN_COMMANDS``)."""

    commands: tuple[Indexed, ...]
    ack_events: int = 0


@dataclass(frozen=True, slots=True)
class ToClientAckEvents:
    last_event_idx: int


@dataclass(frozen=True, slots=True)
class ToClientPong:
    ts: float


@dataclass(frozen=True, slots=True)
class ToClientDrain:
    grace_s: float


@dataclass(frozen=True, slots=True)
class ToClientClose:
    reason: str


@dataclass(frozen=True, slots=True)
class ToClientKvResponse:
    """The answer to a KV request: ``{"ok": true, ...}`` or ``{"ok": false, "code", "error"}``."""

    request_id: int
    result: dict[str, Any]


# ---- the tunnel (see the module docstring) --------------------------------------------------

Headers = tuple[tuple[str, str], ...]  # in order; a name may come more than once


@dataclass(frozen=True, slots=True)
class ToClientRequestStart:
    """A request for an actor's port (``seq`` 0); ``websocket``: an upgrade to tunnel."""

    request_id: str
    seq: int
    actor_id: str
    generation: int
    method: str
    path: str  # with its query string
    headers: Headers
    websocket: bool
    end: bool = False  # no body: nothing follows (to a runner at ``TUNNEL_PARTS``)


@dataclass(frozen=True, slots=True)
class ToClientRequestChunk:
    """Part of the request body; for a WebSocket, one message (``text``: a text frame), or
    part of one that continues in the next chunk (``more``: only to a runner whose Init
    says ``tunnel`` ≥ ``TUNNEL_PARTS``)."""

    request_id: str
    seq: int
    data: bytes
    text: bool
    more: bool = False


@dataclass(frozen=True, slots=True)
class ToClientRequestEnd:
    request_id: str
    seq: int  # the body is complete (a WebSocket: the client closed it)


@dataclass(frozen=True, slots=True)
class ToClientRequestAbort:
    request_id: str
    seq: int  # the client went away: stop forwarding, answer nothing more


@dataclass(frozen=True, slots=True)
class ToClientTunnelAck:
    request_id: str
    seq: int  # the coordinator has consumed the runner's messages up to this one


@dataclass(frozen=True, slots=True)
class ToClientTunnelAcks:
    """Several acknowledgements in one frame, ``(request_id, seq)`` each (only to a runner
    whose Init says ``tunnel`` ≥ ``TUNNEL_WHOLE``): the ends of responses, gathered."""

    acks: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ToServerResponseStart:
    """The response's status and headers (101: the WebSocket is open); to a coordinator
    whose Init says ``tunnel`` ≥ ``TUNNEL_WHOLE``, also the body's first part (``data``)
    and, with ``end``, its end: a small response in one message."""

    request_id: str
    seq: int
    status: int
    headers: Headers
    data: bytes = b""
    end: bool = False


@dataclass(frozen=True, slots=True)
class ToServerResponseChunk:
    """Part of the response body, or a WebSocket message (or part of one: ``more``, only
    to a coordinator whose Init says ``tunnel`` ≥ ``TUNNEL_PARTS``)."""

    request_id: str
    seq: int
    data: bytes
    text: bool
    more: bool = False


@dataclass(frozen=True, slots=True)
class ToServerResponseEnd:
    request_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class ToServerResponseAbort:
    """The runner gave the request up (the actor went away mid-response); ``code`` says why."""

    request_id: str
    seq: int
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class ToServerTunnelAck:
    request_id: str
    seq: int  # the runner has consumed the coordinator's messages up to this one


ToClientTunnel = (
    ToClientRequestStart
    | ToClientRequestChunk
    | ToClientRequestEnd
    | ToClientRequestAbort
    | ToClientTunnelAck
    | ToClientTunnelAcks
)
ToServerTunnel = (
    ToServerResponseStart
    | ToServerResponseChunk
    | ToServerResponseEnd
    | ToServerResponseAbort
    | ToServerTunnelAck
)

ToServerMessage = (
    ToServerInit
    | ToServerEvents
    | ToServerAckCommands
    | ToServerPing
    | ToServerStopping
    | ToServerKvRequest
    | ToServerTunnel
)
ToClientMessage = (
    ToClientInit
    | ToClientCommands
    | ToClientAckEvents
    | ToClientPong
    | ToClientDrain
    | ToClientClose
    | ToClientKvResponse
    | ToClientTunnel
)
Message = ToServerMessage | ToClientMessage

_ALL: tuple[type[Any], ...] = tuple(
    cls
    for union in (ToServerMessage, ToClientMessage)
    for member in union.__args__
    for cls in getattr(member, "__args__", (member,))
)
_FIELD_NAMES = {cls: tuple(f.name for f in fields(cls)) for cls in _ALL}


def encode(message: Message) -> str:
    if type(message) is ToClientPong and math.isfinite(message.ts):
        # The most frequent frame (one per ping of every runner, a few thousand a second on
        # a coordinator holding 10,000 sockets): written as json.dumps would, a tenth the CPU.
        return f'{{"v":{PROTOCOL_VERSION},"type":"ToClientPong","ts":{message.ts!r}}}'
    if type(message) is ToClientCommands and all(c.encoded is not None for c in message.commands):
        # Commands as the store keeps them (a start_run's is ~360 bytes: 35 µs a frame of 8
        # encoded again, 2 so). What json.dumps writes, but for the spaces of a start_run
        # that PostgreSQL's claim wrote (``commands.START_RUN``): the store's JSON is
        # compact otherwise, and its values were checked storable (finite) as they came in.
        ack = f',"ack_events":{message.ack_events}' if message.ack_events else ""
        return _numbered("ToClientCommands", "commands", message.commands, ack)
    if type(message) is ToServerEvents and all(e.encoded is not None for e in message.events):
        # Events as the runner's replay buffer encoded them once, to know their sizes.
        return _numbered("ToServerEvents", "events", message.events)
    # Tuples (headers, labels, acknowledgements) are JSON arrays as they are: only bytes
    # (base64) and numbered items need turning into JSON (this is in every frame's path).
    frame: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": type(message).__name__}
    for name in _FIELD_NAMES[type(message)]:
        value = getattr(message, name)
        if name == "ack_events" and not value:
            continue  # none: the frame an older runner knows, byte for byte
        if type(value) is bytes:
            value = base64.b64encode(value).decode("ascii")
        elif type(value) is tuple and value and type(value[0]) is Indexed:
            value = [{"idx": item.idx, "body": item.body} for item in value]
        frame[name] = value
    return json.dumps(frame, separators=(",", ":"), allow_nan=False)


def _numbered(message_type: str, name: str, items: tuple[Indexed, ...], more: str = "") -> str:
    """A frame of one field of numbered items whose bodies are JSON already (compact, as
    ``json.dumps`` with ``separators=(",", ":")`` writes it, or as PostgreSQL's
    ``json_build_object`` does), as ``encode`` would write it;
    ``more``: the fields after it, written so too (``,"name":value``)."""
    return (
        f'{{"v":{PROTOCOL_VERSION},"type":"{message_type}","{name}":['
        + ",".join(f'{{"idx":{item.idx},"body":{item.encoded}}}' for item in items)
        + f"]{more}}}"
    )


# ---- decoding: one small reader per field type, each failing with malformed_frame ------------

_Frame = dict[str, Any]
_T = TypeVar("_T")


def _malformed(reason: str) -> NoReturn:
    raise ProtocolError(MALFORMED_FRAME, reason)


def _get(frame: _Frame, name: str) -> Any:
    if name not in frame:
        _malformed(f"missing field {name!r}")
    return frame[name]


def _int(frame: _Frame, name: str, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    value = _get(frame, name)
    # ``type(...) is int`` on purpose: JSON true/false decode to bool, a subclass of int.
    if type(value) is not int or not minimum <= value <= maximum:
        _malformed(f"{name!r} must be an integer in {minimum}..{maximum}")
    return value


def _num(frame: _Frame, name: str, minimum: float = -math.inf) -> float:
    value = _get(frame, name)
    if type(value) not in (int, float) or not math.isfinite(value) or value < minimum:
        _malformed(f"{name!r} must be a finite number >= {minimum}")
    return float(value)


def _of(frame: _Frame, name: str, kind: type[_T]) -> _T:
    value = _get(frame, name)
    if not isinstance(value, kind):  # str or dict: json.loads makes no subclasses of them
        _malformed(f"{name!r} must be a {kind.__name__}")
    return value


def _opt_runner_id(frame: _Frame, name: str) -> RunnerId | None:
    return None if _get(frame, name) is None else RunnerId(_of(frame, name, str))


def _strs(frame: _Frame, name: str) -> tuple[str, ...]:
    value = _get(frame, name)
    if type(value) is not list or any(type(item) is not str for item in value):
        _malformed(f"{name!r} must be a list of strings")
    return tuple(value)


def _tagged(frame: _Frame, name: str, tag: str) -> dict[str, Any]:
    """An object whose ``tag`` field is a string (what it is; the rest is its business)."""
    value = _of(frame, name, dict)
    if type(value.get(tag)) is not str:
        _malformed(f"{name!r} needs a string {tag!r}")
    return value


def _indexed(frame: _Frame, name: str) -> tuple[Indexed, ...]:
    items = _get(frame, name)
    if type(items) is not list:
        _malformed(f"{name!r} must be a list")
    out = []
    for item in items:
        if type(item) is not dict:
            _malformed(f"{name!r} items must be objects")
        idx = _int(item, "idx", minimum=1)
        out.append(Indexed(idx, _tagged(item, "body", "type")))
    return tuple(out)


def _bool(frame: _Frame, name: str) -> bool:
    value = _get(frame, name)
    if type(value) is not bool:
        _malformed(f"{name!r} must be true or false")
    return value


def _more(frame: _Frame) -> bool:
    """``more`` is optional: a peer before ``TUNNEL_PARTS`` never sends it."""
    return "more" in frame and _bool(frame, "more")


def _request_id(frame: _Frame) -> str:
    value = _of(frame, "request_id", str)
    if not 0 < len(value) <= MAX_TUNNEL_REQUEST_ID_CHARS:
        _malformed(f"'request_id' must be 1..{MAX_TUNNEL_REQUEST_ID_CHARS} characters")
    return value


def _data(frame: _Frame) -> bytes:
    text = _of(frame, "data", str)
    if len(text) > (MAX_TUNNEL_CHUNK_BYTES + 2) // 3 * 4:
        _malformed(f"'data' is over {MAX_TUNNEL_CHUNK_BYTES} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        _malformed(f"'data' is not base64: {exc}")


def _acks(frame: _Frame) -> tuple[tuple[str, int], ...]:
    value = _get(frame, "acks")
    if type(value) is not list or len(value) > MAX_TUNNEL_ACKS:
        _malformed(f"'acks' must be a list of at most {MAX_TUNNEL_ACKS}")
    acks = []
    for pair in value:
        if type(pair) is not list or len(pair) != 2:
            _malformed("'acks' must be [request_id, seq] pairs")
        acks.append((_request_id({"request_id": pair[0]}), _int({"seq": pair[1]}, "seq")))
    return tuple(acks)


def _headers(frame: _Frame) -> Headers:
    value = _get(frame, "headers")
    if type(value) is not list:
        _malformed("'headers' must be a list of [name, value] strings")
    headers, size = [], 0
    for pair in value:  # one pass: every tunnelled request and response has its headers
        if type(pair) is not list or len(pair) != 2:
            _malformed("'headers' must be a list of [name, value] strings")
        name, text = pair
        if type(name) is not str or type(text) is not str:
            _malformed("'headers' must be a list of [name, value] strings")
        size += len(name) + len(text)
        headers.append((name, text))
    if size > MAX_TUNNEL_HEADER_BYTES:
        _malformed(f"'headers' are over {MAX_TUNNEL_HEADER_BYTES} bytes")
    return tuple(headers)


def _request_start(f: _Frame) -> ToClientRequestStart:
    return ToClientRequestStart(
        _request_id(f),
        _int(f, "seq"),
        _of(f, "actor_id", str),
        _int(f, "generation"),
        _of(f, "method", str),
        _of(f, "path", str),
        _headers(f),
        _bool(f, "websocket"),
        "end" in f and _bool(f, "end"),
    )


def _init(frame: _Frame) -> ToServerInit:
    protocol_version = _int(frame, "protocol_version", minimum=1)
    if protocol_version > PROTOCOL_VERSION:
        raise ProtocolError(
            UNSUPPORTED_VERSION, f"protocol {protocol_version} > {PROTOCOL_VERSION}"
        )
    init = ToServerInit(
        name=_of(frame, "name", str),
        version=_of(frame, "version", str),
        protocol_version=protocol_version,
        total_slots=_int(frame, "total_slots"),
        last_command_idx=_int(frame, "last_command_idx"),
        runner_id=_opt_runner_id(frame, "runner_id"),
        labels=_strs(frame, "labels"),
        metadata=_of(frame, "metadata", dict),
        actor_names=_strs(frame, "actor_names") if "actor_names" in frame else (),
        pool=_of(frame, "pool", str) if "pool" in frame else "default",
        actor_slots=_int(frame, "actor_slots") if "actor_slots" in frame else 0,
    )
    if why := init_problem(init):
        raise ProtocolError(INVALID_INIT, why)
    return init


def init_problem(init: ToServerInit) -> str | None:
    """Why the coordinator refuses what ``init`` says of the runner: the limits of
    ``POST /runner/register`` (``corral.runners``). None if it does not."""
    if not 1 <= init.total_slots <= runners.MAX_SLOTS:
        return f"'total_slots' must be in 1..{runners.MAX_SLOTS}"
    if len(init.labels) > runners.MAX_LABELS:
        return f"at most {runners.MAX_LABELS} labels"
    if len(init.actor_names) > runners.MAX_LABELS:
        return f"at most {runners.MAX_LABELS} actor names"
    if init.actor_slots > runners.MAX_SLOTS:
        return f"'actor_slots' must be in 0..{runners.MAX_SLOTS}"
    hostname = init.metadata.get("hostname", "")
    if not isinstance(hostname, str):
        return "'metadata.hostname' must be a string"
    if len(json.dumps(init.metadata)) > runners.METADATA_MAX_BYTES:
        return f"'metadata' is over {runners.METADATA_MAX_BYTES} bytes"
    texts = [
        ("name", init.name, runners.NAME_MAX_CHARS, True),
        ("version", init.version, runners.VERSION_MAX_CHARS, False),
        ("metadata.hostname", hostname, runners.HOSTNAME_MAX_CHARS, False),
        ("runner_id", init.runner_id or "", runners.RUNNER_ID_MAX_CHARS, False),
        *(("labels", label, runners.LABEL_MAX_CHARS, False) for label in init.labels),
        ("pool", init.pool, runners.NAME_MAX_CHARS, True),
        *(("actor_names", n, runners.NAME_MAX_CHARS, True) for n in init.actor_names),
    ]
    for name, text, most, required in texts:
        if why := runners.text_problem(text, most, required=required):
            return f"{name!r} {why}"
    return None


_TO_SERVER: dict[str, Callable[[_Frame], ToServerMessage]] = {
    "ToServerInit": _init,
    "ToServerEvents": lambda f: ToServerEvents(_indexed(f, "events")),
    "ToServerAckCommands": lambda f: ToServerAckCommands(_int(f, "last_command_idx")),
    "ToServerPing": lambda f: ToServerPing(_num(f, "ts")),
    "ToServerStopping": lambda f: ToServerStopping(),
    "ToServerKvRequest": lambda f: ToServerKvRequest(
        _int(f, "request_id", minimum=1),
        _of(f, "actor_id", str),
        _tagged(f, "op", "op"),
        None if f.get("generation") is None else _int(f, "generation"),
    ),
    "ToServerResponseStart": lambda f: ToServerResponseStart(
        _request_id(f),
        _int(f, "seq"),
        _int(f, "status", 100, 599),
        _headers(f),
        _data(f) if "data" in f else b"",  # optional: a runner before TUNNEL_WHOLE
        "end" in f and _bool(f, "end"),
    ),
    "ToServerResponseChunk": lambda f: ToServerResponseChunk(
        _request_id(f), _int(f, "seq"), _data(f), _bool(f, "text"), _more(f)
    ),
    "ToServerResponseEnd": lambda f: ToServerResponseEnd(_request_id(f), _int(f, "seq")),
    "ToServerResponseAbort": lambda f: ToServerResponseAbort(
        _request_id(f), _int(f, "seq"), _of(f, "code", str), _of(f, "reason", str)
    ),
    "ToServerTunnelAck": lambda f: ToServerTunnelAck(_request_id(f), _int(f, "seq")),
}
_TO_CLIENT: dict[str, Callable[[_Frame], ToClientMessage]] = {
    "ToClientInit": lambda f: ToClientInit(
        RunnerId(_of(f, "runner_id", str)), _int(f, "last_event_idx"), _of(f, "metadata", dict)
    ),
    "ToClientCommands": lambda f: ToClientCommands(
        _indexed(f, "commands"), _int(f, "ack_events") if "ack_events" in f else 0
    ),
    "ToClientAckEvents": lambda f: ToClientAckEvents(_int(f, "last_event_idx")),
    "ToClientPong": lambda f: ToClientPong(_num(f, "ts")),
    "ToClientDrain": lambda f: ToClientDrain(_num(f, "grace_s", minimum=0.0)),
    "ToClientClose": lambda f: ToClientClose(_of(f, "reason", str)),
    "ToClientKvResponse": lambda f: ToClientKvResponse(
        _int(f, "request_id", minimum=1), _of(f, "result", dict)
    ),
    "ToClientRequestStart": _request_start,
    "ToClientRequestChunk": lambda f: ToClientRequestChunk(
        _request_id(f), _int(f, "seq"), _data(f), _bool(f, "text"), _more(f)
    ),
    "ToClientRequestEnd": lambda f: ToClientRequestEnd(_request_id(f), _int(f, "seq")),
    "ToClientRequestAbort": lambda f: ToClientRequestAbort(_request_id(f), _int(f, "seq")),
    "ToClientTunnelAck": lambda f: ToClientTunnelAck(_request_id(f), _int(f, "seq")),
    "ToClientTunnelAcks": lambda f: ToClientTunnelAcks(_acks(f)),
}


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")  # json accepts NaN and Infinity unless told so


# One decoder for every frame: ``json.loads`` with an argument builds a new one each call.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


@overload
def decode(text: str | bytes, *, side: Literal["server"]) -> ToServerMessage: ...
@overload
def decode(text: str | bytes, *, side: Literal["client"]) -> ToClientMessage: ...
def decode(text: str | bytes, *, side: Literal["server", "client"]) -> Message:
    """Parse one frame; ``side`` is the end decoding it (the server reads ToServer*)."""
    decoders: Mapping[str, Callable[[_Frame], Message]]
    decoders = _TO_SERVER if side == "server" else _TO_CLIENT
    try:
        frame = _DECODER.decode(text if isinstance(text, str) else text.decode())
    except (ValueError, RecursionError) as exc:  # also UnicodeDecodeError, a ValueError
        raise ProtocolError(MALFORMED_FRAME, f"not JSON: {exc}") from exc
    if type(frame) is not dict:
        _malformed("a frame must be a JSON object")
    version = _get(frame, "v")
    if type(version) is not int:
        _malformed("'v' must be an integer")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(UNSUPPORTED_VERSION, f"v={version}, this end speaks {PROTOCOL_VERSION}")
    decoder = decoders.get(_of(frame, "type", str))
    if decoder is None:
        raise ProtocolError(UNKNOWN_MESSAGE, f"{frame['type']!r} is not a message to the {side}")
    return decoder(frame)
