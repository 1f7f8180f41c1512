"""A run's output on its way to the coordinator: split into lines, cut when too long, and
grouped into ``logs`` events the coordinator accepts.

    pipe bytes ──LineSplitter──▶ lines; one longer than ``max_line_bytes`` keeps its first
                                 ``max_line_bytes``, the rest (up to its newline) is
                                 skipped and counted — reading goes on
    line text ──stored_text────▶ what the log keeps: at most ``MAX_LOG_LINE_BYTES``
                                 encoded, with a marker saying how many bytes were cut
    lines ─────LogLines.take()─▶ ``logs`` events of at most ``MAX_LOG_LINES`` lines and
                                 ``MAX_EVENT_BYTES`` bytes each

Nothing is cut silently: a cut line ends with the marker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.protocol.limits import (
    LINE_OVERHEAD_BYTES,
    MAX_EVENT_BYTES,
    MAX_LOG_LINE_BYTES,
    MAX_LOG_LINES,
    text_size,
)

# Lines up to this long are read whole (stream-json carries big tool results in one line).
MAX_LINE_BYTES = 64 * 1024 * 1024
_EVENT_BUDGET = MAX_EVENT_BYTES - 256  # a logs event's lines; the rest is its own fields


@dataclass(frozen=True, slots=True)
class Line:
    data: bytes  # without its newline
    cut: int  # bytes of the line skipped after the first ``max_line_bytes``


class LineSplitter:
    """Bytes in, whole lines out; holds at most ``max_line_bytes`` of a line."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self._max = max_line_bytes
        self._partial = bytearray()
        self._cut = 0

    def feed(self, data: bytes) -> list[Line]:
        pieces = data.split(b"\n")
        self._keep(pieces[0])
        if len(pieces) == 1:
            return []
        lines = [self._take()]
        limit = self._max
        for piece in pieces[1:-1]:
            if len(piece) > limit:
                lines.append(Line(piece[:limit], len(piece) - limit))
            else:
                lines.append(Line(piece, 0))
        self._keep(pieces[-1])
        return lines

    def end(self) -> list[Line]:
        """The pipe closed: a last line without a newline, if any."""
        return [self._take()] if self._partial or self._cut else []

    def _keep(self, piece: bytes) -> None:
        room = self._max - len(self._partial)
        if len(piece) > room:
            self._partial += piece[:room]
            self._cut += len(piece) - room
        else:
            self._partial += piece

    def _take(self) -> Line:
        line = Line(bytes(self._partial), self._cut)
        self._partial.clear()
        self._cut = 0
        return line


def cut_marker(cut_bytes: int) -> str:
    return f" [corral: {cut_bytes} more bytes of this line were cut]"


def stored_text(text: str, cut_bytes: int = 0, max_bytes: int = MAX_LOG_LINE_BYTES) -> str:
    """``text`` as the log keeps it: NUL as U+FFFD, at most ``max_bytes`` encoded; if any of
    the line was cut (here, or ``cut_bytes`` when it was read) it ends with a marker saying
    how much."""
    if "\x00" in text:  # no database keeps NUL in text: shown as a byte that was unreadable
        text = text.replace("\x00", "\ufffd")
    # A character encodes to at most 12 bytes ("\\ud83d\\ude00"): most lines need no look.
    if not cut_bytes and (len(text) * 12 + 2 <= max_bytes or text_size(text) <= max_bytes):
        return text
    room = max_bytes - len(cut_marker(2**63))
    keep = len(text)
    while (size := text_size(text[:keep])) > room:
        keep = max(0, keep * room // size - 1)  # shrinks fast: sizes are near proportional
    cut_bytes += len(text[keep:].encode(errors="surrogatepass"))
    return text[:keep] + cut_marker(cut_bytes)


class LogLines:
    """Output lines waiting to be reported, taken as the lines of ``logs`` events."""

    def __init__(self) -> None:
        self._lines: list[tuple[dict[str, Any], int]] = []  # with its encoded size
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, line_no: int, stream: str, text: str, ts: float) -> None:
        size = text_size(text) + LINE_OVERHEAD_BYTES
        self._lines.append(({"line_no": line_no, "stream": stream, "text": text, "ts": ts}, size))
        self._bytes += size

    @property
    def full(self) -> bool:
        """A whole event's worth is waiting."""
        return len(self._lines) >= MAX_LOG_LINES or self._bytes >= _EVENT_BUDGET

    def take(self) -> list[list[dict[str, Any]]]:
        """Every waiting line, in order, as chunks that each fit one ``logs`` event."""
        chunks: list[list[dict[str, Any]]] = []
        chunk: list[dict[str, Any]] = []
        size = 0
        for line, line_size in self._lines:
            if chunk and (len(chunk) >= MAX_LOG_LINES or size + line_size > _EVENT_BUDGET):
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(line)
            size += line_size
        if chunk:
            chunks.append(chunk)
        self._lines, self._bytes = [], 0
        return chunks
