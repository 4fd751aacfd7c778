"""Kafka's wire primitives and RecordBatch v2 codec (ring.kafka_api.wire, ring.kafka_api.records): round
trips, agreement with kafka-python's own codec, and hostile input refused with a clear error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from ring import limits
from ring.errors import BadRequest, CorruptBatch, PayloadTooLarge
from ring.kafka_api import records
from ring.kafka_api.wire import Malformed, Reader, Writer, read_header
from ring.log import batch as batchfmt

ints32 = st.integers(-2**31, 2**31 - 1)
ints64 = st.integers(-2**63, 2**63 - 1)
texts = st.text(max_size=40)
blobs = st.binary(max_size=60)


@settings(deadline=None)  # (a loaded machine makes a deadline a coin toss)
@given(st.lists(st.tuples(st.integers(-128, 127), st.integers(-2**15, 2**15 - 1), ints32, ints64,
                          ints32, ints64, texts, st.none() | texts, st.none() | blobs, st.booleans()),
                max_size=5))
def test_primitives_round_trip(rows):
    w = Writer()
    w.array_len(len(rows))
    for i8, i16, i32, i64, v32, v64, s, ns, nb, flag in rows:
        w.int8(i8).int16(i16).int32(i32).int64(i64).varint(v32).uvarint(zigzag64(v64))
        w.string(s).nullable_string(ns).nullable_bytes(nb).boolean(flag)
        w.compact_string(ns).compact_bytes(nb).compact_array_len(1).int8(7).tagged_fields()
    r = Reader(bytes(w.buf))

    def row(r: Reader):
        got = (r.int8(), r.int16(), r.int32(), r.int64(), r.varint(), r.varlong(), r.string(), r.nullable_string(),
               _b(r.nullable_bytes()), r.boolean(), r.compact_nullable_string(), _b(r.compact_nullable_bytes()),
               r.compact_array(Reader.int8))
        r.tagged_fields()
        return got

    assert r.array(row) == [(*t[:10], t[7], t[8], [7]) for t in rows]
    assert r.left == 0


def zigzag64(v: int) -> int:
    return (v << 1) ^ (v >> 63)


def _b(v):
    return None if v is None else bytes(v)


@settings(deadline=None)
@given(st.binary(max_size=40))
def test_truncated_or_lying_input_is_malformed_never_another_error(data):
    """Every reader call on arbitrary bytes either returns or raises Malformed."""
    for call in (Reader.string, Reader.nullable_bytes, Reader.compact_string, Reader.varlong,
                 lambda r: r.array(Reader.string), lambda r: r.compact_array(Reader.int64), Reader.tagged_fields):
        try:
            call(Reader(data))
        except Malformed:
            pass


def test_an_array_count_past_the_frame_is_refused_before_any_entry_is_made():
    with pytest.raises(Malformed, match="entries"):
        Reader(struct.pack(">i", 2**31 - 1) + b"\x00" * 8).array(Reader.int8)
    with pytest.raises(Malformed, match="runs past"):
        Reader(struct.pack(">i", 1 << 30)).nullable_bytes()


def test_request_headers_v1_and_v2():
    v1 = Writer().int16(0).int16(8).int32(42).nullable_string("me").int32(5)
    r = Reader(bytes(v1.buf))
    assert read_header(r, lambda k, v: False) == (0, 8, 42, "me", "")  # the listener fills in the client's host
    assert r.int32() == 5
    v2 = Writer().int16(18).int16(3).int32(7).nullable_string(None).uvarint(1).uvarint(9).uvarint(2).raw(b"xy")
    r = Reader(bytes(v2.buf) + b"\x01")
    assert read_header(r, lambda k, v: True) == (18, 3, 7, None, "")
    assert r.int8() == 1


record_lists = st.lists(st.tuples(st.integers(0, 2**41), st.none() | blobs, st.none() | blobs,
                                  st.lists(st.tuples(st.text(min_size=1, max_size=10), st.none() | blobs),
                                           max_size=3)),
                        min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(record_lists, st.integers(0, 2**40), ints32, st.sampled_from([records.COMPRESSION_NONE,
                                                                     records.COMPRESSION_GZIP]))
def test_batch_round_trip(recs, base, epoch, compression):
    buf = records.encode_batch(base, epoch, recs, compression)
    got = records.decode_batches(bytes(buf))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (base + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(recs)]


def test_lengths_on_each_side_of_a_varints_one_two_and_three_byte_forms_decode():
    """The record reader reads varints of one and two bytes in place and longer ones by a call: keys, values,
    records and timestamp deltas of every width, both signs, decode as written (in Kafka's own encoder too)."""
    sizes = [0, 1, 63, 64, 65, 127, 128, 8191, 8192, 8193, 70_000]
    base_ts = 1_700_000_000_000
    recs = [(base_ts + delta, b"k" * ks if ks else None, b"v" * vs, [("h", b"x" * hs)] if hs >= 0 else [])
            for delta, ks, vs, hs in zip([0, 1, -1, 63, -64, 64, -65, 8191, -8192, 2**20, -(2**20)],
                                         sizes, reversed(sizes), [-1, 0, 64, 8192, -1, 1, -1, 128, -1, 65, -1])]
    got = records.decode_batches(bytes(records.encode_batch(5, 0, recs)))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (5 + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(recs)]
    theirs = DefaultRecordBatchBuilder(2, DefaultRecordBatch.CODEC_NONE, False, -1, -1, -1, 1 << 30)
    for i, (ts, k, v, h) in enumerate(recs):
        theirs.append(i, ts, k, v, h)
    got = records.decode_batches(bytes(theirs.build()))
    assert [(r.timestamp, r.key, r.value, r.headers) for r in got] == [(ts, k, v, h) for ts, k, v, h in recs]
    ours = DefaultRecordBatch(bytes(records.encode_batch(5, 0, recs)))  # what a fetch answers, read by Kafka's codec
    assert ours.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value, [tuple(x) for x in r.headers]) for r in ours] == [
        (5 + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(recs)]


@settings(max_examples=40, deadline=None)
@given(record_lists, st.sampled_from([DefaultRecordBatch.CODEC_NONE, DefaultRecordBatch.CODEC_GZIP]))
def test_kafka_pythons_batches_decode_and_ours_decode_in_kafka_python(recs, codec):
    """Two codecs written apart agree both ways: a bug mirrored in encode and decode shows here."""
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 30)
    for i, (ts, k, v, h) in enumerate(recs):
        builder.append(i, ts, k, v, [(n, b) for n, b in h])
    theirs = bytes(builder.build())
    got = records.decode_batches(theirs)
    assert [(r.timestamp, r.key, r.value, r.headers) for r in got] == [(ts, k, v, h) for ts, k, v, h in recs]
    ours = DefaultRecordBatch(bytes(records.encode_batch(100, 3, recs)))
    assert ours.validate_crc() and ours.base_offset == 100 and ours.leader_epoch == 3
    assert [(r.offset, r.timestamp, r.key, r.value, [tuple(x) for x in r.headers]) for r in ours] == [
        (100 + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(recs)]


def test_stored_batches_become_kafka_batches_with_their_offsets():
    stored = bytearray()
    for base, recs in ((10, [(1000, b"k", b"v", [("h", b"1"), ("h", None)])]),
                       (11, [(2000, None, None, None), (2001, b"a", b"", None)])):
        one = batchfmt.encode(recs, now_ms=0)
        batchfmt.stamp(one, 0, base, 4)
        stored += one
    got = records.decode_batches(bytes(records.from_stored(bytes(stored))))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (10, 1000, b"k", b"v", [("h", b"1"), ("h", None)]), (11, 2000, None, None, []), (12, 2001, b"a", b"", [])]


