"""Headers as an ordered list of (name, value) pairs with repeats, and records
without a value (tombstones), through every layer that stores or carries a
record: the stored batch, produce bodies (msgpack, stored batches), fetch
answers (JSON, NDJSON, msgpack, stored batches), the Python client and a
consumer group's poll, on a real broker. Batches written with headers as a
map still decode, as pairs in the map's order.
"""

from __future__ import annotations

import msgpack
import orjson
import pytest

from ring.client import Client, GroupConsumer
from ring.client.records import decode_fetch
from ring.errors import BadRequest, PayloadTooLarge
from ring.http_api import codec, fetch_codec
from ring.log import batch as batchfmt
from tests.brokers import Http, TestBroker

DUPS = [("a", b"1"), ("b", b"2"), ("a", b"3")]


def _one(records, **kw) -> bytes:
    return bytes(batchfmt.encode(records, now_ms=1_000, **kw))


# --- the stored batch -------------------------------------------------------------


def test_batch_keeps_header_order_and_repeats_and_records_without_value() -> None:
    data = _one([(None, b"k", b"v", DUPS), (None, b"k", None, None), (None, None, b"", [("x", None)])])
    _, recs = batchfmt.decode(data)
    assert recs[0].headers == DUPS and recs[0].value == b"v"
    assert recs[1].value is None and recs[1].headers is None
    assert recs[2].value == b"" and recs[2].headers == [("x", None)]  # empty is not absent


def test_batches_with_headers_as_a_map_still_decode_as_pairs() -> None:
    payload = msgpack.packb([[0, None, b"v", {"z": b"1", "a": None}], [1, None, b"w", None]], use_bin_type=True)
    old = batchfmt.encode_payload(payload, record_count=2, first_timestamp=5, max_timestamp=6)
    _, recs = batchfmt.decode(bytes(old))
    assert recs[0].headers == [("z", b"1"), ("a", None)] and recs[1].headers is None
    # and a client may still send that layout: validated, stored as it is, served as pairs
    assert codec.decode_batches(bytes(old)).record_count == 2


# --- produce bodies ---------------------------------------------------------------


def test_msgpack_body_headers_as_pairs_or_map_and_records_without_value() -> None:
    body = msgpack.packb([
        {"value": b"v", "headers": [["a", b"1"], ["b", "2"], ["a", b"3"]]},
        {"key": "k", "value": None},
        {"key": "k2"},  # no value at all: the same record without a value
        {"value": b"m", "headers": {"h": b"x"}},
    ], use_bin_type=True)
    r = codec.decode_msgpack(body, None)
    assert [rec[:3] for rec in r.records] == [(None, None, b"v"), (None, b"k", None), (None, b"k2", None),
                                              (None, None, b"m")]
    _, stored = batchfmt.decode(batchfmt.encode(r.records, now_ms=1))  # headers are kept packed until framed
    assert [s.headers for s in stored] == [DUPS, None, None, [("h", b"x")]]
    for bad in ({"value": b"x", "headers": [["a"]]}, {"value": b"x", "headers": [["a", 1]]},
                {"value": b"x", "headers": [[1, b"v"]]}, {"value": b"x", "headers": [["", b"v"]]},
                {"value": b"x", "headers": "a=1"}, {"value": b"x", "headers": [["a", b"1", b"2"]]}):
        with pytest.raises(BadRequest):
            codec.decode_msgpack(msgpack.packb(bad, use_bin_type=True), None)
    with pytest.raises(PayloadTooLarge):
        codec.decode_msgpack(msgpack.packb({"value": b"x", "headers": [["h", b""]] * 65}), None)


def test_arrays_nest_no_deeper_than_headers_pairs() -> None:
    """The unpackers build one record at a time and refuse any array but headers and their pairs."""
    for bad in ({"value": b"x", "headers": [[["a", b"1"]]]}, {"value": [b"x", b"y"]}, {"key": [[1, 2]]},
                {"value": b"x", "headers": [["a", {"m": 1}]]}, {"value": b"x", "headers": [[1, 2, 3]]}):
        with pytest.raises(BadRequest):
            codec.decode_msgpack(msgpack.packb(bad, use_bin_type=True), None)
    for bad in ([[0, None, b"v", [[["a", b"1"]]]]], [[0, [b"k"], b"v", None]], [[0, None, b"v", [["a", [b"1"]]]]],
                [[0, None, b"v", None, None]], [[[0, None, b"v", None]]]):
        raw = batchfmt.encode_payload(msgpack.packb(bad, use_bin_type=True), record_count=1,
                                      first_timestamp=0, max_timestamp=0)
        with pytest.raises(BadRequest):
            codec.decode_batches(bytes(raw))


