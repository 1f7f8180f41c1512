"""How much one report, and one frame or request of reports, may carry: the limits both
ends of the runner link share.

The runner cuts what it sends to fit (a long line is cut with a marker, a busy run's
output becomes as many ``logs`` events as it takes, events travel in as many frames or
requests as they take); the coordinator refuses what does not fit — a WebSocket closed
with a protocol error, a 413/422 answer — and never acknowledges what it did not store.

Sizes are of the JSON text with every non-ASCII character escaped (what ``json.dumps``
writes by default): never less than the UTF-8 bytes on the wire.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from typing import Any

MAX_LOG_LINES = 5000  # lines in one ``logs`` event
MAX_LOG_LINE_BYTES = 1024 * 1024  # one stored line's text, encoded
MAX_EVENT_BYTES = 2 * 1024 * 1024  # one ``logs`` event, encoded
MAX_BATCH_EVENTS = 500  # events in one WebSocket frame or ``POST /runner/events``
MAX_BATCH_BYTES = 4 * 1024 * 1024  # their bodies, encoded; well under both limits below
MAX_FRAME_BYTES = 16 * 1024 * 1024  # a WebSocket frame the coordinator reads
# (``POST /runner/events`` bodies are bounded by the coordinator's ``max_body_bytes``, 8 MiB.)

# The tunnel (gateway ⇄ actor): a body travels in chunks, and a sender may be at most a
# window of unacknowledged bytes ahead of what its receiver has consumed.
MAX_TUNNEL_CHUNK_BYTES = 64 * 1024
# A tunnelled WebSocket message, whole (larger ones are split into chunks, then joined):
# a larger one closes the WebSocket with 1009.
MAX_TUNNEL_WS_MESSAGE_BYTES = 1024 * 1024
TUNNEL_WINDOW_BYTES = 1024 * 1024
MAX_TUNNEL_HEADER_BYTES = 64 * 1024  # a request's or response's header names and values
MAX_TUNNEL_REQUEST_ID_CHARS = 64
MAX_TUNNEL_ACKS = 1024  # acknowledgements in one ToClientTunnelAcks

# What a log line costs beyond its text: {"line_no":…,"stream":"stdout","text":…,"ts":…},
LINE_OVERHEAD_BYTES = 96


def text_size(text: str) -> int:
    """The encoded size of ``text`` as a JSON string, quotes included."""
    return len(encode_basestring_ascii(text))


def json_size(value: Any) -> int:
    """The encoded size of a JSON value (a report's body)."""
    return len(json.dumps(value, separators=(",", ":")))
