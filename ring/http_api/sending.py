"""A front connection's answers on their way out: ``Sending``, handing each to the transport and
following it until its bytes have left this process.

An answer that fits in a piece is written with its head in one write; a
larger one in ANSWER_WRITE_CHUNK_BYTES pieces (copies), as far as the
transport takes them (``Wire.paused``: its ``pause_writing``). Its hold
(``answer_budget.Hold``) is given back once the last piece is handed over, and
``Response.before_last`` runs right before that piece's write, in the same
synchronous step (``ring.http_api.link``). ``Response.on_written`` is
called once every byte of the answer has left this process (the transport's
buffer is empty), never if the connection is lost first. ``Sending`` is
given its ``Wire``, the names it uses of the connection (``front.py``).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Protocol

from ring import limits
from ring.http_api.exchange import NO_BODY_STATUSES, Exchange, answer_head
from ring.http_api.web import Response

log = logging.getLogger("ring.http")


class Wire(Protocol):
    """What ``Sending`` uses of its connection."""

    front: Any  # server.Front: its now, date and send_timeout_s
    transport: Any
    queue: deque[Exchange]  # the requests not yet answered whole, in order
    paused: bool  # the transport asked for no more writes
    closed: bool
    close_when_sent: bool
    send_deadline: float  # 0.0: none


class Sending:
    __slots__ = ("wire", "ex", "view", "pos", "written", "unconfirmed")

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.ex: Exchange | None = None  # the answer handed over piece by piece, while it is
        self.view: memoryview | None = None
        self.pos = 0
        self.written = -1  # seq of the last answer whose bytes have all left this process
        self.unconfirmed: list[tuple[int, Any]] = []  # (seq, on_written) handed over, maybe still buffered

    def drop(self) -> None:
        """The connection is lost: nothing more goes out, nobody is told."""
        self.unconfirmed.clear()
        self.ex = None
        self.view = None

    def write(self, ex: Exchange) -> bool:
        """Hand ``ex``'s answer to the transport, piece by piece; True once all of it is handed over."""
        resp = ex.response
        assert resp is not None
        wire = self.wire
        transport = wire.transport
        if self.ex is not ex:
            body = resp.body
            size = len(body)
            close = not ex.keep_alive or (wire.close_when_sent and len(wire.queue) == 1)
            head = answer_head(resp, size, close, wire.front.date)
            if ex.http10 and not close:
                head = head[:-2] + b"Connection: keep-alive\r\n\r\n"  # HTTP/1.0 closes unless told
            if ex.head_only or resp.status in NO_BODY_STATUSES:
                if resp.before_last is not None:
                    resp.before_last()
                transport.write(head)
                return self._sent(ex, resp)
            if size <= limits.ANSWER_WRITE_CHUNK_BYTES:
                if resp.before_last is not None:
                    resp.before_last()
                transport.write(head + body)
                return self._sent(ex, resp)
            transport.write(head)
            self.ex, self.view, self.pos = ex, memoryview(body), 0
            if not wire.send_deadline:
                wire.send_deadline = wire.front.now + wire.front.send_timeout_s
        view, step = self.view, limits.ANSWER_WRITE_CHUNK_BYTES
        assert view is not None
        while self.pos < len(view):
            if wire.paused or wire.closed:
                return False
            if self.pos + step >= len(view) and resp.before_last is not None:
                resp.before_last()  # no await between this and the last piece's write
            # A copy of each piece: a transport that queues what it cannot send at once keeps only
            # that piece, never (through a slice) the whole answer after its hold is gone.
            transport.write(bytes(view[self.pos : self.pos + step]))
            self.pos += step
        self.ex, self.view = None, None
        return self._sent(ex, resp)

    def _sent(self, ex: Exchange, resp: Response) -> bool:
        on_written = resp.on_written
        resp.release()
        wire = self.wire
        if not wire.paused:
            wire.send_deadline = 0.0
        if on_written is None and not self.unconfirmed and not wire.transport.get_write_buffer_size():
            self.written = ex.req.seq  # all out already, nobody to tell
        else:
            self.unconfirmed.append((ex.req.seq, on_written))
            self.confirm()
        return True

    def confirm(self) -> None:
        """Answers whose bytes have all left the transport's buffer: mark them written, and say so."""
        if self.wire.closed or self.wire.transport.get_write_buffer_size():
            return
        done, self.unconfirmed = self.unconfirmed, []
        for seq, on_written in done:
            self.written = seq
            if on_written is not None:
                try:
                    on_written()
                except Exception:
                    log.exception("an on_written callback failed")

    def written_through(self, seq: int) -> bool:
        """Whether the answer to request ``seq`` (and every one before) has left this process whole."""
        if self.unconfirmed:
            self.confirm()
        return self.written >= seq
