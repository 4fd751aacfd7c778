"""Every kind of bad input gets the right status, a JSON error body, and changes nothing."""

from __future__ import annotations

import socket
import time

import msgpack
import orjson
import pytest

from ring import limits
from ring.log import batch as batchfmt
from tests.brokers import Http, Reply, TestBroker

pytestmark = pytest.mark.integration


def _is_error(r: Reply, status: int, code: str | None = None) -> dict:
    assert r.status == status, (r.status, r.body[:300])
    assert r.content_type == "application/json", r.headers
    doc = r.json()
    assert isinstance(doc["error"], str) and isinstance(doc["message"], str), doc
    if code is not None:
        assert doc["error"] == code, doc
    return doc


@pytest.fixture
def seeded(http: Http, topic: str) -> str:
    """A 2-partition topic holding a few records: bad requests must leave it as it is."""
    assert http.create_topic(topic, partitions=2).status == 201
    assert http.produce(topic, b"[1, 2, 3]", partition=0).status == 200
    return topic


def _unchanged(http: Http, topic: str) -> None:
    assert http.end_offsets(topic) == [3, 0]


@pytest.mark.parametrize("raw_name", ["..%2Fx", "%2E%2E%2Fetc", "a%00b", "a%20b", "caf%C3%A9", "x" * 250,
                                      "a%2Fb", "%2E", "%2E%2E", "a:b", "a%5Cb", "..", "."])
def test_bad_topic_names_are_400_and_create_nothing(http: Http, broker: TestBroker, raw_name: str) -> None:
    before = http.get("/v1/topics").json()
    for r in (
        http.request("POST", f"/v1/topics/{raw_name}/messages", body=b"{}", headers={"Content-Type": "application/json"}),
        http.request("GET", f"/v1/topics/{raw_name}"),
        http.request("GET", f"/v1/topics/{raw_name}/partitions/0/messages"),
    ):
        _is_error(r, 400, "invalid_topic_name")
    assert http.get("/v1/topics").json() == before
    names = {p.name for p in (broker.data_dir / "topics").iterdir()}
    assert all(limits.TOPIC_NAME_PATTERN.fullmatch(n) and n not in (".", "..") for n in names)
    assert not (broker.data_dir.parent / "x").exists() and not (broker.data_dir / "x").exists()


def test_dot_dot_slash_topic_is_rejected_as_a_name(http: Http) -> None:
    r = http.request("POST", "/v1/topics/..%2Fx/messages", body=b"{}", headers={"Content-Type": "application/json"})
    _is_error(r, 400, "invalid_topic_name")
    _is_error(http.create_topic("../x"), 400, "invalid_topic_name")
    _is_error(http.create_topic("."), 400, "invalid_topic_name")


@pytest.mark.parametrize("ctype,body", [
    ("application/json", b"{bad json"),
    ("application/json", b"[1, 2,"),
    ("application/json", b"\xff\xfe"),
    ("application/json", b"NaN"),
    ("application/x-ndjson", b'{"ok": 1}\n{"broken": \n'),
    ("application/msgpack", b"\xc1\xc1\xc1"),
    ("application/msgpack", msgpack.packb([{"no_value": 1}])),
    ("application/msgpack", msgpack.packb({"value": 5})),
    ("application/msgpack", msgpack.packb({"value": b"x", "timestamp": "yesterday"})),
    ("application/msgpack", msgpack.packb({"value": b"x", "extra": 1})),
    ("application/vnd.ring.batch", b"\x00" * 60),
    ("application/vnd.ring.batch", bytes(batchfmt.encode([(None, None, b"v", None)], now_ms=1))[:-1]),
    ("application/json", b""),
    ("text/plain", b""),
    ("application/json", b"[]"),
])
def test_malformed_bodies_are_400(http: Http, seeded: str, ctype: str, body: bytes) -> None:
    _is_error(http.produce(seeded, body, ctype, partition=0), 400)
    _unchanged(http, seeded)


