"""Unit tests of the wire-format codecs and the topic catalogue (pure code, no sockets)."""

from __future__ import annotations

import msgpack
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import limits
from ring.catalog import Catalog, TopicConfig, validate_topic_name
from ring.errors import BadRequest, Conflict, InvalidTopicName, PayloadTooLarge, StorageError, UnknownTopic
from ring.http_api import codec, fetch_codec
from ring.log import batch as batchfmt
from ring.log import selection

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(alphabet='ab[]{}"\\ ', max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=30,
)


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_depth_matches_the_structure(value) -> None:
    assert codec.json_depth(orjson.dumps(value)) == _depth(value)


@settings(max_examples=100, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=5))
def test_json_arrays_round_trip_as_compact_values(events) -> None:
    decoded = codec.decode_json(orjson.dumps(events), None)
    assert [orjson.loads(r[2]) for r in decoded.records] == events
    assert decoded.values_are_json and not decoded.keyed


def test_json_depth_limit_counts_the_event_not_the_top_level_array() -> None:
    d = limits.JSON_DEPTH_MAX
    codec.decode_json(("[" + "[" * d + "]" * d + "]").encode(), None)
    with pytest.raises(BadRequest):
        codec.decode_json(('{"a":' + "[" * d + "]" * d + "}").encode(), None)
    with pytest.raises(BadRequest):
        codec.decode_json(b"[" * 100_000 + b"]" * 100_000, None)


def test_msgpack_records() -> None:
    body = msgpack.packb([{"value": b"a", "key": "k", "headers": {"h": "v"}, "timestamp": 7}, {"value": "b"}])
    r = codec.decode_msgpack(body, b"q")
    # Headers are kept as the bytes they are stored as until the records are framed.
    packed = batchfmt.PackedHeaders(msgpack.packb([["h", b"v"]], use_bin_type=True))
    assert r.records == [(7, b"k", b"a", packed), (None, b"q", b"b", None)] and r.keyed
    assert type(r.records[0][3]) is batchfmt.PackedHeaders
    _, (first, _) = batchfmt.decode(batchfmt.encode(r.records, now_ms=9))
    assert first.headers == [("h", b"v")]
    for bad in ({"value": 1}, {"value": b"x", "timestamp": True}, {"value": b"x", "headers": {"h": 1}},
                {"value": b"x", "headers": {"": b"v"}}, [1], {"value": b"x", "key": 5}):
        with pytest.raises(BadRequest):
            codec.decode_msgpack(msgpack.packb(bad), None)
    with pytest.raises(PayloadTooLarge):
        codec.decode_msgpack(msgpack.packb({"value": b"x", "headers": {str(i): b"" for i in range(65)}}), None)


def test_batches_validate_without_decoding_records() -> None:
    good = batchfmt.encode([(None, b"k", b"v", {"h": b"1"}), (5, None, b"w", None)], now_ms=1)
    assert codec.decode_batches(bytes(good) * 3).record_count == 6
    bad_headers = batchfmt.encode_payload(msgpack.packb([[0, None, b"v", {"h": "str-not-bin"}]]),
                                          record_count=1, first_timestamp=0, max_timestamp=0)
    with pytest.raises(BadRequest):
        codec.decode_batches(bytes(bad_headers))
    wrong_count = batchfmt.encode_payload(msgpack.packb([[0, None, b"v", None]]),
                                          record_count=2, first_timestamp=0, max_timestamp=0)
    with pytest.raises(BadRequest):
        codec.decode_batches(bytes(wrong_count))


def test_batch_records_over_the_size_limits_are_413() -> None:
    def one(key: bytes | None, value: bytes, headers: dict | None = None) -> bytes:
        return bytes(batchfmt.encode([(None, key, value, headers)], now_ms=1))

    at_limit = b"x" * limits.MESSAGE_BYTES_MAX
    assert codec.decode_batches(one(None, at_limit)).record_count == 1  # the limit itself is allowed
    for oversized in (one(None, at_limit + b"x"),  # a value
                      one(b"k" * (limits.KEY_BYTES_MAX + 1), b"v"),  # a key
                      one(None, b"v", {"h": at_limit + b"x"})):  # a header's value
        with pytest.raises(PayloadTooLarge):
            codec.decode_batches(oversized)
    torn = one(None, b"v")[:-1]
    with pytest.raises(Exception) as exc:  # torn: a CRC or framing error, never a 413
        codec.decode_batches(torn)
    assert not isinstance(exc.value, PayloadTooLarge)