def test_stored_batch_bodies_with_pairs_and_without_values_are_valid() -> None:
    good = _one([(None, b"k", None, DUPS), (None, None, b"v", None)])
    assert codec.decode_batches(good).record_count == 2
    flagged_json = _one([(None, b"k", None, None), (None, None, b'{"a":1}', None)], values_are_json=True)
    assert codec.decode_batches(flagged_json).record_count == 2
    for bad in ([[0, None, b"v", [["a", "not-bin"]]]], [[0, None, b"v", [["a"]]]], [[0, None, 5, None]],
                [[0, None, b"v", [[b"bin-name", b"v"]]]]):
        raw = batchfmt.encode_payload(msgpack.packb(bad, use_bin_type=True), record_count=1,
                                      first_timestamp=0, max_timestamp=0)
        with pytest.raises(BadRequest):
            codec.decode_batches(bytes(raw))


# --- fetch answers ----------------------------------------------------------------


def test_json_answer_tells_a_null_value_from_no_value() -> None:
    tomb = batchfmt.Record(1, 9, b"k", None, None)
    null = batchfmt.Record(2, 9, b"k", b"null", None)
    doc_tomb = orjson.loads(orjson.dumps(fetch_codec.record_json(tomb, True)))
    doc_null = orjson.loads(orjson.dumps(fetch_codec.record_json(null, True)))
    assert "value" not in doc_tomb and doc_null["value"] is None and "value" in doc_null
    assert doc_tomb["headers"] == []


def test_answers_carry_headers_as_ordered_pairs() -> None:
    rec = batchfmt.Record(3, 9, None, b"v", DUPS + [("n", None)])
    doc = orjson.loads(orjson.dumps(fetch_codec.record_json(rec, False)))
    assert doc["headers"] == [["a", "1"], ["b", "2"], ["a", "3"], ["n", None]]
    binary = batchfmt.Record(3, 9, None, b"v", [("a", b"\xff"), ("a", b"ok")])
    doc = orjson.loads(orjson.dumps(fetch_codec.record_json(binary, False)))
    assert doc["headers_encoding"] == "base64" and doc["headers"] == [["a", "/w=="], ["a", "b2s="]]
    packed = msgpack.unpackb(fetch_codec.encode_fetch(codec.CT_MSGPACK, "t", 0, [(rec, False)], 4, 4), raw=False)
    assert packed["records"][0]["headers"] == [["a", b"1"], ["b", b"2"], ["a", b"3"], ["n", None]]


def test_client_decodes_pairs_and_records_without_value() -> None:
    data = bytearray(_one([(None, b"k", None, DUPS), (None, None, b"v", None)]))
    recs, nxt = decode_fetch("t", 0, bytes(data), 0, 2, 10, None)
    assert [r.value for r in recs] == [None, b"v"] and recs[0].headers == DUPS and nxt == 2


# --- through a real broker ---------------------------------------------------------


def test_every_api_carries_pairs_and_records_without_value(broker: TestBroker, http: Http, topic: str) -> None:
    assert http.create_topic(topic, partitions=1).status == 201
    body = msgpack.packb([{"key": "k", "value": b"v", "headers": [["a", b"1"], ["b", b"2"], ["a", b"3"]]},
                          {"key": "k", "value": None}], use_bin_type=True)
    assert http.produce(topic, body, "application/msgpack").status == 200
    assert http.produce(topic, b"null", partition=0).status == 200  # a JSON null value

    docs = http.fetch(topic, 0).json()["records"]
    assert docs[0]["headers"] == [["a", "1"], ["b", "2"], ["a", "3"]]
    assert "value" not in docs[1] and docs[1]["key"] == "k"
    assert docs[2]["value"] is None and "value" in docs[2]
    lines = [orjson.loads(x) for x in http.fetch(topic, 0, accept="application/x-ndjson").body.splitlines()]
    assert lines == docs
    packed = msgpack.unpackb(http.fetch(topic, 0, accept="application/msgpack").body, raw=False)["records"]
    assert packed[0]["headers"] == [["a", b"1"], ["b", b"2"], ["a", b"3"]]
    assert packed[1]["value"] is None and packed[2]["value"] == b"null"

    with Client(broker.url) as c:
        c.produce(topic, b"w", key="k", headers=[("x", "1"), ("x", b"2")])
        c.produce(topic, None, key="k")  # Kafka's way to write a tombstone
        c.produce(topic, b"m", headers={"h": "map"})  # a map is still taken
        c.flush()
        got = c.fetch(topic, 0, 0).records
    assert [(r.value, r.headers) for r in got] == [
        (b"v", DUPS), (None, None), (b"null", None), (b"w", [("x", b"1"), ("x", b"2")]), (None, None),
        (b"m", [("h", b"map")])]
    assert not got[1].value_is_json and got[2].value_is_json

    polled: list = []
    with GroupConsumer([broker.url], f"g-{topic}", topic, wait_ms=300) as consumer:
        for _ in range(20):
            polled.extend(consumer.poll())
            if len(polled) >= len(got):
                break
    assert [(r.value, r.headers) for r in polled] == [(r.value, r.headers) for r in got]
