"""The pieces a connection's reads are parsed in (``pieces.Unparsed``): however a read is made up, the
parser completes no more requests than the pipeline has room for, and every byte is parsed once."""

from __future__ import annotations

import random

import httptools
import pytest

from ring import limits
from ring.http_api.pieces import Unparsed


class _Count:
    """A parser's protocol that counts complete requests and follows their bodies, as the front does."""

    def __init__(self, unparsed: Unparsed) -> None:
        self.unparsed = unparsed
        self.parser = httptools.HttpRequestParser(self)
        self.complete = 0
        self.heads = 0  # complete heads: the front queues a request then
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()

    def on_message_begin(self) -> None:
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.heads += 1
        length = self.headers.get(b"content-length")
        self.unparsed.body(int(length) if length else None, b"transfer-encoding" in self.headers)

    def on_body(self, data: bytes) -> None:
        self.unparsed.took(len(data))
        self.body += data

    def on_message_complete(self) -> None:
        self.unparsed.ended()
        self.complete += 1


SHORTEST = b"GET / HTTP/1.1\r\n\r\n"
KINDS = [SHORTEST, b"\r\nGET * HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n",
         b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n0\n0\n0",
         b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n\n0\n\r\n0\r\n\r\n",
         b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: 1\r\n\r\n",
         b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n\n0\r\n1\r\n0\r\n0\r\n0: 1\r\nX: 0\r\n\r\n",
         b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"a\r\n0123456789\r\n" * 300 + b"0\r\n\r\n"]


def test_no_request_is_shorter_than_request_bytes_min() -> None:
    assert len(SHORTEST) >= limits.REQUEST_BYTES_MIN
    c = _Count(Unparsed())
    c.parser.feed_data(SHORTEST)
    assert c.complete == 1
    for short in (b"GET / HTTP/1.1\n\n", b"GET / HTTP/1.1\r\n\n", b"GET / HTTP/1.1\r\r\n"):
        c = _Count(Unparsed())
        try:
            c.parser.feed_data(short)
        except httptools.HttpParserError:
            pass
        assert c.complete == 0, short
    # HTTP/0.9 ("GET /" and two CRLFs) is shorter, but nothing after one is parsed
    c = _Count(Unparsed())
    with pytest.raises(httptools.HttpParserError):
        c.parser.feed_data(b"GET /\r\n\r\n" + SHORTEST)
    assert c.complete == 1


@pytest.mark.parametrize("seed", range(40))
def test_a_piece_completes_no_more_requests_than_there_is_room_for(seed: int) -> None:
    rnd = random.Random(seed)
    chosen = [rnd.choice(KINDS) for _ in range(400)]
    stream = b"".join(chosen)
    unparsed = Unparsed()
    c = _Count(unparsed)
    pos = 0
    while pos < len(stream):
        n = rnd.randint(1, 4096)
        unparsed.add(stream[pos:pos + n])
        pos += n
        while unparsed.data:
            room = rnd.randint(1, 8)
            before = c.heads
            c.parser.feed_data(unparsed.piece(room))
            assert c.heads - before <= room
    assert c.complete == c.heads == 400
    assert len(c.body) == sum({KINDS[3]: 5, KINDS[4]: 3, KINDS[6]: 3, KINDS[7]: 3000}.get(k, 0) for k in chosen)
