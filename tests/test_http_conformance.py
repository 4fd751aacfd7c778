"""HTTP/1.1 as the client port speaks it, checked by an independent client.

The broker, client app and front ``ring serve`` runs are in this process on a
loopback port; the requests are written, and the answers read, by h11 (an
HTTP/1.1 implementation that shares no code with httptools or aiohttp) or as
raw bytes where h11 would refuse to send them. Covered: keep-alive and
``Connection: close`` (requests pipelined after it are not run), HTTP/1.0,
pipelined requests answered in order (a long-poll at the front of the line
included), chunked request bodies, ``Expect: 100-continue`` (granted, and
refused with a final answer), HEAD (a fetch's included), gzip request
bodies, malformed request lines, headers and framing (400 and the connection
closed, one answer per request), and each bound of the front at and just
over it: target, header line, head, body, NDJSON line, pipelined requests,
connections, and the head, body, send and keep-alive deadlines.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from pathlib import Path
from typing import Any, AsyncIterator

import h11
import orjson
import pytest

from ring import limits
from ring.catalog import TopicConfig
from ring.cluster.node import ClusterBroker
from ring.http_api.server import Server
from ring.produce import Produce, Records
from ring.replication.intake import results_of
from tests.support import serving_alone

HEADER_TIMEOUT_S = 0.6
SEND_TIMEOUT_S = 5.0


class Answer:
    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = {k.decode().lower(): v.decode() for k, v in headers}
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)


def _request_bytes(method: str, target: str, headers: list[tuple[str, str]] | None = None,
                   body: bytes | None = None, chunks: list[bytes] | None = None) -> bytes:
    """One request as h11 frames it (Content-Length, or chunked when ``chunks`` is given)."""
    conn = h11.Connection(h11.CLIENT)
    hdrs = [("Host", "ring")] + list(headers or [])
    if body is not None:
        hdrs.append(("Content-Length", str(len(body))))
    if chunks is not None:
        hdrs.append(("Transfer-Encoding", "chunked"))
    out = conn.send(h11.Request(method=method, target=target, headers=hdrs))
    for piece in ([body] if body is not None else chunks or []):
        out += conn.send(h11.Data(data=piece))
    return out + conn.send(h11.EndOfMessage())


class Client:
    """One connection: requests framed by h11, answers parsed by h11 (pipelined ones too)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> "Client":
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def close(self) -> None:
        self.writer.close()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, method: str = "GET", timeout_s: float = 10.0) -> Answer:
        """The next answer on the connection (to a request of ``method``)."""
        p = self.parser
        if p.our_state is h11.DONE and p.their_state is h11.DONE:
            p.start_next_cycle()
        if p.our_state is h11.IDLE:  # the request went out already: tell h11 what it was
            p.send(h11.Request(method=method, target="/", headers=[("Host", "ring"), ("Content-Length", "0")]))
            p.send(h11.EndOfMessage())
        status, headers, body = 0, [], b""
        deadline = time.monotonic() + timeout_s
        while True:
            event = p.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(self.reader.read(1 << 20), max(0.01, deadline - time.monotonic()))
                p.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status, headers = event.status_code, list(event.headers)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return Answer(status, headers, body)
            else:
                raise AssertionError(f"unexpected event {event!r}")

    async def closed(self, timeout_s: float = 5.0) -> bool:
        """Whether the server closes the connection (EOF or reset) within ``timeout_s``, reading what is left."""
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                data = await asyncio.wait_for(self.reader.read(1 << 16), deadline - time.monotonic())
                if not data:
                    return True
        except (asyncio.TimeoutError, TimeoutError):
            return False
        except ConnectionError:
            return True
        return False


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[ClusterBroker, Server]]:
    async with serving_alone(tmp_path / "data", "never", header_timeout_s=HEADER_TIMEOUT_S,
                             send_timeout_s=SEND_TIMEOUT_S, connections_max=8) as (broker, server):
        await broker.add_topic(TopicConfig(name="t", partitions=2, replication_factor=1))
        yield broker, server


def _produce(body: bytes, ctype: str = "application/json", extra: list[tuple[str, str]] | None = None,
             partition: int = 0) -> bytes:
    return _request_bytes("POST", f"/v1/topics/t/messages?partition={partition}",
                          [("Content-Type", ctype)] + (extra or []), body)


