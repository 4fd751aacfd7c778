"""PolarStreams' wire formats (ring.http_api.polar_codec) and its consumer registry, without a broker."""

from __future__ import annotations

import orjson

from ring.http_api import polar_codec
from ring.http_api.polar_consumers import Consumer, Registry
from tests.polar_client import decode_binary, decode_json


def _records(*rows):
    return [{"topic": t, "partition": p, "offset": o, "timestamp": 1_700_000_000_000 + o, "value": v, "json": j}
            for t, p, o, v, j in rows]


def test_produce_bodies_split_as_polarstreams_splits_them() -> None:
    assert polar_codec.produce_values("application/json", b'[1,  2]') == ([b'[1,  2]'], True)
    assert polar_codec.produce_values("application/x-ndjson", b'{"a":1}\r\n\n{"b":2}') == (
        [b'{"a":1}', b'{"b":2}'], True)
    assert polar_codec.produce_values("application/x-ndjson", b'{"a":1}\nplain\n') == ([b'{"a":1}', b"plain"], False)
    assert polar_codec.produce_values("text/plain", b"raw\nbytes") == ([b"raw\nbytes"], False)
    assert polar_codec.produce_values("application/json", b"{not json") == ([b"{not json"], False)
    assert polar_codec.produce_values("application/x-ndjson", b"\n\r\n") == ([], False)


def test_items_are_runs_of_consecutive_offsets_of_one_partition() -> None:
    rows = _records(("t", 0, 4, b'{"n":4}', True), ("t", 0, 5, b'{"n":5}', True), ("t", 1, 0, b"x", False),
                    ("t", 0, 9, b'{"n":9}', True))
    items = polar_codec.items_of(rows, lambda t, p: 1000 + p, 7)
    assert [(i.partition, i.start_offset, len(i.records), i.token, i.version) for i in items] == [
        (0, 4, 2, 1000, 7), (1, 0, 1, 1001, 7), (0, 9, 1, 1000, 7)]


def test_binary_and_json_answers_decode_as_polarstreams_documents_them() -> None:
    rows = _records(("orders", 300, 10, b'{"a": 1}', True), ("orders", 300, 11, b"\xff\xfe", False),
                    ("orders", 2, 0, "näh".encode(), False))
    items = polar_codec.items_of(rows, lambda t, p: -(2**63) + p, 2**33 + 3)
    decoded = decode_binary(polar_codec.encode_binary(items))
    assert [(d.topic, d.token, d.range_index, d.version, d.start_offset, d.values) for d in decoded] == [
        ("orders", -(2**63) + 300, 300 % 256, 3, 10, [b'{"a": 1}', b"\xff\xfe"]),
        ("orders", -(2**63) + 2, 2, 3, 0, ["näh".encode()])]
    assert decoded[0].timestamps_us == [(1_700_000_000_000 + 10) * 1000, (1_700_000_000_000 + 11) * 1000]
    doc = orjson.loads(polar_codec.encode_json(items))
    assert doc[0] == {"topic": "orders", "token": str(-(2**63) + 300), "rangeIndex": 300, "version": 3,
                      "startOffset": "10", "values": [{"a": 1}, "//4="]}
    assert doc[1]["values"] == ["näh"]
    assert [i.start_offset for i in decode_json(polar_codec.encode_json(items))] == [10, 0]


def test_registry_forgets_idle_and_least_recently_used_ids() -> None:
    now = [0.0]
    reg = Registry(lambda: now[0], size_max=2, idle_s=120)
    a, b, c = (Consumer(n, "g", ("t",), "latest") for n in "abc")
    reg.put(a)
    reg.put(b)
    now[0] = 100
    assert reg.get("a") == a  # touched: b is now the least recently used
    reg.put(c)
    assert reg.get("b") is None and reg.get("c") == c
    now[0] = 221
    assert reg.get("a") is None  # idle past the session
    assert not Consumer("a", "g", ("t",), "latest").same_as(Consumer("a", "h", ("t",), "latest"))


def test_registry_binds_connections_by_their_handler_object() -> None:
    class Conn:
        pass

    reg = Registry(lambda: 0.0)
    conn, consumer = Conn(), Consumer("x", "g", ("t",), "earliest")
    reg.bind(conn, consumer)
    assert reg.bound(conn) == consumer and reg.bound(Conn()) is None and reg.bound("not weakly referable") is None
    del conn
    assert len(reg._by_conn) == 0  # the binding goes with the connection


def test_a_record_without_a_value_is_an_empty_value_in_binary_answers_and_null_in_json() -> None:
    """PolarStreams' formats have no record without a value (ring's tombstone): the binary answer
    carries an empty one, the JSON answer null."""
    rows = _records(("t", 0, 0, b"a", False), ("t", 0, 1, None, False), ("t", 0, 2, b'{"n":2}', True))
    items = polar_codec.items_of(rows, lambda t, p: 5, 1)
    assert decode_binary(polar_codec.encode_binary(items))[0].values == [b"a", b"", b'{"n":2}']
    assert orjson.loads(polar_codec.encode_json(items))[0]["values"] == ["a", None, {"n": 2}]