def _one() -> bytearray:
    return records.encode_batch(0, 0, [(5, b"k", b"v", [])])


def test_a_bad_crc_is_a_corrupt_batch():
    buf = _one()
    buf[-1] ^= 1
    with pytest.raises(CorruptBatch, match="CRC"):
        records.decode_batches(bytes(buf))


@pytest.mark.parametrize("cut", [1, 30, 61, 64])
def test_a_truncated_batch_is_a_corrupt_batch(cut):
    with pytest.raises(CorruptBatch):
        records.decode_batches(bytes(_one()[:cut]))


def _recrc(buf: bytearray) -> bytes:
    from crc32c import crc32c

    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def test_a_batch_that_lies_about_its_count_is_refused():
    buf = records.encode_batch(0, 0, [(5, b"k", b"v", []), (6, b"k", b"w", [])])
    struct.pack_into(">i", buf, 57, 3)  # three records claimed, two there
    with pytest.raises(CorruptBatch):
        records.decode_batches(_recrc(buf))
    struct.pack_into(">i", buf, 57, 1)  # one claimed, two there
    with pytest.raises(CorruptBatch, match="past"):
        records.decode_batches(_recrc(buf))


def test_unread_compressions_and_magics_are_unsupported():
    buf = _one()
    struct.pack_into(">h", buf, 21, 5)  # no codec: Kafka's are 0-4
    with pytest.raises(records.Unsupported, match="compression 5"):
        records.decode_batches(_recrc(buf))
    buf = _one()
    buf[16] = 1
    with pytest.raises(records.Unsupported, match="magic"):
        records.decode_batches(bytes(buf))


def test_a_gzip_bomb_is_refused_past_the_request_bound():
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = packer.compress(b"\x00" * (limits.REQUEST_BYTES_MAX + 1)) + packer.flush()
    buf = bytearray(records.HEADER_SIZE)
    records.HEADER.pack_into(buf, 0, 0, records._LENGTH_BASE + len(bomb), 0, 2, 0, 1, 0, 0, 0, -1, -1, -1, 1)
    buf += bomb
    with pytest.raises(PayloadTooLarge):
        records.decode_batches(_recrc(buf))


def test_too_many_headers_on_a_record_is_a_bad_request():
    buf = records.encode_batch(0, 0, [(5, None, b"v", [("h", b"")] * (limits.HEADERS_PER_RECORD_MAX + 1))])
    with pytest.raises(BadRequest, match="headers"):
        records.decode_batches(bytes(buf))


def test_acks_map_to_consistency_levels():
    from ring.kafka_api.produce import consistency_of

    assert [consistency_of(acks) for acks in (0, 1, -1)] == ["one", "one", None]  # None: the topic's own
    with pytest.raises(BadRequest):
        consistency_of(2)
