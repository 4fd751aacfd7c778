"""Fetch answers leave the broker with bounded memory: a byte budget, and bodies that are dropped once sent.

Two things held answer bytes without bound. aiohttp's ``Response`` keeps its
body after sending it, and aiohttp's connection loop keeps a keep-alive
connection's last response until the next request arrives on it, so every
idle consumer connection pinned its last fetch answer (megabytes) for as
long as it stayed open: after a consumer read a topic from offset 0 over a
pool of connections, a broker held one answer per connection. And nothing
counted the answers being sent at once: a client that asks for
``FETCH_BYTES_MAX`` and reads slowly, or never, holds its answer until
``RESPONSE_SEND_TIMEOUT_S``, and ``CLIENT_CONNECTIONS_OPEN_MAX`` such clients
held tens of GiB.

``AnswerBudget`` (one per broker, ``budget_of``) counts the bytes of answers
the broker holds, from the read (its disk, or a replica it proxies) until the
last byte is handed to the socket, up to ``FETCH_ANSWER_BYTES_IN_FLIGHT_MAX``.
A fetch asks the log for no more than what is left (``grant``), holds what it
read (``hold``) and is answered 429 with ``Retry-After`` when nothing is left
or its answer no longer fits. ``response`` wraps an answer in a body that is
written in ``ANSWER_WRITE_CHUNK_BYTES`` pieces (copies: the transport never
queues, nor pins through a slice, a whole answer), drops its bytes and gives its hold back as soon as the last
piece is written, or when the send fails or never starts. ``before_last_piece`` asks an answer to call back
right before its last piece goes to the transport (a group poll marks its connection then: ``link``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

from ring import limits
from ring.errors import Overloaded


class AnswerBudget:
    def __init__(self, bytes_max: int = limits.FETCH_ANSWER_BYTES_IN_FLIGHT_MAX) -> None:
        self.bytes_max = bytes_max
        self.used = 0
        self.refused = 0  # answers refused with 429 here (tests, metrics)

    def _refuse(self, why: str) -> Overloaded:
        self.refused += 1
        return Overloaded(f"{why}: this broker holds {self.used} bytes of fetch answers not yet sent "
                          f"(bound {self.bytes_max}); retry later", limit_bytes=self.bytes_max)

    def grant(self, max_bytes: int) -> int:
        """How much a read may ask for now: ``max_bytes``, or less when other answers hold the room."""
        room = self.bytes_max - self.used
        if room <= 0:
            raise self._refuse("no room for another answer")
        return min(max_bytes, room)

    def hold(self, size: int) -> Hold:
        """Count ``size`` bytes until the returned hold is released; 429 when they do not fit."""
        if self.used + size > self.bytes_max:
            raise self._refuse(f"an answer of {size} bytes does not fit")
        self.used += size
        return Hold(self, size)


class Hold:
    """Bytes counted in a budget; ``release`` is idempotent."""

    __slots__ = ("budget", "size", "__weakref__")

    def __init__(self, budget: AnswerBudget, size: int) -> None:
        self.budget = budget
        self.size = size

    def resize(self, size: int) -> None:
        """The held answer became ``size`` bytes (encoded); 429 and released when that does not fit."""
        budget = self.budget
        if budget.used - self.size + size > budget.bytes_max:
            self.release()
            raise budget._refuse(f"an answer of {size} bytes does not fit")
        budget.used += size - self.size
        self.size = size

    def release(self) -> None:
        self.budget.used -= self.size
        self.size = 0

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_budgets: weakref.WeakKeyDictionary[Any, AnswerBudget] = weakref.WeakKeyDictionary()


def budget_of(broker: Any) -> AnswerBudget:
    """The one budget of ``broker`` (its client API and its proxied reads share it)."""
    budget = _budgets.get(broker)
    if budget is None:
        budget = _budgets[broker] = AnswerBudget()
    return budget


class SentOnce(Payload):
    """An answer body written once in pieces, then dropped; its hold is released then (or at close)."""

    def __init__(self, data: bytes, content_type: str, hold: Hold | None) -> None:
        super().__init__(data, content_type=content_type)
        self._size = len(data)
        self._hold = hold
        self.before_last: Callable[[], None] | None = None
        # Backstop for an answer never sent (the client left before its headers):
        # the hold goes when the response object goes.
        self._finalizer = weakref.finalize(self, hold.release) if hold is not None else None

    def _done(self) -> None:
        self._value = b""
        if self._finalizer is not None:
            self._finalizer()  # releases the hold, once

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        try:
            view = memoryview(self._value)
            end = len(view) if content_length is None else min(len(view), content_length)
            step = limits.ANSWER_WRITE_CHUNK_BYTES
            for pos in range(0, end, step):
                if pos + step >= end and self.before_last is not None:
                    # No await between this and the write below handing the bytes to the transport.
                    self.before_last()
                # A copy of each piece: a transport that queues what it cannot send at once
                # keeps only that piece, never (through a slice) the whole answer after its hold is gone.
                await writer.write(bytes(view[pos : min(pos + step, end)]))  # waits while the transport is full
        finally:
            self._done()

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._value).decode(encoding, errors)

    async def close(self) -> None:
        self._done()


def response(body: bytes, content_type: str, headers: dict[str, str], hold: Hold | None = None,
             status: int = 200) -> web.Response:
    """An answer whose body is not kept once sent (nor, with ``hold``, counted any longer)."""
    headers = {**headers, hdrs.CONTENT_LENGTH: str(len(body))}
    return web.Response(body=SentOnce(body, content_type, hold), headers=headers, status=status)


def before_last_piece(resp: web.Response, callback: Callable[[], None]) -> None:
    """Have ``callback`` run right before the last piece of ``resp`` (made by ``response``) is written."""
    body = resp.body
    assert isinstance(body, SentOnce), type(body)
    body.before_last = callback


def body_bytes(resp: web.Response) -> bytes:
    """The body of an answer not sent yet, made by ``response`` or as a plain ``web.Response``."""
    body = resp.body
    if isinstance(body, SentOnce):
        return bytes(body._value)
    assert isinstance(body, (bytes, bytearray)), type(body)
    return bytes(body)
