"""The stored batch's CRC is zlib's CRC-32 whichever implementation computes it (ISA-L's when the
``isal`` package is installed): batches written by either are read by the other."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ring.log import batch as B


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 40))
def test_the_crc_is_zlibs(data: bytes, cut: int) -> None:
    buf = bytearray(data)
    assert B.crc32(memoryview(buf)[cut:]) == zlib.crc32(data[cut:])


def test_a_batch_framed_with_zlibs_crc_checks() -> None:
    buf = B.encode([(1_700_000_000_000, b"k", b"v" * 3000, None)], now_ms=1)
    assert B.read_header(buf).crc == zlib.crc32(memoryview(buf)[20:])
    assert B.check(bytes(buf)).record_count == 1
