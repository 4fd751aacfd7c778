"""Produce and fetch through a real broker process, in every content type."""

from __future__ import annotations

import base64
import threading
import time

import msgpack
import orjson
import pytest

from ring.hashing import partition_for_key
from ring.log import batch as batchfmt
from tests.brokers import Http
from tests.support import wait_for

pytestmark = pytest.mark.integration

EVENTS = [
    {"user": "u1", "page": "/home", "n": 1, "nested": {"a": [1, 2, {"b": None}]}},
    [1, "two", 3.5, True, None],
    "just a string",
    42,
    {"unicode": "héllo ✓", "empty": {}},
]


def _records(http: Http, topic: str, partition: int, **query) -> list[dict]:
    r = http.fetch(topic, partition, **query)
    assert r.status == 200, r.body
    return r.json()["records"]


def test_json_events_come_back_as_the_same_json_values(http: Http, topic: str) -> None:
    r = http.produce(topic, orjson.dumps(EVENTS), partition=2)
    assert r.status == 200, r.body
    assert r.json() == {"topic": topic, "partition": 2, "base_offset": 0, "count": len(EVENTS)}
    r = http.produce(topic, orjson.dumps({"single": True}), partition=2)
    assert r.json()["base_offset"] == len(EVENTS) and r.json()["count"] == 1
    doc = http.fetch(topic, 2).json()
    assert [rec["value"] for rec in doc["records"]] == EVENTS + [{"single": True}]
    assert [rec["offset"] for rec in doc["records"]] == list(range(len(EVENTS) + 1))
    assert doc["next_offset"] == doc["high_watermark"] == len(EVENTS) + 1
    assert all(rec["key"] is None and rec["headers"] == [] for rec in doc["records"])
    assert all(abs(rec["timestamp"] - time.time() * 1000) < 60_000 for rec in doc["records"])


def test_fetch_from_an_offset_inside_a_batch_skips_the_records_before_it(http: Http, topic: str) -> None:
    http.produce(topic, orjson.dumps(list(range(10))), partition=0)
    doc = http.fetch(topic, 0, offset=4, max_records=3).json()
    assert [(r["offset"], r["value"]) for r in doc["records"]] == [(4, 4), (5, 5), (6, 6)]
    assert doc["next_offset"] == 7
    doc = http.fetch(topic, 0, offset=10).json()
    assert doc["records"] == [] and doc["next_offset"] == 10


def test_ndjson_in_and_out(http: Http, topic: str) -> None:
    body = b'{"a": 1}\n\n   \n[1, 2]\n"s"\n'
    r = http.produce(topic, body, "application/x-ndjson", partition=1)
    assert r.status == 200 and r.json()["count"] == 3
    r = http.fetch(topic, 1, accept="application/x-ndjson")
    assert r.status == 200 and r.content_type == "application/x-ndjson"
    lines = [orjson.loads(line) for line in r.body.splitlines()]
    assert [line["value"] for line in lines] == [{"a": 1}, [1, 2], "s"]
    assert r.headers["Ring-Next-Offset"] == "3" and r.headers["Ring-High-Watermark"] == "3"


def test_text_plain_is_one_raw_value(http: Http, topic: str) -> None:
    r = http.produce(topic, "hello wörld\n{not json".encode(), "text/plain", partition=0, key="k1")
    assert r.status == 200 and r.json()["count"] == 1
    (rec,) = _records(http, topic, 0)
    assert rec["value"] == "hello wörld\n{not json" and rec["key"] == "k1"
    assert "value_encoding" not in rec


def test_msgpack_records_with_keys_headers_timestamps_and_binary(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=4)
    items = [
        {"value": b"\xff\x00binary", "key": "alice", "headers": {"h1": b"v1", "h2": "text"}, "timestamp": 1_600_000_000_000},
        {"value": "text value", "key": "bob"},
        {"value": b"plain"},
    ]
    r = http.produce(topic, msgpack.packb(items, use_bin_type=True), "application/msgpack")
    assert r.status == 200, r.body
    doc = r.json()
    results = doc["results"] if "results" in doc else [doc]
    assert sum(x["count"] for x in results) == 3
    where = {x["partition"] for x in results}
    assert partition_for_key(b"alice", 4) in where and partition_for_key(b"bob", 4) in where

    alice_p = partition_for_key(b"alice", 4)
    json_recs = [rec for rec in _records(http, topic, alice_p) if rec["key"] == "alice"]
    (rec,) = json_recs
    assert rec["value_encoding"] == "base64" and base64.b64decode(rec["value"]) == b"\xff\x00binary"
    assert rec["headers"] == [["h1", "v1"], ["h2", "text"]] and rec["timestamp"] == 1_600_000_000_000

    r = http.fetch(topic, alice_p, accept="application/msgpack")
    assert r.content_type == "application/msgpack"
    doc = msgpack.unpackb(r.body, raw=False)
    (mrec,) = [x for x in doc["records"] if x["key"] == b"alice"]
    assert mrec["value"] == b"\xff\x00binary" and mrec["headers"] == [["h1", b"v1"], ["h2", b"text"]]
    assert doc["next_offset"] == doc["high_watermark"] and doc["topic"] == topic


