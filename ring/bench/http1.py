"""A minimal keep-alive HTTP/1.1 client for the load generator's produce path.

A produce is one POST with a pre-built head and a stored-batch body, answered
with a small JSON body and a Content-Length. This client does exactly that
and no more: one request at a time per connection (no pipelining, so every
request is handled on its own, as from separate clients), a pool of open
connections per broker, the answer's head read for the status and the
Content-Length and nothing else. It costs a fraction of a general client's
CPU per request, which on a two-core machine is CPU the brokers get back;
NATS's and RabbitMQ's Python clients likewise write their own frames.

Anything outside that (a chunked answer, a closed connection, a malformed
head) is an error of that request, and the connection is dropped.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

ANSWER_HEAD_BYTES_MAX = 16 << 10  # a produce answer's head is a few hundred bytes
ANSWER_BODY_BYTES_MAX = 1 << 20


class HttpError(Exception):
    pass


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = exc or ConnectionResetError("connection closed by the broker")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        try:
            answer = self._answer()
        except HttpError as exc:
            waiter.set_exception(exc)
            return
        if answer is not None:
            self.waiter = None
            waiter.set_result(answer)

    def _answer(self) -> tuple[int, bytes, bool] | None:
        """(status, body, keep_alive) once a whole answer is in the buffer."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > ANSWER_HEAD_BYTES_MAX:
                raise HttpError("answer head over its limit")
            return None
        head = bytes(self.buf[:end]).lower()
        if not head.startswith(b"http/1.1 ") or len(head) < 12 or not head[9:12].isdigit():
            raise HttpError(f"not an HTTP/1.1 answer: {head[:40]!r}")
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise HttpError("answer without Content-Length")
        line_end = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : line_end if line_end >= 0 else len(head)])
        if length > ANSWER_BODY_BYTES_MAX:
            raise HttpError("answer body over its limit")
        start = end + 4
        if len(self.buf) < start + length:
            return None
        body = bytes(self.buf[start : start + length])
        del self.buf[: start + length]
        return int(head[9:12]), body, b"\r\nconnection: close" not in head

    async def request(self, data: bytes) -> tuple[int, bytes, bool]:
        assert self.transport is not None and self.waiter is None
        if self.lost is not None:
            raise self.lost
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Open connections to one broker (``http://host:port``), reused one request at a time."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        if u.scheme != "http" or u.hostname is None:
            raise ValueError(f"plain http URLs only: {url}")
        self.host, self.port = u.hostname, u.port or 80
        self.host_header = f"{u.hostname}:{self.port}"
        self.idle: list[_Connection] = []
        self.all: set[_Connection] = set()

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        self.all.add(conn)
        return conn

    async def request(self, data: bytes) -> tuple[int, bytes]:
        """Send a whole request (head and body, built by the caller); its status and body."""
        conn = self.idle.pop() if self.idle else await self._open()
        try:
            status, body, keep = await conn.request(data)
        except BaseException:
            self.all.discard(conn)
            conn.close()
            raise
        if keep and conn.lost is None:
            self.idle.append(conn)
        else:
            self.all.discard(conn)
            conn.close()
        return status, body

    def post_head(self, path_and_query: str, content_type: str, length: int) -> bytes:
        return (f"POST {path_and_query} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n").encode()

    def get_head(self, path_and_query: str) -> bytes:
        return f"GET {path_and_query} HTTP/1.1\r\nHost: {self.host_header}\r\n\r\n".encode()

    def close(self) -> None:
        for conn in self.all:
            conn.close()
        self.all.clear()
        self.idle.clear()