def test_batch_with_a_flipped_bit_or_wrong_shape_is_400(http: Http, seeded: str) -> None:
    good = batchfmt.encode([(None, None, b"value", None)], now_ms=1)
    bad = bytearray(good)
    bad[-1] ^= 1
    _is_error(http.produce(seeded, bytes(bad), "application/vnd.ring.batch", partition=0), 400, "corrupt_batch")
    # valid CRC, but the payload is not a list of 4-item records
    wrong = batchfmt.encode_payload(msgpack.packb([[0, None, b"v"]]), record_count=1, first_timestamp=1, max_timestamp=1)
    _is_error(http.produce(seeded, bytes(wrong), "application/vnd.ring.batch", partition=0), 400)
    # flagged JSON but the value is not JSON
    notjson = batchfmt.encode([(None, None, b"{nope", None)], now_ms=1, values_are_json=True)
    _is_error(http.produce(seeded, bytes(notjson), "application/vnd.ring.batch", partition=0), 400)
    # a good batch followed by a bad one: nothing of the request is stored
    _is_error(http.produce(seeded, bytes(good) + bytes(bad), "application/vnd.ring.batch", partition=0), 400)
    _unchanged(http, seeded)


def test_json_nested_too_deep_is_400(http: Http, seeded: str) -> None:
    depth = limits.JSON_DEPTH_MAX
    ok_event = "[" * depth + "]" * depth
    assert http.produce(seeded, f"[{ok_event}]".encode(), partition=1).status == 200
    deep = "[" * (depth + 1) + "]" * (depth + 1)  # one event of depth+1 on an NDJSON line
    deep_event = '{"a":' + "[" * depth + "]" * depth + "}"  # one JSON event of depth+1
    _is_error(http.produce(seeded, deep_event.encode(), partition=0), 400)
    _is_error(http.produce(seeded, f"[{deep_event}]".encode(), partition=0), 400)
    _is_error(http.produce(seeded, ('{"a":' * 5000 + "1" + "}" * 5000).encode(), partition=0), 400)
    _is_error(http.produce(seeded, deep.encode(), "application/x-ndjson", partition=0), 400)
    # brackets inside strings do not count
    assert http.produce(seeded, orjson.dumps({"s": "[" * 500}), partition=1).status == 200
    assert http.end_offsets(seeded) == [3, 2]


def test_over_long_ndjson_line_is_413(http: Http, seeded: str) -> None:
    line = b'"' + b"x" * (limits.NDJSON_LINE_BYTES_MAX + 10) + b'"'
    _is_error(http.produce(seeded, b'{"a": 1}\n' + line + b"\n", "application/x-ndjson", partition=0), 413)
    _unchanged(http, seeded)


def test_over_size_record_is_413(http: Http, seeded: str) -> None:
    big = orjson.dumps("x" * (limits.MESSAGE_BYTES_MAX + 1))
    _is_error(http.produce(seeded, big, partition=0), 413)
    _is_error(http.produce(seeded, b"x" * (limits.MESSAGE_BYTES_MAX + 1), "text/plain", partition=0), 413)
    _is_error(http.produce(seeded, msgpack.packb({"value": b"x" * (limits.MESSAGE_BYTES_MAX + 1)}),
                           "application/msgpack", partition=0), 413)
    big_batch = batchfmt.encode([(None, None, b"x" * (limits.BATCH_BYTES_MAX + 1), None)], now_ms=1)
    _is_error(http.produce(seeded, bytes(big_batch), "application/vnd.ring.batch", partition=0), 413)
    _unchanged(http, seeded)


def test_too_many_records_and_long_keys_are_413(http: Http, seeded: str) -> None:
    many = b"[" + b",".join([b"0"] * (limits.RECORDS_PER_REQUEST_MAX + 1)) + b"]"
    _is_error(http.produce(seeded, many, partition=0), 413)
    _is_error(http.produce(seeded, b"1", partition=0, key="k" * (limits.KEY_BYTES_MAX + 1)), 413)
    _unchanged(http, seeded)


