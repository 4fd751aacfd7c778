"""Hostile input against real broker processes, round two: what a request may cost the broker is
bounded by its bytes, the request-body budget follows the bytes that arrive, stored JSON meets the
rules of a JSON produce and every NDJSON answer has one record per line, leaving a group needs
consume on its topics, a malformed gzip body costs one log line, and topic settings and query
integers a client cannot mean are refused.

Memory is read from the broker's own counters: its peak resident set is reset
(``/proc/PID/clear_refs``) just before the one request, and the peak after it is compared with the
request's bytes. The bound asserted is loose (4× the decompressed bytes, plus room for the
per-record objects of a request at the record limit); ``ring bench``'s hostile part reports the
figures themselves."""

from __future__ import annotations

import gzip
import time
from pathlib import Path
from typing import Iterator

import orjson
import pytest

from ring import limits
from ring.auth import file_line
from ring.bench.measure import reset_peak, vm_kib
from ring.http_api import fetch_codec
from ring.log import batch as batchfmt
from tests.brokers import Http, TestBroker

pytestmark = pytest.mark.integration

# Room beyond 4× a request's bytes: the objects of up to RECORDS_PER_REQUEST_MAX records
# (about 120 bytes each) and the allocator's slack.
RSS_SLACK_BYTES = 8 * 2**20


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    """A broker of this module's own, so no other test's allocations blur its peak."""
    b = TestBroker(tmp_path_factory.mktemp("hostile-broker"), args=["--fsync", "interval:100"])
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _post(b: TestBroker, path: str, body: bytes, ctype: str, extra: str = "") -> tuple[int, bytes]:
    """A raw POST (http.client would not send a Content-Encoding'd body as it is)."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n").encode()
    with b.raw_socket(timeout_s=60) as s:
        s.sendall(head + body)
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


def _rise(b: TestBroker, path: str, body: bytes, ctype: str, extra: str = "") -> tuple[int, int]:
    """(status, bytes the broker's peak RSS rose by) for one request."""
    _post(b, path, b"1\n" if ctype == "application/x-ndjson" else b"[1]", ctype if "json" in ctype else
          "application/json")  # the topic exists and the code paths are warm
    reset_peak(b.pid)
    before = vm_kib(b.pid, "VmRSS")
    status, _ = _post(b, path, body, ctype, extra)
    return status, (vm_kib(b.pid, "VmHWM") - before) * 1024


def _bound(decompressed: int) -> int:
    return 4 * decompressed + RSS_SLACK_BYTES


def test_a_json_array_past_the_record_limit_is_refused_while_parsing(lone: TestBroker, topic: str) -> None:
    body = b"[" + b"1," * 199_999 + b"1]"  # 400 KB, four times the record limit
    status, rise = _rise(lone, f"/v1/topics/{topic}/messages?partition=0", body, "application/json")
    assert status == 413
    assert rise <= _bound(len(body)), f"the broker's RSS rose {rise >> 20} MiB for a {len(body)}-byte body"
    assert lone.http.end_offsets(topic)[0] == 1  # only the warm-up record: nothing of it stored


def test_a_gzip_bomb_of_records_is_refused_in_proportion_to_its_inflated_bytes(lone: TestBroker, topic: str) -> None:
    raw = b"[" + b"1," * 199_999 + b"1]"
    body = gzip.compress(raw, 9)
    assert len(body) < 2_000
    status, rise = _rise(lone, f"/v1/topics/{topic}/messages?partition=0", body, "application/json",
                         "Content-Encoding: gzip\r\n")
    assert status == 413
    assert rise <= _bound(len(raw)), f"the broker's RSS rose {rise >> 20} MiB for {len(raw)} inflated bytes"


def test_ndjson_at_the_record_limit_costs_memory_in_proportion_to_its_bytes(lone: TestBroker, topic: str) -> None:
    lines = [orjson.dumps({"n": i, "pad": "x" * 300}) for i in range(limits.RECORDS_PER_REQUEST_MAX)]
    body = b"\n".join(lines)
    status, rise = _rise(lone, f"/v1/topics/{topic}/messages?partition=0", body, "application/x-ndjson")
    assert status == 200
    assert rise <= _bound(len(body)), f"the broker's RSS rose {rise >> 20} MiB for a {len(body)}-byte body"
    assert lone.http.end_offsets(topic)[0] == 1 + limits.RECORDS_PER_REQUEST_MAX


def test_json_records_nested_to_the_limit_cost_memory_in_proportion_to_their_bytes(lone: TestBroker,
                                                                                  topic: str) -> None:
    event = b"[" * limits.JSON_DEPTH_MAX + b"1" + b"]" * limits.JSON_DEPTH_MAX
    body = b"[" + b",".join([event] * limits.RECORDS_PER_REQUEST_MAX) + b"]"
    status, rise = _rise(lone, f"/v1/topics/{topic}/messages?partition=0", body, "application/json")
    assert status == 200
    assert rise <= _bound(len(body)), f"the broker's RSS rose {rise >> 20} MiB for a {len(body)}-byte body"


def test_a_msgpack_body_of_empty_maps_is_refused_before_they_are_built(lone: TestBroker, topic: str) -> None:
    n = 4 * 2**20
    body = b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n  # an array of 4 Mi records, each an empty map
    status, rise = _rise(lone, f"/v1/topics/{topic}/messages?partition=0", body, "application/msgpack")
    assert status == 413
    assert rise <= _bound(len(body)), f"the broker's RSS rose {rise >> 20} MiB for a {len(body)}-byte body"


def test_msgpack_records_with_headers_at_their_limit_cost_memory_in_proportion_to_their_bytes(
        lone: TestBroker, topic: str) -> None:
    import msgpack

    pairs = [["h", b""]] * (limits.HEADERS_PER_RECORD_MAX - 2)  # about 4 bytes each on the wire
    body = msgpack.packb([{"value": b"", "headers": pairs}] * limits.RECORDS_PER_REQUEST_MAX, use_bin_type=True)
    assert len(body) <= limits.REQUEST_BYTES_MAX
    status, rise = _rise(lone, f"/v1/topics/{topic}/messages?partition=0", body, "application/msgpack")
    assert status == 200
    assert rise <= _bound(len(body)), f"the broker's RSS rose {rise >> 20} MiB for a {len(body)}-byte body"
    assert lone.http.end_offsets(topic)[0] == 1 + limits.RECORDS_PER_REQUEST_MAX


def test_bodies_that_only_declare_their_size_hold_no_budget(lone: TestBroker, topic: str) -> None:
    """Sixteen connections declaring maximal bodies and sending one byte held the whole budget."""
    assert limits.REQUEST_BODY_BYTES_IN_FLIGHT_MAX <= 16 * limits.REQUEST_BYTES_MAX
    tricklers = []
    try:
        for _ in range(16):
            s = lone.raw_socket(timeout_s=10)
            s.sendall(f"POST /v1/topics/{topic}/messages?partition=0 HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {limits.REQUEST_BYTES_MAX}\r\n\r\n[".encode())
            tricklers.append(s)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # every trickler is in (and counted) before the produce
            if _metric(lone.http, "ring_request_body_bytes_held") >= 16:
                break
            time.sleep(0.05)
        r = lone.http.produce(topic, b'[{"n": 1}]', partition=0)
        assert r.status == 200, r.body
    finally:
        for s in tricklers:
            s.close()


def _metric(http: Http, name: str) -> float:
    text = http.get("/metrics").body.decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def _json_batch(value: bytes) -> bytes:
    return bytes(batchfmt.encode([(None, None, value, None), (None, None, b'{"b":2}', None)],
                                 now_ms=int(time.time() * 1000), values_are_json=True))


def test_a_stored_json_value_with_line_breaks_stays_on_one_ndjson_line(http: Http, topic: str) -> None:
    value = b'{\n  "a": 1,\n  "s": "x"\n}'  # valid JSON, pretty-printed
    r = http.produce(topic, _json_batch(value), "application/vnd.ring.batch", partition=0)
    assert r.status == 200, r.body
    got = http.fetch(topic, 0, "application/x-ndjson", offset=0)
    assert got.status == 200
    lines = got.body.splitlines()
    assert len(lines) == 2, got.body
    assert [orjson.loads(line)["value"] for line in lines] == [{"a": 1, "s": "x"}, {"b": 2}]
    assert [rec["value"] for rec in http.fetch(topic, 0, offset=0).json()["records"]] == [{"a": 1, "s": "x"},
                                                                                         {"b": 2}]
    # the CLI's --json lines are made the same way
    assert orjson.dumps(fetch_codec.record_line(batchfmt.Record(0, 1, None, value, None), True)).count(b"\n") == 0


def test_stored_json_values_meet_the_nesting_limit_of_a_json_produce(http: Http, topic: str) -> None:
    deep = b"[" * 1000 + b"]" * 1000
    assert http.produce(topic, deep, partition=0).status == 400  # through application/json
    r = http.produce(topic, _json_batch(deep), "application/vnd.ring.batch", partition=0)
    assert r.status == 400 and r.json()["error"] == "bad_request", r.body
    d = limits.JSON_DEPTH_MAX
    # Brackets inside strings do not count either way: this one nests d + 4 deep.
    disguised = b'[[[["]]]]",' + b"[" * d + b"]" * d + b',"[[[["]]]]'
    for value in (disguised, b"[" + disguised + b"]"):
        assert http.produce(topic, value, partition=0).status == 400
        assert http.produce(topic, value, "application/x-ndjson", partition=0).status == 400
        r = http.produce(topic, _json_batch(value), "application/vnd.ring.batch", partition=0)
        assert r.status == 400, r.body
    at_limit = b"[" * d + b"]" * d
    assert http.produce(topic, _json_batch(at_limit), "application/vnd.ring.batch", partition=0).status == 200
    assert http.end_offsets(topic)[0] == 2


def test_leaving_a_group_needs_consume_on_its_topics(make_broker, tmp_path: Path, topic: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("\n".join([file_line("t-admin", "ops", "admin", "*"),
                                 file_line("t-alice", "alice", "consume", topic),
                                 file_line("t-mallory", "mallory", "consume", "other-*"),
                                 file_line("t-eve", "eve", "produce", topic)]) + "\n")
    b = make_broker("--auth-tokens", str(tokens))

    def as_(token: str, method: str, path: str, **kw) -> int:
        r = b.http.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)
        return r.status

    assert as_("t-admin", "POST", "/v1/topics", json_body={"name": topic, "partitions": 1}) == 201
    assert as_("t-alice", "POST", "/v1/groups/g/members", json_body={"consumer": "c1", "topics": [topic]}) == 200
    for token in ("t-mallory", "t-eve"):
        for query in ("?commit=false", "", "?commit=true"):
            assert as_(token, "DELETE", f"/v1/groups/g/members/c1{query}") == 403, (token, query)
    members = b.http.get("/v1/groups/g", headers={"Authorization": "Bearer t-admin"}).json()["members"]
    assert [m["consumer"] for m in members] == ["c1"]
    assert as_("t-alice", "DELETE", "/v1/groups/g/members/c1?commit=false") == 200


def test_a_malformed_gzip_body_is_400_and_one_log_line(lone: TestBroker, topic: str) -> None:
    before = len(lone.log_text())
    for body in (b"\x1f\x8b\x08\x00not gzip at all", b"\x1f\x8b" + b"x" * 100_000):
        status, answer = _post(lone, f"/v1/topics/{topic}/messages", body, "application/json",
                               "Content-Encoding: gzip\r\n")
        assert status == 400 and orjson.loads(answer)["error"] == "bad_request", answer
    assert lone.http.get("/v1/status").status == 200
    deadline = time.monotonic() + 5
    logged: list[str] = []
    while time.monotonic() < deadline:  # the log lines are written after the answers
        logged = [line for line in lone.log_text()[before:].splitlines() if "content-encoding" in line.lower()]
        if len(logged) >= 2:
            break
        time.sleep(0.05)
    assert "Traceback" not in lone.log_text()[before:] and len(logged) == 2, lone.log_text()[before:][-2000:]


def test_a_replication_factor_over_the_cluster_size_is_refused(shared_cluster, http: Http, topic: str) -> None:
    r = shared_cluster[0].http.create_topic(topic, partitions=1, replication_factor=7)
    assert r.status == 400 and r.json()["field"] == "replication_factor" and r.json()["brokers"] == 3, r.body
    assert shared_cluster[0].http.end_offsets(topic) is None
    r = http.create_topic(topic, partitions=1, replication_factor=2)  # the session broker is alone
    assert r.status == 400 and r.json()["brokers"] == 1, r.body
    assert http.create_topic(topic, partitions=1).status == 201  # the default is capped, not refused


def test_query_integers_in_other_scripts_digits_are_400(http: Http, topic: str) -> None:
    assert http.produce(topic, b"[1]", partition=0).status == 200
    arabic_zero, devanagari_one = "\u0660", "\u0967"
    fetch, offsets = f"/v1/topics/{topic}/partitions/0/messages", f"/v1/topics/{topic}/partitions/0/offsets"
    for method, path, query in (("POST", f"/v1/topics/{topic}/messages", {"partition": arabic_zero}),
                                ("GET", fetch, {"offset": devanagari_one}),
                                ("GET", fetch, {"max_records": "1_0"}),
                                ("GET", offsets, {"timestamp": arabic_zero * 3})):
        r = http.request(method, path, query=query, body=b"[2]" if method == "POST" else None,
                         headers={"Content-Type": "application/json"})
        assert r.status == 400 and r.json()["error"] == "bad_request", (path, query, r.status, r.body)
    assert http.end_offsets(topic)[0] == 1
