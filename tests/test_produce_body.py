"""How a produce body is taken, against a real broker: whole in one packet, or in slow pieces, compressed
by Content-Encoding or not; every way gives the same records, and a body over the limit is 413."""

from __future__ import annotations

import gzip
import socket
import time

import orjson

from ring import limits
from tests.brokers import Http, TestBroker


def _values(http: Http, topic: str) -> list:
    r = http.fetch(topic, 0, offset=0, max_records=100)
    assert r.status == 200, r.body
    return [rec["value"] for rec in r.json()["records"]]


def _raw_post(broker: TestBroker, topic: str, head_extra: str, body: bytes, pieces: int) -> bytes:
    host, port = broker.url.removeprefix("http://").split(":")
    head = (f"POST /v1/topics/{topic}/messages?partition=0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{head_extra}Connection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head)
        step = max(1, len(body) // pieces)
        for i in range(0, len(body), step):
            time.sleep(0.05 if pieces > 1 else 0)
            s.sendall(body[i:i + step])
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_a_body_whole_in_pieces_or_gzipped_gives_the_same_records(broker: TestBroker, http: Http,
                                                                 topic: str) -> None:
    assert http.create_topic(topic, partitions=1).status == 201
    events = [{"n": i, "pad": "y" * 20} for i in range(5)]
    body = orjson.dumps(events)
    assert _raw_post(broker, topic, "", body, 1).startswith(b"HTTP/1.1 200")
    assert _raw_post(broker, topic, "", body, 4).startswith(b"HTTP/1.1 200")  # arrives after the head
    assert _raw_post(broker, topic, "Content-Encoding: gzip\r\n", gzip.compress(body), 1).startswith(b"HTTP/1.1 200")
    assert _values(http, topic) == events * 3


def test_a_gzipped_body_inflating_past_the_limit_is_413(broker: TestBroker, topic: str, http: Http) -> None:
    assert http.create_topic(topic, partitions=1).status == 201
    big = b"[" + b" " * (limits.REQUEST_BYTES_MAX + 10) + b"1]"
    answer = _raw_post(broker, topic, "Content-Encoding: gzip\r\n", gzip.compress(big), 1)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