def test_over_size_request_with_content_length_is_413(http: Http, seeded: str) -> None:
    body = b"[" + b"1," * (limits.REQUEST_BYTES_MAX // 2) + b"1]"
    _is_error(http.produce(seeded, body, partition=0), 413)
    _unchanged(http, seeded)


def test_over_size_request_without_content_length_is_413(http: Http, seeded: str) -> None:
    chunk = b"1," * (256 * 1024)
    chunks = (chunk for _ in range(limits.REQUEST_BYTES_MAX // len(chunk) + 2))
    r = http.request("POST", f"/v1/topics/{seeded}/messages?partition=0",
                     body=(c for c in [b"[", *chunks, b"1]"]),
                     headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    _is_error(r, 413)
    _unchanged(http, seeded)


def test_unknown_partition_is_404(http: Http, seeded: str) -> None:
    _is_error(http.produce(seeded, b"1", partition=2), 404, "unknown_partition")
    _is_error(http.fetch(seeded, 7), 404, "unknown_partition")
    _is_error(http.fetch("no-such-topic-here", 0), 404, "unknown_topic")
    _unchanged(http, seeded)


def test_offsets_out_of_range_are_416_naming_earliest(http: Http, seeded: str) -> None:
    r = http.post(f"/v1/topics/{seeded}/partitions/0/truncate", json_body={"before_offset": 2})
    assert r.status == 200 and r.json()["earliest_offset"] == 2
    doc = _is_error(http.fetch(seeded, 0, offset=1), 416, "offset_out_of_range")
    assert doc["earliest"] == 2 and doc["latest"] == 3
    doc = _is_error(http.fetch(seeded, 0, offset=4), 416, "offset_out_of_range")
    assert doc["earliest"] == 2
    assert [rec["value"] for rec in http.fetch(seeded, 0).json()["records"]] == [3]  # default: earliest
    _is_error(http.post(f"/v1/topics/{seeded}/partitions/0/truncate", json_body={"before_offset": 9}), 416)
    _is_error(http.post(f"/v1/topics/{seeded}/partitions/0/truncate", json_body={"before": 1}), 400)


@pytest.mark.parametrize("query", [
    {"wait_ms": limits.LONG_POLL_WAIT_MS_MAX + 1}, {"wait_ms": -1}, {"offset": "abc"}, {"offset": -1},
    {"max_records": 0}, {"max_records": limits.FETCH_RECORDS_MAX + 1}, {"max_bytes": limits.FETCH_BYTES_MAX + 1},
])
def test_bad_fetch_parameters_are_400(http: Http, seeded: str, query: dict) -> None:
    _is_error(http.fetch(seeded, 0, **query), 400)


def test_bad_partition_in_path_or_query_is_400(http: Http, seeded: str) -> None:
    _is_error(http.get(f"/v1/topics/{seeded}/partitions/x/messages"), 400)
    _is_error(http.get(f"/v1/topics/{seeded}/partitions/-1/messages"), 400)
    _is_error(http.get(f"/v1/topics/{seeded}/partitions/{'9' * 5000}/messages"), 400)
    _is_error(http.fetch(seeded, 0, offset="9" * 5000), 400)
    _is_error(http.get(f"/v1/topics/{seeded}/partitions/99999/messages"), 404)
    _is_error(http.produce(seeded, b"1", partition="one"), 400)
    _unchanged(http, seeded)


def test_unsupported_content_type_is_415(http: Http, seeded: str) -> None:
    _is_error(http.produce(seeded, b"<x/>", "application/xml", partition=0), 415, "unsupported_media_type")
    _is_error(http.post(f"/v1/topics/{seeded}/messages", body=b"1"), 415)  # no Content-Type at all
    _unchanged(http, seeded)


def test_router_errors_are_json(http: Http) -> None:
    _is_error(http.get("/nope"), 404)
    r = http.request("PUT", "/v1/topics")
    _is_error(r, 405)
    assert "GET" in r.headers["Allow"] and "POST" in r.headers["Allow"]
    _is_error(http.post("/v1/topics", body=b"{oops", headers={"Content-Type": "application/json"}), 400)
    _is_error(http.post("/v1/topics", json_body={"name": "ok-name", "partitions": 0}), 400)
    _is_error(http.post("/v1/topics", json_body={"name": "ok-name", "bogus": 1}), 400)
    _is_error(http.post("/v1/topics", body=b"x" * (limits.ADMIN_BODY_BYTES_MAX + 1),
                        headers={"Content-Type": "application/json"}), 413)
    _is_error(http.get("/v1/topics/x/partitions/0/offsets"), 400)  # timestamp required (checked first)


def _raw_exchange(broker: TestBroker, data: bytes) -> bytes:
    with broker.raw_socket(timeout_s=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_protocol_errors_before_any_handler_are_json(broker: TestBroker) -> None:
    for request in (
        b"NOT AN HTTP REQUEST LINE\r\n\r\n",
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (limits.HEADER_LINE_BYTES_MAX + 100) + b"\r\n\r\n",
    ):
        out = _raw_exchange(broker, request)
        head, _, body = out.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        assert 400 <= status < 500, head
        assert b"application/json" in head.lower(), head
        assert "error" in orjson.loads(body)


def test_slow_header_dribbler_is_cut_off(broker: TestBroker, http: Http) -> None:
    """One header byte per second: the broker closes the connection after HEADER_READ_TIMEOUT_S."""
    request = b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    with broker.raw_socket(timeout_s=limits.HEADER_READ_TIMEOUT_S + 10) as s:
        t0 = time.monotonic()
        closed_after = None
        for byte in request:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - t0
                break
            s.settimeout(1.0)
            try:
                if s.recv(1) == b"":
                    closed_after = time.monotonic() - t0
                    break
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed_after = time.monotonic() - t0
                break
            if time.monotonic() - t0 > limits.HEADER_READ_TIMEOUT_S + 8:
                break
    assert closed_after is not None, "the dribbling connection was never closed"
    assert limits.HEADER_READ_TIMEOUT_S - 1 < closed_after < limits.HEADER_READ_TIMEOUT_S + 4
    assert http.get("/v1/status").status == 200  # the broker itself is fine


_VALID_BODIES = {
    "application/json": b'[{"a": [1, 2, {"b": "c"}]}, 2, "x"]',
    "application/x-ndjson": b'{"a": 1}\n[1]\n"s"\n',
    "application/msgpack": msgpack.packb([{"value": b"v", "key": "k", "headers": {"h": b"x"}, "timestamp": 5}]),
    "application/vnd.ring.batch": bytes(batchfmt.encode([(None, b"k", b"v", {"h": b"1"})], now_ms=1)),
    "text/plain": b"plain",
}


@pytest.mark.parametrize("ctype", sorted(_VALID_BODIES))
def test_mangled_bodies_never_cause_a_500(http: Http, seeded: str, ctype: str) -> None:
    """Truncations and byte flips of valid bodies: a 2xx or a 4xx JSON error, never a 5xx."""
    import random

    rng = random.Random(ctype)  # seeded: a failure replays
    valid = _VALID_BODIES[ctype]
    accepted = 0
    for _ in range(40):
        body = bytearray(valid)
        kind = rng.randrange(3)
        if kind == 0:
            body = body[: rng.randrange(len(body) + 1)]
        elif kind == 1:
            for _ in range(rng.randrange(1, 4)):
                body[rng.randrange(len(body))] = rng.randrange(256)
        else:
            body = bytearray(rng.randbytes(rng.randrange(1, 80)))
        r = http.produce(seeded, bytes(body), ctype, partition=1)
        assert r.status < 500, (bytes(body), r.status, r.body)
        if r.status == 200:
            accepted += r.json()["count"]
        else:
            _is_error(r, r.status)
    assert http.end_offsets(seeded) == [3, accepted]
    # whatever was accepted can be read back in every format
    for accept in ("application/json", "application/x-ndjson", "application/msgpack"):
        assert http.fetch(seeded, 1, accept=accept).status == 200
