"""ring's HTTP/1.1 front for the client port: one ``asyncio.Protocol`` per connection, parsed by httptools.

Theory of operation.

* Reading. Bytes go to httptools (llhttp, the parser uvicorn uses) as they
  arrive. When a request's head is complete, ``handling.admit`` finds its
  route and checks it before a byte of the body is taken: a request refused
  there is answered at once, and its body, if the client sends it anyway, is
  read and dropped. Otherwise the body is taken piece by piece into an
  ``Incoming`` (decoded, bounded, counted).
  A read is fed to the parser in pieces that cannot complete more requests
  than the pipeline (PIPELINED_REQUESTS_MAX) has room for (``pieces.py``);
  when it is full the rest of the read waits and reading pauses.
* Running. A connection runs one request at a time, in the order they came:
  pipelined requests wait their turn, parsed. The next one runs only while
  the transport takes writes and the answers built and not yet sent are
  under CONNECTION_ANSWER_BYTES_MAX for the connection and under
  FRONT_ANSWER_BYTES_IN_FLIGHT_MAX for all of them (``server.Front``): a
  client that does not read holds one answer past the bound, not one per
  request. A handler's answer is a ``Response`` (written at once), a
  ``Later`` (written from its future's callback), or a coroutine, the one
  case that costs a task. One loop (``advance``) writes, runs and feeds in
  turn until nothing more can be done; what calls it while it runs only
  asks it to go round again, so no input makes the front recurse.
* Writing. Answers leave in request order, each handed to the transport by
  the connection's ``Sending`` (``sending.py``: one write when it fits in a
  piece, else ANSWER_WRITE_CHUNK_BYTES pieces), paced by the transport's
  ``pause_writing``/``resume_writing``. ``Response.on_written`` is called
  once every byte of the answer has left this process, never if the
  connection is lost first.
* Time. No timer per request: each connection keeps its deadlines (the head
  being received, the body, the answer being sent, the idle keep-alive) as
  plain numbers, and one periodic sweep per server (``server.Front.sweep``) ends
  the connections past one. A head not complete in time, or an idle
  connection, is closed; a body not complete in time gets 408; an answer
  the client does not take in time has its connection aborted, and so has
  a connection whose requests cannot run (the answer bounds above) for
  CONNECTION_STALL_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httptools

from ring import limits
from ring.errors import BodyTimeout, RingError
from ring.http_api import handling, web
from ring.http_api.exchange import (ANSWERED, METHODS, READY, RECEIVING, RUNNING, Exchange, HeadError,
                                    answer_head, check_framing, origin_path)
from ring.http_api.link import ClientLink, Via
from ring.http_api.pieces import Unparsed
from ring.http_api.sending import Sending
from ring.http_api.web import Request, Response

log = logging.getLogger("ring.http")
access_log = logging.getLogger("ring.access")

# What an answer's head is counted for against the answer bounds, on top of its body.
ANSWER_HEAD_BYTES = 256
# The states of the first request in line with which ``_run_next`` may start one: it is ready, or
# answered with others behind it.
_MAY_RUN = (READY, ANSWERED)

# The lower-cased names of the fields most requests carry, as clients spell them: no decode and
# lower per field for these.
_HEADER_KEYS = {spelt.encode(): spelt.lower() for name in (
    "Host", "Content-Length", "Content-Type", "Accept", "User-Agent", "Connection", "Authorization",
    "Accept-Encoding", "Content-Encoding", "Transfer-Encoding", "Expect") for spelt in (name, name.lower())}


class Connection(asyncio.Protocol):
    __slots__ = ("front", "app", "id", "transport", "parser", "queue", "receiving", "closed", "paused",
                 "reading_paused", "parse_stopped", "close_when_sent", "seq", "out",
                 "header_deadline", "body_deadline", "send_deadline", "idle_deadline",
                 "stall_deadline", "_url", "_headers", "_head_bytes", "_fields", "_in_head", "_head_fed", "_begun",
                 "link", "_via", "_via_none", "_held", "unparsed",
                 "_advancing", "_again", "answer_bytes", "_handed", "_eof", "__weakref__")

    def __init__(self, front: Any) -> None:  # server.Front
        self.front = front
        self.app = front.app
        front.next_id += 1
        self.id = front.next_id  # stable for the connection's life, unique per server
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Exchange] = deque()
        self.receiving: Exchange | None = None  # the request whose body is arriving
        self.closed = False
        self.paused = False  # the transport asked us to stop writing
        self.reading_paused = False
        self.parse_stopped = False  # no more requests are read on this connection
        self.close_when_sent = False
        self.seq = 0  # requests begun on this connection
        self.out = Sending(self)  # the answers on their way out
        self.header_deadline = self.body_deadline = self.send_deadline = self.idle_deadline = 0.0
        self.stall_deadline = 0.0  # armed while its next request cannot run for the answer bounds
        self.unparsed = Unparsed()  # what was read and not parsed yet
        self._advancing = False  # advance is running: a call from inside it asks for another round
        self._again = False
        self.answer_bytes = 0  # of answers built and not yet sent (counted in front.answer_bytes too)
        self._handed = 0  # of those, handed to the transport (sent once its buffer is empty)
        self._eof = False  # the client sent its last byte (a half-close): close once it has its answers
        self._url = b""
        self._headers = web.Headers()
        self._head_bytes = 0
        self._fields = 0  # header (and trailer) fields of the request being received
        self._in_head = False
        self._head_fed = 0
        self._begun = 0.0  # clock time (monotonic) of the first byte of the request being received
        self.link = ClientLink()  # the group poll answers this connection wrote whole (``link``)
        self._via_none = Via(self.link, None)  # the Via of a request that proves no poll answer read
        self._via = self._via_none  # the Via of the request being received, made at its first byte
        self._held = False  # reading was paused: bytes read next may have waited in the kernel

    # --- the connection --------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        front = self.front
        if len(front.connections) >= front.connections_max or front.closing:
            self._refuse()
            return
        front.connections[self] = None
        self.header_deadline = front.clock.monotonic() + front.header_timeout_s  # the first request must come

    def _refuse(self) -> None:
        """Over the connection bound: a 503 the client can read, then close; the request is never read."""
        self.closed = True
        bound = self.front.connections_max
        log.warning("refusing a connection: %d are open (the bound)", bound)
        resp = web.error(503, {"error": "unavailable",
                               "message": f"{bound} connections are open on this broker; retry later"}, 1.0)
        self.transport.write(answer_head(resp, len(resp.body), True, self.front.date) + resp.body)
        self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.closed and self not in self.front.connections:
            return
        self.closed = True
        self.front.connections.pop(self, None)
        for ex in self.queue:
            self._drop(ex)
        self.queue.clear()
        self.out.drop()
        self.unparsed.drop()
        self.front.release(self.answer_bytes, self)
        self.answer_bytes = self._handed = 0

    def _drop(self, ex: Exchange) -> None:
        if ex.incoming is not None:
            ex.incoming.release()
            ex.incoming = None
        if ex.response is not None:
            ex.response.release()

    def eof_received(self) -> bool:
        """The client shut its sending side: the requests it completed are answered, then the
        connection closes (True keeps the transport open for those answers)."""
        self._eof = True
        self.advance()
        return not self.closed

    def pause_writing(self) -> None:
        self.paused = True
        if not self.send_deadline:
            self.send_deadline = self.front.now + self.front.send_timeout_s

    def resume_writing(self) -> None:
        self.paused = False
        if self.out.ex is None:
            self.send_deadline = 0.0
        self.out.confirm()
        self.advance()

    def close(self) -> None:
        if not self.closed:
            self.transport.close()
            self.connection_lost(None)

    def check(self, now: float) -> None:
        """The sweep's visit: end what is past its deadline."""
        if self.out.unconfirmed:
            self.out.confirm()
        if self._handed and self._sent():
            self.advance()
        if self.send_deadline and now > self.send_deadline:
            log.info("aborting a connection whose client did not take its answer within %g s",
                     self.front.send_timeout_s)
            self.transport.abort()  # close() would wait for the unread bytes to drain: forever
            self.connection_lost(None)
        elif self.header_deadline and now > self.header_deadline:
            log.info("closing a connection that sent no complete request head within %g s",
                     self.front.header_timeout_s)
            self.close()
        elif self.body_deadline and now > self.body_deadline:
            self._body_timed_out()
        elif self.idle_deadline and now > self.idle_deadline:
            self.close()
        elif self.stall_deadline and now > self.stall_deadline:
            log.info("aborting a connection whose requests could not run for %g s: answers built for it, or "
                     "for all connections, were not taken", limits.CONNECTION_STALL_TIMEOUT_S)
            self.transport.abort()
            self.connection_lost(None)

    def _body_timed_out(self) -> None:
        self.body_deadline = 0.0
        ex = self.receiving
        self.receiving = None
        self.parse_stopped = True  # the parser is inside a body that will not end: nothing more is read
        self.unparsed.drop()
        self.close_when_sent = True
        if ex is None or ex.response is not None:
            self.close()
            return
        self._answer(ex, self.app.answer_error(BodyTimeout(f"request body not received within "
                                                    f"{limits.BODY_READ_TIMEOUT_S:g} s")))

    # --- reading ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.parse_stopped or self.closed:
            return
        if self.out.unconfirmed:
            self.out.confirm()
        self.unparsed.add(data)  # (to a rest only if a transport hands over what it read before it paused)
        self.advance()

    def _feed(self) -> bool:
        """Parse the next piece of what was read, as much as the pipeline has room for; False when
        nothing could be fed (nothing read, or no room: then reading pauses until there is)."""
        if not self.unparsed.data or self.parse_stopped or self.closed:
            return False
        room = limits.PIPELINED_REQUESTS_MAX - len(self.queue)
        if room <= 0:
            if not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            self._held = True  # the rest waits: it was read before the answers written meanwhile
            return False
        began_in_head = self._in_head
        piece = self.unparsed.piece(room)
        self._parse(piece)
        if self._in_head and not self.parse_stopped:
            # Raw bytes of a head not complete yet: the pieces fed while inside it (the first may hold
            # the end of the previous request), so a head of many short lines counts what it sent, and
            # is refused at most one piece past the bound.
            self._head_fed = self._head_fed + len(piece) if began_in_head else 0
            if self._head_fed > limits.REQUEST_HEAD_BYTES_MAX:
                self._protocol_error(431, f"request head over {limits.REQUEST_HEAD_BYTES_MAX} bytes")
        if not self.unparsed.data and not self.closed:
            self._held = self.reading_paused  # what is read next may have waited in the kernel
            if self.reading_paused:
                self.reading_paused = False
                self.transport.resume_reading()
        return True

    def _parse(self, piece: Any) -> None:
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            self.parse_stopped = True  # no upgrades here: what follows the head is not HTTP; answer and close
            self.unparsed.drop()
            self.close_when_sent = True
            if not self.queue:
                self.close()
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, RingError):
                self._protocol_error(cause.status, cause.message)
            else:
                log.error("reading a request failed", exc_info=cause)
                self._protocol_error(500, "internal error; the broker log has the details")
        except httptools.HttpParserError as exc:
            self._protocol_error(400, str(exc) or type(exc).__name__)

    def _protocol_error(self, status: int, message: str) -> None:
        """The bytes are not a request we can read: answer (after the answers owed) and close."""
        self.parse_stopped = True
        self.unparsed.drop()
        self.close_when_sent = True
        self.header_deadline = self.body_deadline = 0.0
        log.debug("protocol error %d: %s", status, message)
        ex = self.receiving
        if ex is not None and ex.response is not None:
            # Answered from its head while its body came (413, 415, ...): that answer is the only one
            # this request gets; the bytes after it cannot be read, so the connection ends with it.
            self.receiving = None
            ex.keep_alive = ex.linger = False
            if ex in self.queue:
                self.advance()
            else:
                self.close()
            return
        if ex is None or ex.response is not None or ex.state != RECEIVING:
            # Not a request: no method, no route (not counted as one by the metrics).
            ex = Exchange(Request("", "", "", web.Headers(), self.app, self, self.seq), False, self.front.now)
            self.queue.append(ex)
        self.receiving = None
        ex.keep_alive = False
        self._answer(ex, web.http_error(status, message[:300]))

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_fed = 0
        self._head_bytes = self._fields = 0
        self._url = b""
        self._headers = web.Headers()
        self.idle_deadline = 0.0
        self._begun = now = self.front.clock.monotonic()
        self.header_deadline = now + self.front.header_timeout_s
        # What this connection had written whole before this request's first byte (none after a pause
        # in reading: these bytes may have waited in the kernel since before that answer went out).
        seen = self.link.written
        self._via = self._via_none if seen is None or self._held else Via(self.link, seen)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > limits.HEADER_LINE_BYTES_MAX:
            raise HeadError(414, f"request target over {limits.HEADER_LINE_BYTES_MAX} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        if size > limits.HEADER_LINE_BYTES_MAX:
            raise HeadError(431, f"a header line over {limits.HEADER_LINE_BYTES_MAX} bytes")
        self._head_bytes += size
        if self._head_bytes > limits.REQUEST_HEAD_BYTES_MAX:
            raise HeadError(431, f"request head over {limits.REQUEST_HEAD_BYTES_MAX} bytes")
        self._fields += 1
        if self._fields > limits.REQUEST_HEADER_FIELDS_MAX:
            raise HeadError(431, f"request head over {limits.REQUEST_HEADER_FIELDS_MAX} header fields")
        if not self._in_head:
            return  # a trailer field of a chunked body: counted with the head, never taken as a header
        headers = self._headers
        key = _HEADER_KEYS.get(name) or name.decode("latin-1").lower()
        old = dict.get(headers, key)
        if old is not None and key == "host":
            raise HeadError(400, "a request must carry one Host header field, not more")
        text = value.decode("latin-1")
        headers[key] = text if old is None else old + ", " + text  # repeated fields join (RFC 9110 5.3)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self.header_deadline = 0.0
        front = self.front
        headers = self._headers
        version = self.parser.get_http_version()
        check_framing(headers, version)  # 400 or 501 before anything is decided on its head
        coding = dict.get(headers, "transfer-encoding")
        http10 = version == "1.0"
        path, _, query = self._url.decode("latin-1").partition("?")
        if not path.startswith("/"):
            path = origin_path(path)
        raw_method = self.parser.get_method()
        method = METHODS.get(raw_method) or raw_method.decode("latin-1")
        req = Request(method, path, query, headers, self.app, self, self.seq)
        req.via = self._via
        self.seq += 1
        # An HTTP/1.0 body framed by Transfer-Encoding may be framed wrong: close after it (RFC 9112 6.1).
        keep_alive = self.parser.should_keep_alive() and not front.closing and not (http10 and coding is not None)
        ex = Exchange(req, keep_alive, self._begun)
        ex.http10 = http10
        self.queue.append(ex)
        self.receiving = ex
        has_body = dict.get(headers, "content-length", "0") != "0" or "transfer-encoding" in headers
        self.unparsed.body(req.content_length, coding is not None)
        # (an HTTP/1.0 client does not wait for 100 Continue: RFC 9110 10.1.1)
        expect = has_body and not http10 and dict.get(headers, "expect", "").lower() == "100-continue"
        try:
            handling.admit(self.app, ex, has_body)
        except RingError as exc:
            if expect:
                ex.keep_alive = False  # the client will not send the body: close instead of waiting for it
            else:
                ex.linger = has_body
            self._answer(ex, handling.error_answer(req, exc))
        if has_body:
            self.body_deadline = self._begun + limits.BODY_READ_TIMEOUT_S
            if expect and ex.state == RECEIVING:
                ex.expect_continue = True
                self.advance()

    def on_body(self, data: bytes) -> None:
        self.unparsed.took(len(data))
        ex = self.receiving
        if ex is None or ex.incoming is None:
            return
        try:
            ex.incoming.add(data)
        except RingError as exc:
            ex.incoming.release()
            ex.incoming = None  # the rest is dropped as it comes
            self._answer(ex, self.app.answer_error(exc))

    def on_message_complete(self) -> None:
        ex = self.receiving
        self.receiving = None
        self.body_deadline = 0.0
        self.unparsed.ended()
        if ex is None:
            return
        if ex.incoming is not None:
            try:
                req = ex.req  # (no local name for the body: a handler may drop it while it runs)
                req.body = ex.incoming.finish()
                req.body_size = len(req.body)
            except RingError as exc:
                ex.incoming.release()
                ex.incoming = None
                self._answer(ex, self.app.answer_error(exc))
                return
        if ex.state == RECEIVING:
            ex.state = READY
            self.advance()
        elif ex.linger and self.close_when_sent and ex not in self.queue:
            self.close()  # its early answer is written; the body it was owed is in: now it may close

    # --- running ---------------------------------------------------------------------------

    def advance(self) -> None:
        """Write what is due, run the next request, parse more of what was read: round after round
        until none of them can go on. A call made while it runs (an answer made synchronously, a
        request completed by the parser) only asks for another round."""
        if self._advancing:
            self._again = True
            return
        self._advancing = True
        try:
            queue = self.queue
            while not self.closed:
                self._again = False
                # Each step is called only when it may have something to do (a call costs as much as its check).
                head = queue[0] if queue else None
                progressed = ((head is not None and (head.state == ANSWERED or head.expect_continue))
                              or bool(self._handed)) and self._pump()
                if queue and queue[0].state in _MAY_RUN:
                    progressed = self._run_next() or progressed
                else:
                    self.stall_deadline = 0.0  # (what _run_next does with nothing ready first in line)
                if self.unparsed.data:
                    progressed = self._feed() or progressed
                if not (progressed or self._again):
                    break
        finally:
            self._advancing = False
        if self._eof and not self.closed and not self.unparsed.data and all(ex.state == RECEIVING for ex in self.queue):
            self.close()  # nothing more will come, and nothing is owed: a request begun will not end
            return
        if not self.queue and not self._in_head and self.receiving is None and not self.closed:
            self.idle_deadline = self.front.clock.monotonic() + limits.KEEPALIVE_TIMEOUT_S

    def _run_next(self) -> bool:
        """Start the first request not answered yet, if it is ready, nothing else runs and the
        answers not yet sent leave room (else the connection waits, under its stall deadline)."""
        for ex in self.queue:
            if ex.state == ANSWERED:
                continue
            if ex.state == READY:
                if not self.front.may_run(self):
                    if not self.stall_deadline:
                        self.stall_deadline = self.front.now + limits.CONNECTION_STALL_TIMEOUT_S
                    return False
                self.stall_deadline = 0.0
                ex.state = RUNNING
                handling.run(ex, self._answer, self.front)
                return True
            break
        self.stall_deadline = 0.0  # nothing waits for the answer bounds
        return False

    def _answer(self, ex: Exchange, resp: Response) -> None:
        """``ex`` has its answer: count it, give its body's bytes back, and write what is due."""
        if ex.state == ANSWERED:  # an early answer already stands; a later one is not sent
            resp.release()
            return
        running, ex.state, ex.response = ex.state == RUNNING, ANSWERED, resp
        if ex.cell is not None:
            ex.cell[0] = None  # tasks the request started act as the broker from now on
        metrics, now = self.app.metrics, self.front.clock.monotonic()
        if metrics is not None and ex.req.method:
            metrics.observe(ex.req, resp, now - ex.started)
        self.app.admission.answered(ex.req, resp, now, running)  # (its running count, its quota's bytes)
        if self.front.access_log:
            req = ex.req
            access_log.info('%s "%s %s HTTP/1.1" %d %d', req.remote, req.method, req.path_qs, resp.status,
                            len(resp.body))
        if ex.incoming is not None and ex is not self.receiving:
            ex.incoming.release()
            ex.incoming = None
        ex.req.body = b""
        if self.closed:
            resp.release()
            return
        ex.cost = len(resp.body) + ANSWER_HEAD_BYTES
        self.answer_bytes += ex.cost
        self.front.answer_bytes += ex.cost
        if not ex.keep_alive:
            self.close_when_sent = True
        self.advance()

    # --- writing ---------------------------------------------------------------------------

    def _pump(self) -> bool:
        """Write the answers that are due, in request order, as far as the transport takes them;
        True when one was handed over whole."""
        queue = self.queue
        progressed = False
        while queue and not self.paused and not self.closed:
            ex = queue[0]
            if ex.state != ANSWERED:
                if ex.expect_continue and ex is self.receiving:
                    ex.expect_continue = False
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                break
            if not self.out.write(ex):
                break
            queue.popleft()
            progressed = True
            self._handed += ex.cost
            if not ex.keep_alive or (self.close_when_sent and not queue):
                self.close_when_sent = True
                if ex is self.receiving and ex.linger:
                    break  # its body is still coming: closing now could reset the answer away
                self.close()
                return True
        if self._handed and not self.closed:
            self._sent()
        return progressed

    def _sent(self) -> bool:
        """Whether the answers handed to the transport have all left its buffer (then they no
        longer count against the answer bounds)."""
        if self.transport.get_write_buffer_size():
            return False
        self.answer_bytes -= self._handed
        self.front.release(self._handed, self)
        self._handed = 0
        return True

    def written_through(self, seq: int) -> bool:
        """Whether the answer to this connection's request ``seq`` (and every one before) has left
        this process whole (``Sending.written_through``)."""
        return self.out.written_through(seq)
