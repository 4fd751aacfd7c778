"""Hostile framing against a real broker process: trailers that would act as headers, transfer codings
the front does not speak, HTTP/1.0's rules, a missing or doubled Host, a client that half-closes, and a
head of many short lines. Each is one raw request on a socket, answered as RFC 9112 says."""

from __future__ import annotations

import re
import socket

import orjson
import pytest

from ring import limits
from tests.brokers import Http, TestBroker

pytestmark = pytest.mark.integration


def _exchange(b: TestBroker, raw: bytes, answers: int = 1) -> tuple[list[tuple[int, dict[str, str], bytes]], bool]:
    """Send ``raw``, read ``answers`` answers (status, headers, body), and whether the broker then closed."""
    with b.raw_socket(timeout_s=20) as s:
        s.sendall(raw)
        out = []
        buf = b""
        for _ in range(answers):
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                assert chunk, (out, buf)
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            size = int(headers.get("content-length", "0"))
            while len(buf) < size:
                chunk = s.recv(65536)
                assert chunk
                buf += chunk
            out.append((int(lines[0].split(" ", 2)[1]), headers, buf[:size]))
            buf = buf[size:]
        s.settimeout(5)
        try:
            closed = s.recv(1) == b""
        except socket.timeout:
            closed = False
        except ConnectionResetError:
            closed = True
    return out, closed


def test_a_trailer_does_not_act_as_a_header(broker: TestBroker, http: Http, topic: str) -> None:
    assert http.produce(topic, b'[{"n": 1}]', partition=0).status == 200
    raw = (f"GET /v1/topics/{topic}/partitions/0/messages?offset=0 HTTP/1.1\r\nHost: x\r\n"
           f"Transfer-Encoding: chunked\r\n\r\n0\r\nAccept: application/x-ndjson\r\n\r\n").encode()
    [(status, headers, body)], _ = _exchange(broker, raw)
    assert status == 200 and headers["content-type"] == "application/json", (status, headers, body)
    assert [r["value"] for r in orjson.loads(body)["records"]] == [{"n": 1}]


def test_an_unknown_transfer_coding_is_501_and_nothing_is_stored(broker: TestBroker, http: Http, topic: str) -> None:
    assert http.create_topic(topic, partitions=1).status == 201
    body = b'[{"n": 1}]'
    raw = (f"POST /v1/topics/{topic}/messages?partition=0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Transfer-Encoding: gzip, chunked\r\n\r\n{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"
    [(status, _, answer)], closed = _exchange(broker, raw)
    assert status == 501 and closed, answer
    assert http.end_offsets(topic)[0] == 0


def test_a_head_of_many_short_lines_counts_its_raw_bytes(broker: TestBroker) -> None:
    lines = b"a:\r\n" * 40_000  # 160 KB of head, 40,000 bytes of names and values
    assert len(lines) > 2 * limits.REQUEST_HEAD_BYTES_MAX
    [(status, _, _)], closed = _exchange(broker, b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    assert status == 431 and closed


def test_http_1_0_with_a_chunked_body_is_answered_then_closed(broker: TestBroker, http: Http, topic: str) -> None:
    raw = (f"POST /v1/topics/{topic}/messages?partition=0 HTTP/1.0\r\nConnection: keep-alive\r\n"
           f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[1,2]\r\n0\r\n\r\n").encode()
    [(status, headers, _)], closed = _exchange(broker, raw)
    assert status == 200 and headers.get("connection") == "close" and closed


def test_http_1_0_expect_100_continue_is_not_answered(broker: TestBroker, topic: str) -> None:
    head = (f"POST /v1/topics/{topic}/messages?partition=0 HTTP/1.0\r\nContent-Type: application/json\r\n"
            f"Content-Length: 3\r\nExpect: 100-continue\r\n\r\n").encode()
    with broker.raw_socket(timeout_s=20) as s:
        s.sendall(head)
        s.settimeout(1.0)  # an HTTP/1.0 client does not wait for 100 Continue: nothing must come before the body
        with pytest.raises(socket.timeout):
            s.recv(100)
        s.settimeout(20)
        s.sendall(b"[1]")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200 "), got


def test_an_http_1_0_keep_alive_answer_says_so(broker: TestBroker) -> None:
    raw = b"GET /v1/status HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2
    answers, closed = _exchange(broker, raw, answers=2)
    assert [(status, headers.get("connection")) for status, headers, _ in answers] == [(200, "keep-alive")] * 2
    assert not closed


@pytest.mark.parametrize("head", [b"GET /v1/status HTTP/1.1\r\n\r\n",
                                  b"GET /v1/status HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
                                  b"GET /v1/status HTTP/1.0\r\nHost: x\r\nHost: x\r\n\r\n"])
def test_a_missing_or_doubled_host_is_400(broker: TestBroker, head: bytes) -> None:
    [(status, _, body)], closed = _exchange(broker, head)
    assert status == 400 and closed and orjson.loads(body)["error"] == "bad_request", body


def test_a_client_that_half_closes_gets_the_answers_it_asked_for(broker: TestBroker, http: Http, topic: str) -> None:
    assert http.create_topic(topic, partitions=1).status == 201
    raw = (f"GET /v1/topics/{topic}/partitions/0/messages?offset=0&wait_ms=1000 HTTP/1.1\r\nHost: x\r\n\r\n"
           f"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n").encode()
    with broker.raw_socket(timeout_s=20) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)  # the long poll still waits: its answer, and the next, are owed
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", got) == [b"200", b"200"], got


def test_a_head_of_more_fields_than_the_limit_is_431(broker: TestBroker) -> None:
    """Each field costs the broker an entry of the request's headers: their number is bounded too, so
    what a parsed head holds stays in proportion to its bytes (``limits.connection_bytes_max``)."""
    def head(n: int) -> bytes:  # Host and n more fields
        return b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + b"".join(b"f%d:\r\n" % i for i in range(n)) + b"\r\n"

    assert len(head(limits.REQUEST_HEADER_FIELDS_MAX)) < limits.REQUEST_HEAD_BYTES_MAX // 8
    [(status, _, _)], closed = _exchange(broker, head(limits.REQUEST_HEADER_FIELDS_MAX))
    assert status == 431 and closed
    [(status, _, _)], _ = _exchange(broker, head(limits.REQUEST_HEADER_FIELDS_MAX - 1))
    assert status == 200