def test_one_request_without_key_or_partition_lands_whole_on_one_partition(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=3)
    seen = []
    for i in range(3):
        r = http.produce(topic, orjson.dumps([i] * 5))
        assert r.status == 200 and r.json()["count"] == 5
        seen.append(r.json()["partition"])
    assert sorted(seen) == [0, 1, 2]  # round-robin across requests


def test_query_key_picks_the_partition_by_hash(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=5)
    r = http.produce(topic, orjson.dumps([1, 2]), key="user-7")
    assert r.json()["partition"] == partition_for_key(b"user-7", 5)


def test_stored_batches_in_and_out(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=1, retention_ms=-1)  # records of 2023: kept, no retention warning
    b1 = batchfmt.encode([(None, b"k", b"v0", {"h": b"x"}), (None, None, b"v1", None)], now_ms=1_700_000_000_000)
    b2 = batchfmt.encode([(1_700_000_000_005, None, b"v2", None)], now_ms=0, codec=batchfmt.CODEC_ZSTD)
    r = http.produce(topic, bytes(b1) + bytes(b2), "application/vnd.ring.batch", partition=0)
    assert r.status == 200, r.body
    assert r.json() == {"topic": topic, "partition": 0, "base_offset": 0, "count": 3}
    r = http.fetch(topic, 0, accept="application/vnd.ring.batches")
    assert r.content_type == "application/vnd.ring.batches"
    assert r.headers["Ring-Next-Offset"] == "3" and r.headers["Ring-High-Watermark"] == "3"
    records = [rec for h, pos in batchfmt.scan(r.body) for rec in batchfmt.decode(r.body, pos)[1]]
    assert [(rec.offset, rec.key, rec.value) for rec in records] == [(0, b"k", b"v0"), (1, None, b"v1"), (2, None, b"v2")]
    # the same records as JSON
    assert [rec["value"] for rec in _records(http, topic, 0)] == ["v0", "v1", "v2"]


def test_json_flagged_batches_are_served_as_json(http: Http, topic: str) -> None:
    b = batchfmt.encode([(None, None, b'{"x": [1, 2]}', None)], now_ms=1, values_are_json=True)
    assert http.produce(topic, bytes(b), "application/vnd.ring.batch", partition=0).status == 200
    assert _records(http, topic, 0)[0]["value"] == {"x": [1, 2]}


def test_long_poll_returns_when_data_arrives(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=1)
    result: dict = {}

    def poll() -> None:
        t0 = time.monotonic()
        result["reply"] = http.fetch(topic, 0, offset=0, wait_ms=10_000)
        result["took"] = time.monotonic() - t0

    parked = http.status()["long_polls_open"]
    t = threading.Thread(target=poll)
    t.start()
    wait_for("the fetch parked as a long poll", lambda: http.status()["long_polls_open"] > parked)
    assert http.produce(topic, b'{"late": true}', partition=0).status == 200
    t.join(15)
    assert result["reply"].status == 200
    assert [rec["value"] for rec in result["reply"].json()["records"]] == [{"late": True}]
    assert result["took"] < 5  # woken by the record, not by its 10 s wait


def test_long_poll_returns_empty_after_wait_ms(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=1)
    t0 = time.monotonic()
    r = http.fetch(topic, 0, offset=0, wait_ms=700)
    took = time.monotonic() - t0
    assert r.status == 200 and r.json()["records"] == [] and r.json()["next_offset"] == 0
    assert 0.6 < took < 5


def test_fetch_defaults_to_the_earliest_offset_and_respects_max_bytes(http: Http, topic: str) -> None:
    for i in range(4):
        http.produce(topic, orjson.dumps({"i": i, "pad": "x" * 1000}), partition=0)
    recs = _records(http, topic, 0, max_bytes=1)  # at least one whole batch
    assert [r["value"]["i"] for r in recs] == [0]
    assert [r["value"]["i"] for r in _records(http, topic, 0)] == [0, 1, 2, 3]