# --- keep-alive, close, versions ---------------------------------------------------------------


async def test_keep_alive_serves_many_requests_on_one_connection(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    for i in range(5):
        await c.send(_produce(b'{"n": %d}' % i))
        a = await c.answer("POST")
        assert a.status == 200 and a.json()["base_offset"] == i and a.headers["content-type"] == "application/json"
        assert "date" in a.headers and "connection" not in a.headers
    await c.send(_request_bytes("GET", "/v1/topics/t/partitions/0/messages?offset=0"))
    a = await c.answer()
    assert [r["value"]["n"] for r in a.json()["records"]] == [0, 1, 2, 3, 4]
    assert not await c.closed(0.3)  # still open, waiting for the next request
    c.close()


async def test_connection_close_is_honoured_after_the_answer(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status", [("Connection", "close")]))
    a = await c.answer()
    assert a.status == 200 and a.headers["connection"] == "close"
    assert await c.closed()


async def test_requests_pipelined_after_connection_close_are_not_answered(served) -> None:
    broker, server = served
    c = await Client.open(server.port)
    await c.send(_produce(b'"before"') + _produce(b'"last"', extra=[("Connection", "close")])
                 + _produce(b'"after"'))
    data = await asyncio.wait_for(c.reader.read(), 5)  # to EOF
    assert data.count(b"HTTP/1.1 200") == 2 and data.count(b"HTTP/1.1 ") == 2, data
    assert data.count(b"Connection: close") == 1 and data.rstrip().endswith(b"}")
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/topics/t/partitions/0/messages?offset=0"))
    assert [r["value"] for r in (await c.answer()).json()["records"]] == ["before", "last"]  # "after": never run
    c.close()


async def test_http_1_0_gets_one_answer_then_the_connection_closes(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(b"GET /v1/status HTTP/1.0\r\n\r\n")
    data = await asyncio.wait_for(c.reader.read(), 5)  # to EOF
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and orjson.loads(body)["status"] == "ok"
    assert b"Connection: close" in head


# --- pipelining --------------------------------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    batch = [_produce(b'{"p": 1}'), _request_bytes("GET", "/nope"), _produce(b'{"p": 2}'),
             _request_bytes("HEAD", "/v1/status"), _request_bytes("GET", "/v1/topics/t/partitions/0/messages"),
             _produce(b"{bad json"), _request_bytes("GET", "/v1/topics")]
    await c.send(b"".join(batch))  # one write: the server sees them all at once
    methods = ["POST", "GET", "POST", "HEAD", "GET", "POST", "GET"]
    answers = [await c.answer(m) for m in methods]
    assert [a.status for a in answers] == [200, 404, 200, 200, 200, 400, 200]
    assert answers[0].json()["base_offset"] == 0 and answers[2].json()["base_offset"] == 1
    assert answers[3].body == b"" and int(answers[3].headers["content-length"]) > 0
    assert [r["value"]["p"] for r in answers[4].json()["records"]] == [1, 2]
    c.close()


async def test_a_long_poll_holds_the_answers_behind_it_in_order(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/topics/t/partitions/1/messages?offset=0&wait_ms=5000")
                 + _request_bytes("GET", "/v1/status"))
    await asyncio.sleep(0.3)
    producer = await Client.open(server.port)
    await producer.send(_produce(b'"wake"', partition=1))
    assert (await producer.answer("POST")).status == 200
    first, second = await c.answer(), await c.answer()
    assert [r["value"] for r in first.json()["records"]] == ["wake"] and second.json()["status"] == "ok"
    c.close()
    producer.close()


async def test_more_pipelined_requests_than_the_bound_are_all_answered(served, monkeypatch) -> None:
    monkeypatch.setattr(limits, "PIPELINED_REQUESTS_MAX", 4)
    _, server = served
    c = await Client.open(server.port)
    n = 3 * limits.PIPELINED_REQUESTS_MAX + 1
    await c.send(b"".join(_produce(b'{"i": %d}' % i) for i in range(n)))
    offsets = [(await c.answer("POST")).json()["base_offset"] for _ in range(n)]
    assert offsets == list(range(n))
    c.close()


async def test_reading_stops_past_the_pipelining_bound_and_goes_on_as_answers_leave(served, monkeypatch) -> None:
    """Up to PIPELINED_REQUESTS_MAX requests waiting for their answers, a connection reads on; the bytes
    of one more wait unparsed, and it reads nothing until answers have made room."""
    monkeypatch.setattr(limits, "PIPELINED_REQUESTS_MAX", 4)
    _, server = served
    bound = limits.PIPELINED_REQUESTS_MAX
    c = await Client.open(server.port)
    poll = _request_bytes("GET", "/v1/topics/t/partitions/1/messages?offset=0&wait_ms=5000")  # holds the line
    await c.send(poll + b"".join(_request_bytes("GET", "/v1/status") for _ in range(bound - 1)))
    conn = await _one_connection(server)
    await _until(lambda: len(conn.queue) == bound)
    assert not conn.reading_paused  # at the bound: still reading
    await c.send(_request_bytes("GET", "/v1/status"))
    await _until(lambda: conn.reading_paused)  # over it: paused, the request past the bound not parsed
    assert len(conn.queue) == bound
    await c.send(_request_bytes("GET", "/v1/topics/t/partitions/0/messages?offset=0"))  # stays unread
    await asyncio.sleep(0.3)
    assert len(conn.queue) == bound
    producer = await Client.open(server.port)
    await producer.send(_produce(b'"wake"', partition=1))
    assert (await producer.answer("POST")).status == 200
    answers = [await c.answer() for _ in range(bound + 2)]
    assert [r["value"] for r in answers[0].json()["records"]] == ["wake"]
    assert [a.json()["status"] for a in answers[1:-1]] == ["ok"] * bound and answers[-1].status == 200
    c.close()
    producer.close()


async def _one_connection(server: Server) -> Any:
    await _until(lambda: len(server.connections) == 1)
    (conn,) = server.connections
    return conn


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# --- bodies ------------------------------------------------------------------------------------


async def test_chunked_request_bodies(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(_request_bytes("POST", "/v1/topics/t/messages?partition=0", [("Content-Type", "application/x-ndjson")],
                                chunks=[b'{"a"', b": 1}\n", b'{"a": 2}', b"\n"]))
    a = await c.answer("POST")
    assert a.status == 200 and a.json()["count"] == 2
    # a chunked body over the route's bound is refused as it arrives, and the connection goes on
    await c.send(_request_bytes("POST", "/v1/topics", [("Content-Type", "application/json")],
                                chunks=[b" " * 4096] * (limits.ADMIN_BODY_BYTES_MAX // 4096 + 1)))
    assert (await c.answer("POST")).status == 413
    await c.send(_request_bytes("GET", "/v1/status"))
    assert (await c.answer()).status == 200
    c.close()


async def test_expect_100_continue(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    body = b'{"e": 1}'
    await c.send(b"POST /v1/topics/t/messages?partition=0 HTTP/1.1\r\nHost: ring\r\nContent-Type: application/json\r\n"
                 b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    interim = await asyncio.wait_for(c.reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    await c.send(body)
    head = await asyncio.wait_for(c.reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    c.close()
    # refused before the body: a final answer, no 100, and the connection closes (the body never comes)
    c = await Client.open(server.port)
    await c.send(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: ring\r\nContent-Type: image/png\r\n"
                 b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n")
    data = await asyncio.wait_for(c.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 415") and b"100 Continue" not in data and b"Connection: close" in data
    # a declared body over the route's bound: 413 before the body, no 100, and the connection closes
    c = await Client.open(server.port)
    await c.send(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: ring\r\nContent-Type: application/json\r\n"
                 b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (limits.REQUEST_BYTES_MAX + 1))
    data = await asyncio.wait_for(c.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 413") and b"100 Continue" not in data and b"Connection: close" in data
    # at the bound: 100 Continue
    c = await Client.open(server.port)
    await c.send(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: ring\r\nContent-Type: application/json\r\n"
                 b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % limits.REQUEST_BYTES_MAX)
    assert await asyncio.wait_for(c.reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    c.close()


async def test_gzip_bodies_and_their_bound(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(_produce(gzip.compress(b'[{"z": 1}, {"z": 2}]'), extra=[("Content-Encoding", "gzip")]))
    a = await c.answer("POST")
    assert a.status == 200 and a.json()["count"] == 2
    # a small gzip body that inflates past the route's bound: 413, and nothing written
    bomb = gzip.compress(b"[" + b" " * (limits.REQUEST_BYTES_MAX + 10) + b"1]")
    await c.send(_produce(bomb, extra=[("Content-Encoding", "gzip")]))
    a = await c.answer("POST")
    assert a.status == 413 and a.json()["error"] == "payload_too_large"
    await c.send(_produce(b"\x1f\x8b garbage", extra=[("Content-Encoding", "gzip")]))
    assert (await c.answer("POST")).status == 400
    await c.send(_produce(b"[1]", extra=[("Content-Encoding", "br")]))
    assert (await c.answer("POST")).status == 415
    c.close()


async def test_head_answers_what_get_would_without_the_body(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/topics/t"))
    got = await c.answer()
    await c.send(_request_bytes("HEAD", "/v1/topics/t"))
    head = await c.answer("HEAD")
    assert head.status == 200 and head.body == b""
    assert head.headers["content-length"] == str(len(got.body)) and head.headers["content-type"] == "application/json"
    await c.send(_produce(b'"h"'))
    assert (await c.answer("POST")).status == 200
    fetch = "/v1/topics/t/partitions/0/messages?offset=0"
    await c.send(_request_bytes("GET", fetch) + _request_bytes("HEAD", fetch) + _request_bytes("GET", "/v1/status"))
    got, head, after = await c.answer(), await c.answer("HEAD"), await c.answer()
    assert got.status == head.status == 200 and head.body == b"" and after.json()["status"] == "ok"
    assert head.headers["content-length"] == str(len(got.body)) and got.json()["records"][0]["value"] == "h"
    await c.send(_request_bytes("HEAD", "/v1/topics/nope-zz"))
    assert (await c.answer("HEAD")).status == 404
    c.close()


# --- malformed requests ------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b"NOT AN HTTP REQUEST LINE\r\n\r\n",
    b"GET /v1/status HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /v1/status HTTP/1.1\r\nHost x\r\n\r\n",
    b"GET /v1/status HTTP/1.1\r\nBad Name: x\r\n\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
    b"\r\n\r\nzz\r\n[1]\r\n0\r\n\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
    b"\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\n[1]\r\n0\r\n\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc",
    b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n",
    b"GET /v1/status HTTP/1.1\r\nHost : x\r\n\r\n",
    b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Fold: a\r\n b\r\n\r\n",
    b"GET /v1/st atus HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/status\x7f HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET\t/v1/status HTTP/1.1\r\nHost: x\r\n\r\n",
])
async def test_malformed_requests_get_400_and_the_connection_closes(served, raw: bytes) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(raw)
    data = await asyncio.wait_for(c.reader.read(), 5)  # to EOF: the server closes
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), data
    assert b"Connection: close" in head and orjson.loads(body)["error"] == "bad_request"


async def test_a_malformed_request_after_good_ones_gets_its_400_after_their_answers(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status") + b"GARBAGE\r\n\r\n")
    data = await asyncio.wait_for(c.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 200") and data.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 400" in data


async def test_a_framing_error_in_the_body_of_an_answered_request_gets_no_second_answer(served) -> None:
    """Refused from its head (415), then its chunked body is not HTTP: one answer, then the connection closes."""
    _, server = served
    c = await Client.open(server.port)
    await c.send(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    head = await asyncio.wait_for(c.reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 415")
    await c.send(b"zz\r\n[1]\r\n0\r\n\r\n")
    rest = await asyncio.wait_for(c.reader.read(), 5)  # to EOF: the server closes
    assert b"HTTP/1.1 " not in rest[rest.index(b"}") + 1:], rest


# --- bounds, at and over ------------------------------------------------------------------------


async def test_request_target_at_and_over_its_bound(served) -> None:
    _, server = served
    base = "/v1/status?"
    at = base + "a" * (limits.HEADER_LINE_BYTES_MAX - len(base))
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", at))
    assert (await c.answer()).status == 200
    await c.send(_request_bytes("GET", at + "a"))
    data = await asyncio.wait_for(c.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 414") and b"uri_too_long" in data


async def test_header_line_and_head_at_and_over_their_bounds(served) -> None:
    _, server = served
    name = "X-Big"
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status", [(name, "v" * (limits.HEADER_LINE_BYTES_MAX - len(name)))]))
    assert (await c.answer()).status == 200
    await c.send(_request_bytes("GET", "/v1/status", [(name, "v" * (limits.HEADER_LINE_BYTES_MAX - len(name) + 1))]))
    data = await asyncio.wait_for(c.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 431"), data
    # many lines, each under its bound, add up to the head's bound: up to it served, past it 431
    line = limits.HEADER_LINE_BYTES_MAX // 2
    count = limits.REQUEST_HEAD_BYTES_MAX // line
    fits = [(f"X-{i:04d}", "v" * (line - 6)) for i in range(count - 1)]
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status", fits))
    assert (await c.answer()).status == 200
    await c.send(_request_bytes("GET", "/v1/status", fits + [(f"X-{i:04d}", "v" * (line - 6)) for i in range(count, count + 3)]))
    data = await asyncio.wait_for(c.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]


async def test_body_at_and_over_the_routes_bound(served) -> None:
    _, server = served
    doc = b'{"name": "bounded", "partitions": 1}'
    at = doc + b" " * (limits.ADMIN_BODY_BYTES_MAX - len(doc))
    c = await Client.open(server.port)
    await c.send(_request_bytes("POST", "/v1/topics", [("Content-Type", "application/json")], at))
    assert (await c.answer("POST")).status == 201
    await c.send(_request_bytes("POST", "/v1/topics", [("Content-Type", "application/json")], at + b" "))
    a = await c.answer("POST")
    assert a.status == 413 and a.json()["limit_bytes"] == limits.ADMIN_BODY_BYTES_MAX
    # the produce bound: a body of exactly REQUEST_BYTES_MAX is taken, one byte more is not
    lines = limits.RECORDS_PER_REQUEST_MAX
    per_line = limits.REQUEST_BYTES_MAX // lines
    body = b"".join(b'"' + b"x" * (per_line - 3) + b'"\n' for _ in range(lines))
    body += b" " * (limits.REQUEST_BYTES_MAX - len(body))
    await c.send(_produce(body, "application/x-ndjson", partition=1))
    a = await c.answer("POST", timeout_s=60)
    assert a.status == 200 and a.json()["count"] == lines
    await c.send(_produce(body + b" ", "application/x-ndjson", partition=1))
    assert (await c.answer("POST")).status == 413
    c.close()


async def test_an_ndjson_line_over_its_bound_is_refused_as_it_arrives(served) -> None:
    _, server = served
    c = await Client.open(server.port)
    head = (b"POST /v1/topics/t/messages?partition=0 HTTP/1.1\r\nHost: ring\r\nContent-Type: application/x-ndjson\r\n"
            b"Content-Length: %d\r\n\r\n" % (limits.REQUEST_BYTES_MAX - 1))
    await c.send(head + b"x" * (limits.NDJSON_LINE_BYTES_MAX + 1))  # far short of the declared body
    a = await c.answer("POST")  # answered before the body is complete
    assert a.status == 413 and a.json()["limit_bytes"] == limits.NDJSON_LINE_BYTES_MAX
    c.close()


async def test_head_deadline_and_idle_keep_alive(served, monkeypatch) -> None:
    monkeypatch.setattr(limits, "KEEPALIVE_TIMEOUT_S", 1.0)
    _, server = served
    c = await Client.open(server.port)
    t0 = time.monotonic()
    await c.send(b"GET /v1/status HTTP/1.1\r\nHost: ring\r\n")  # never completed
    assert await c.closed(HEADER_TIMEOUT_S + 3)
    assert time.monotonic() - t0 > HEADER_TIMEOUT_S * 0.9
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status"))
    assert (await c.answer()).status == 200
    t0 = time.monotonic()
    assert await c.closed(limits.KEEPALIVE_TIMEOUT_S + 3)  # idle after an answer: keep-alive's deadline
    assert time.monotonic() - t0 > limits.KEEPALIVE_TIMEOUT_S * 0.9


async def test_body_deadline_is_408(served, monkeypatch) -> None:
    monkeypatch.setattr(limits, "BODY_READ_TIMEOUT_S", 0.5)
    _, server = served
    c = await Client.open(server.port)
    await c.send(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: ring\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 10\r\n\r\n[1,")
    data = await asyncio.wait_for(c.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 408") and b"request_timeout" in data


async def test_send_deadline_a_slow_reader_in_time_gets_it_all_one_past_it_is_cut_off(tmp_path: Path) -> None:
    """A large answer taken slowly but within the send deadline arrives whole; one the client stops
    taking is dropped with its connection once the deadline passes."""
    send_s = 2.0
    async with serving_alone(tmp_path / "data", "never", send_timeout_s=send_s) as (broker, server):
        await broker.add_topic(TopicConfig(name="big", partitions=1, replication_factor=1))
        value = b'"' + b"x" * (limits.MESSAGE_BYTES_MAX - 100) + b'"'
        for _ in range(12):  # an answer larger than the socket buffers the kernel may give it (4 MiB)
            await results_of("big", broker.intake.produce(Produce("big", Records([(None, None, value, None)], [len(value)],
                                                                             True, False), 0, consistency="one")))
        fetch = _request_bytes("GET", "/v1/topics/big/partitions/0/messages?offset=0&max_bytes=16777216",
                               [("Accept", "application/vnd.ring.batches")])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 18)  # the server waits on this reader
        sock.connect(("127.0.0.1", server.port))
        slow = Client(*await asyncio.open_connection(sock=sock))
        await slow.send(fetch)
        t0 = time.monotonic()
        got = 0
        while got < 12 * len(value):  # 256 KiB every 10 ms: about 0.5 s for 12 MiB
            chunk = await asyncio.wait_for(slow.reader.read(1 << 18), 5)
            assert chunk, f"cut off after {got} bytes"
            got += len(chunk)
            await asyncio.sleep(0.01)
        assert time.monotonic() - t0 > 0.3  # it was slow: the server waited on it
        slow.close()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
        await asyncio.get_running_loop().sock_sendall(sock, fetch)
        await _until(lambda: len(server.connections) == 1)
        t0 = time.monotonic()
        await _until(lambda: not server.connections, send_s + 3)  # never taken: cut off at the deadline
        assert time.monotonic() - t0 > send_s * 0.5
        sock.close()


async def test_connections_at_and_over_the_bound(served) -> None:
    _, server = served
    held = [await Client.open(server.port) for _ in range(8)]  # the fixture's bound
    for c in held:
        await c.send(_request_bytes("GET", "/v1/status"))
        assert (await c.answer()).status == 200
    over = await Client.open(server.port)
    data = await asyncio.wait_for(over.reader.read(), 5)
    assert data.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in data
    held[0].close()
    deadline = time.monotonic() + 5
    while len(server.connections) >= 8 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status"))
    assert (await c.answer()).status == 200
    for c in held[1:] + [c]:
        c.close()


async def test_the_end_of_an_answer_is_reported_on_its_connection(served) -> None:
    """Each connection has a stable identity, and knows which of its answers have left whole."""
    broker, server = served
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status"))
    await c.answer()
    (conn,) = server.connections
    assert conn.written_through(0) and not conn.written_through(1)
    await c.send(_request_bytes("GET", "/v1/status"))
    await c.answer()
    assert conn.written_through(1) and server.connections == {conn}
    c.close()


async def test_a_connection_whose_requests_cannot_run_is_aborted_at_its_stall_deadline(served, monkeypatch) -> None:
    """A connection holding requests the answer bounds keep from running has a deadline too, and a
    connection that ran what it held has none of it left."""
    _, server = served
    monkeypatch.setattr(limits, "CONNECTION_STALL_TIMEOUT_S", 0.5)
    c = await Client.open(server.port)
    await c.send(_request_bytes("GET", "/v1/status"))
    assert (await c.answer()).status == 200
    conn = await _one_connection(server)
    assert conn.stall_deadline == 0.0
    monkeypatch.setattr(limits, "CONNECTION_ANSWER_BYTES_MAX", 0)  # no answer fits: nothing runs
    await c.send(_request_bytes("GET", "/v1/status"))
    await _until(lambda: conn.stall_deadline > 0)
    data = await asyncio.wait_for(c.reader.read(), 5)  # to EOF: aborted, never answered
    assert data == b"" and conn not in server.connections
    c.close()