def test_a_stored_record_counts_key_value_and_headers_against_the_record_limit() -> None:
    # As a msgpack produce of the same record does (413): "one record (key + value + headers)".
    half = limits.MESSAGE_BYTES_MAX // 2
    record = (None, b"k", b"v" * half, [("h", b"x" * half)])
    with pytest.raises(PayloadTooLarge):
        codec.decode_msgpack(msgpack.packb({"key": b"k", "value": b"v" * half, "headers": [["h", b"x" * half]]}),
                             None)
    plain = bytes(batchfmt.encode([record], now_ms=1))
    assert len(plain) < limits.BATCH_BYTES_MAX
    big = (None, None, b"v" * limits.MESSAGE_BYTES_MAX, [(f"h{i}", b"x" * limits.MESSAGE_BYTES_MAX) for i in range(8)])
    squeezed = bytes(batchfmt.encode([big], now_ms=1, codec=batchfmt.CODEC_ZSTD))  # 9 MiB in a few KiB
    assert len(squeezed) < limits.BATCH_BYTES_MAX
    for body in (plain, squeezed):
        with pytest.raises(PayloadTooLarge):
            codec.decode_batches(body)
    fits = (None, b"k", b"v" * (half - 8), [("h", b"x" * half)])  # 1 + half - 8 + 1 + half bytes
    assert codec.decode_batches(bytes(batchfmt.encode([fits] * 3, now_ms=1, codec=batchfmt.CODEC_ZSTD))
                                ).record_count == 3


def test_a_compressed_batch_that_inflates_too_far_is_refused() -> None:
    import zstandard

    payload = msgpack.packb([[0, None, b"x" * (limits.REQUEST_BYTES_MAX + 1), None]])
    bomb = batchfmt.encode_payload(payload, record_count=1, first_timestamp=0, max_timestamp=0,
                                   codec=batchfmt.CODEC_ZSTD)
    assert len(bomb) < limits.BATCH_BYTES_MAX and zstandard.frame_content_size(bytes(bomb[54:72])) > 0
    with pytest.raises(PayloadTooLarge):
        codec.decode_batches(bytes(bomb))
    lz = batchfmt.encode_payload(payload, record_count=1, first_timestamp=0, max_timestamp=0, codec=batchfmt.CODEC_LZ4)
    with pytest.raises(PayloadTooLarge):
        codec.decode_batches(bytes(lz))


def test_fetch_type_negotiation() -> None:
    assert codec.fetch_type(None) == codec.CT_JSON
    assert codec.fetch_type("text/html, */*") == codec.CT_JSON
    assert codec.fetch_type("application/x-msgpack") == codec.CT_MSGPACK
    assert codec.fetch_type("text/html;q=0.9, application/vnd.ring.batches") == codec.CT_BATCHES


def test_select_records_filters_below_offset_and_at_high_watermark() -> None:
    b1 = batchfmt.encode([(None, None, b"%d" % i, None) for i in range(5)], now_ms=1)
    batchfmt.stamp(b1, 0, 10, 0)
    b2 = batchfmt.encode([(None, None, b"%d" % i, None) for i in range(5, 8)], now_ms=1)
    batchfmt.stamp(b2, 0, 15, 0)
    data = bytes(b1) + bytes(b2)
    sel, nxt = selection.select_records(data, 12, 100, 18)
    assert [r.offset for r, _ in sel] == [12, 13, 14, 15, 16, 17] and nxt == 18
    sel, nxt = selection.select_records(data, 12, 2, 18)
    assert [r.offset for r, _ in sel] == [12, 13] and nxt == 14
    assert selection.batches_next_offset(data, 12) == 18


def test_record_json_encodings() -> None:
    rec = batchfmt.Record(3, 9, b"\xff", b"\xfe\x00", [("a", b"ok"), ("b", b"\xff"), ("c", None)])
    doc = orjson.loads(orjson.dumps(fetch_codec.record_json(rec, False)))
    assert doc["key_encoding"] == doc["value_encoding"] == doc["headers_encoding"] == "base64"
    assert doc["headers"][2] == ["c", None]
    rec = batchfmt.Record(3, 9, b"k", b'{"a":1}', None)
    assert orjson.loads(orjson.dumps(fetch_codec.record_json(rec, True)))["value"] == {"a": 1}


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\x00", "é", "x" * 250, "a b", None, 5])
def test_invalid_topic_names(name) -> None:
    with pytest.raises(InvalidTopicName):
        validate_topic_name(name)


def test_topic_config_validation_and_catalog_round_trip() -> None:
    cfg = TopicConfig.from_request({"name": "a.b_c-1", "partitions": 3, "compression": "lz4"}, now_ms=5)
    assert cfg.partitions == 3 and cfg.created_ms == 5
    for bad in ({"name": "x", "partitions": 0}, {"name": "x", "partitions": True}, {"name": "x", "retention_ms": 0},
                {"name": "x", "segment_bytes": 10}, {"name": "x", "compression": "gzip"}, {"name": "x", "zzz": 1},
                [], {"partitions": 2}):
        with pytest.raises(BadRequest):
            TopicConfig.from_request(bad, now_ms=0)
    cat = Catalog()
    cat.add(cfg)
    with pytest.raises(Conflict):
        cat.add(cfg)
    again = Catalog.loads(cat.dumps())
    assert list(again) == [cfg] and again.version == 1
    with pytest.raises(UnknownTopic):
        again.get("nope")
    with pytest.raises(StorageError):
        Catalog.loads(b'{"topics": [{"name": "../etc"}]}')
