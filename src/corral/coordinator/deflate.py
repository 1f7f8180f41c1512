"""``Content-Encoding: deflate`` for event streams, each round's events compressed once for
every stream that sends them.

Fifty streams sending the same events would cost fifty times their bytes through the
kernel (on loopback, ~0.5 µs of the coordinator's CPU a KB: with fifty dashboards, most
of what the streams cost it); compressed, they cost a twentieth of that. A deflate stream
per connection would compress the same bytes fifty times over, so instead each piece is
compressed on its own (a fresh compressor, ending in a sync flush: byte-aligned, no
reference to anything before it) and such pieces, laid one after the other, make a valid
deflate stream whichever pieces a connection sends. A connection keeps only what the zlib
trailer needs: the Adler-32 of everything it sent, which combines from the pieces' own in
constant time (``adler32_combine``), without reading their bytes again.

    HEADER  piece  piece  …  END + Adler-32 of all the plain bytes (big-endian)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

# The zlib header (RFC 1950): deflate with a 32 KiB window, no preset dictionary, the level
# field saying "fastest" (informative only). The body is raw deflate.
HEADER = b"\x78\x01"
END = b"\x03\x00"  # an empty final block (fixed Huffman codes): the deflate stream ends
LEVEL = 1  # ~0.4 µs an event and 15–20x smaller on a round's events; level 6 is 3x slower
ADLER_BASE = 65521


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes compressed on their own, ready to follow any other piece."""

    data: bytes  # raw deflate blocks ending in a sync flush
    adler: int  # Adler-32 of the plain bytes
    size: int  # how many plain bytes


def compress(plain: bytes) -> Piece:
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    data = compressor.compress(plain) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return Piece(data, zlib.adler32(plain), len(plain))


def adler32_combine(first: int, second: int, second_size: int) -> int:
    """The Adler-32 of A + B from that of A, that of B and B's length (zlib's
    ``adler32_combine``, which Python's zlib does not offer)."""
    shift = second_size % ADLER_BASE
    a1, b1 = first & 0xFFFF, first >> 16
    a2, b2 = second & 0xFFFF, second >> 16
    # a = 1 + Σ bytes, b = Σ a over the bytes: B's own "1" is counted once, not twice.
    a = (a1 + a2 - 1) % ADLER_BASE
    b = (b1 + b2 + shift * a1 - shift) % ADLER_BASE
    return a | (b << 16)


def accepts_deflate(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header admits deflate (by name, or by ``*``, with a
    quality above zero)."""
    named: bool | None = None
    wildcard = False
    for item in (accept_encoding or "").split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        if coding not in ("deflate", "*"):
            continue
        accepted = _quality(params) > 0
        if coding == "deflate":
            named = accepted
        else:
            wildcard = accepted
    return wildcard if named is None else named


def _quality(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


class DeflateStream:
    """What one connection sent of its deflate stream: enough for its trailer."""

    def __init__(self) -> None:
        self.adler = 1  # Adler-32 of nothing
        self.started = False

    def send(self, piece: Piece) -> bytes:
        self.adler = adler32_combine(self.adler, piece.adler, piece.size)
        if self.started:
            return piece.data
        self.started = True
        return HEADER + piece.data

    def end(self) -> bytes:
        start = b"" if self.started else HEADER
        self.started = True
        return start + END + self.adler.to_bytes(4, "big")
