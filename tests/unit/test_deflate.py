"""The event streams' deflate: pieces compressed on their own make a valid zlib stream in
any order and number, whose trailer (Adler-32 combined from the pieces') zlib checks."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.coordinator.deflate import (
    DeflateStream,
    accepts_deflate,
    adler32_combine,
    compress,
)


@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(0, 3))
def test_adler32_combines_as_zlib_computes_the_whole(a: bytes, b: bytes, repeat: int) -> None:
    b = b * (70_000 * repeat // max(len(b), 1) + 1)  # past the modulus (65,521) too
    assert adler32_combine(zlib.adler32(a), zlib.adler32(b), len(b)) == zlib.adler32(a + b)


@given(st.lists(st.binary(max_size=2_000), max_size=8), st.lists(st.integers(0, 7), max_size=12))
def test_any_pieces_in_any_order_decompress_to_their_bytes_with_a_checked_trailer(
    plains: list[bytes], order: list[int]
) -> None:
    pieces = [compress(plain) for plain in plains]
    stream = DeflateStream()
    wire = b""
    sent = b""
    for index in order:
        if index < len(pieces):  # a piece sent to many streams, and more than once
            wire += stream.send(pieces[index])
            sent += plains[index]
    wire += stream.end()
    # zlib.decompress checks the header and the Adler-32 trailer: a wrong one raises.
    assert zlib.decompress(wire) == sent


def test_what_was_sent_decodes_in_full_before_the_stream_ends() -> None:
    """Each piece ends in a sync flush: a client reads each round's events at once."""
    stream = DeflateStream()
    reader = zlib.decompressobj()
    first = stream.send(compress(b"id: 1\ndata: {}\n\n"))
    assert reader.decompress(first) == b"id: 1\ndata: {}\n\n"
    assert reader.decompress(stream.send(compress(b"id: 2\n\n"))) == b"id: 2\n\n"


def test_a_trailer_that_lies_is_caught_by_zlib() -> None:
    """The check above is a real one: a wrong Adler-32 fails."""
    stream = DeflateStream()
    wire = stream.send(compress(b"hello")) + stream.end()
    with pytest.raises(zlib.error, match="incorrect data check"):
        zlib.decompress(wire[:-1] + bytes([wire[-1] ^ 1]))


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip, deflate, br, zstd", True),  # a browser's
        ("gzip, deflate", True),  # httpx's
        ("deflate;q=0.5", True),
        ("DEFLATE", True),
        ("*", True),
        ("gzip, *;q=0.1", True),
        ("deflate;q=0, *", False),  # named refusal beats the wildcard
        ("*;q=0", False),
        ("gzip", False),
        ("identity", False),
        ("", False),
        (None, False),
        ("deflate;q=zero", False),
    ],
)
def test_accept_encoding_decides_deflate(header: str | None, accepted: bool) -> None:
    assert accepts_deflate(header) is accepted
