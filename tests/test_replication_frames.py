"""Append frames are built and read without copying their batches twice, and stay the very bytes
msgpack gives for the frame's array (a broker of either kind reads the other's frames)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring.errors import BadRequest
from ring.replication import protocol

MAX_FRAME = 1 << 21
appends = st.builds(protocol.Append, st.text(min_size=1, max_size=249), st.integers(0, 2**31 - 1),
                    st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                    st.one_of(st.binary(max_size=300), st.sampled_from([b"x" * 70_000, b"y" * 256])))


@settings(max_examples=150, deadline=None)
@given(appends)
def test_an_append_frame_is_msgpacks_array_and_reads_back_as_a_view(frame: protocol.Append) -> None:
    raw = protocol.encode(frame)
    assert raw == msgpack.packb(frame.to_wire(), use_bin_type=True)
    back = protocol.decode(raw, MAX_FRAME)
    assert back == frame
    if frame.topic.isascii():  # a short head: the fast way, no copy of the data
        assert isinstance(back.data, memoryview)


@settings(max_examples=150, deadline=None)
@given(appends, st.integers(1, 40), st.integers(0, 255))
def test_a_cut_or_changed_append_frame_is_refused_or_read_as_what_it_says(frame: protocol.Append, cut: int,
                                                                        byte: int) -> None:
    raw = protocol.encode(frame)
    with pytest.raises(BadRequest):
        protocol.decode(raw[:-cut] if len(raw) > cut else b"", MAX_FRAME)
    changed = bytearray(raw)
    changed[min(len(raw) - 1, 9 + cut)] = byte
    try:
        got = protocol.decode(bytes(changed), MAX_FRAME)
    except BadRequest:
        return
    assert got == protocol.decode(bytes(changed), MAX_FRAME)  # whatever it reads, it reads it the same way
    assert msgpack.unpackb(bytes(changed), raw=False)[-1] == bytes(got.data)  # type: ignore[union-attr]
