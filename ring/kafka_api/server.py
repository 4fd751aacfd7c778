"""The Kafka protocol listener (``ring serve --kafka-listen``): one ``asyncio.Protocol`` per connection.

Theory of operation.

* Framing. A request is a 4-byte big-endian size and that many bytes. A size
  below a header's or above ``KAFKA_REQUEST_BYTES_MAX`` closes the connection
  at once, before a byte of the frame is held, and so does a frame whose
  header does not parse or that names an API or version not served (as Kafka
  does; ApiVersions alone answers an unknown version, with UNSUPPORTED_VERSION
  in a v0 body, so the client retries lower). What the handlers of ``apis``
  find wrong inside a request is answered with Kafka's error codes.
* Order. Kafka requires the answers of one connection in the order of its
  requests, though a later one (a produce answered at once) may be ready before
  an earlier one (a fetch long-polling). Each request takes a slot in the
  connection's queue; answers leave from its head as they become ready. A
  produce with acks=0 takes a slot too, whose answer is nothing (as Kafka's).
* Bounds. At ``KAFKA_REQUESTS_IN_FLIGHT_MAX`` requests taken in and not
  answered, or while the transport asks to stop writing, the connection stops
  reading; what is buffered then is at most one frame and one read. The bytes
  buffered are counted in the broker's request body budget
  (``REQUEST_BODY_BYTES_IN_FLIGHT_MAX``, shared with the HTTP front) as they
  arrive: a connection whose next bytes do not fit is closed, so many clients
  each trickling a large frame cannot hold more than the budget. A frame
  begun must be whole within ``BODY_READ_TIMEOUT_S`` while the connection
  reads, else the connection is closed (slowloris). An idle connection stays:
  Kafka clients keep theirs for the client's life. The listener holds at
  most ``CLIENT_CONNECTIONS_OPEN_MAX`` connections.
* Who. With the broker's client tokens (``--auth-tokens``) a connection
  authenticates first with SASL PLAIN (``sasl.py``); until it has, it may
  send only ApiVersions, SaslHandshake and SaslAuthenticate, and anything
  else closes it. Each request it sends afterwards is served for its
  principal (``auth.CURRENT``, as the HTTP front sets it), whose grants the
  handlers check (``access.py``); after the tokens file is read again, for
  the principal the file now gives its token (none: the connection is
  closed). With ``--tls-cert`` the listener speaks TLS with the client
  port's certificate.
* Quotas. A token's quotas (``ring.quotas``, the same buckets as the HTTP
  port's) bound its Produce and Fetch requests: a produce's frame and a
  fetch's answer are charged as bytes, each of them as a request. A frame
  over the quota is not taken until its wait has passed, and the connection
  is not read meanwhile, as Kafka mutes a throttled client's channel.
* Load. The client port's admission (``ring.http_api.admission``, one per
  broker) holds the Kafka listener too: while it would refuse new work (the
  event loop behind, or ``REQUESTS_RUNNING_MAX`` requests running), a Produce
  or Fetch frame is not taken and its connection not read, looked at again
  every ``KAFKA_ADMISSION_RECHECK_MS``, as Kafka's network threads stop
  reading when its request queue is full (Kafka has no error that tells a
  producer to come back later). Each frame held counts as one refusal in the
  admission's figures. A Produce taken counts as running until it is
  answered (or its connection closes), so produces through either port
  count toward one bound; a Fetch mostly waits for data, as the long-polls
  the bound leaves out do, and is not counted.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import deque
from typing import Any

from ring import auth, limits, quotas
from ring.errors import Overloaded, RingError
from ring.http_api.admission import Admission, admission_of
from ring.http_api.budget import body_budget_of
from ring.kafka_api import apis, sasl
from ring.kafka_api.wire import Malformed, Quiet, Reader, RequestHeader, read_header

log = logging.getLogger("ring.kafka")

_SIZE = struct.Struct(">i")
_HEADER_BYTES_MIN = 10  # api_key, api_version, correlation_id and a null client_id


_API_KEY = struct.Struct(">h")  # a request header's first field, after the frame's size
# The data plane: the requests a token's quotas and the broker's load bounds hold (each its quota's kind)
_PLANES = {apis.PRODUCE: quotas.PRODUCE, apis.FETCH: quotas.FETCH}


class _Slot:
    __slots__ = ("answer", "quiet", "charged", "running")

    def __init__(self, quiet: bool, charged: bool, running: bool) -> None:
        self.answer: bytes | None = None
        self.quiet = quiet  # answered with nothing (acks=0)
        self.charged = charged  # a fetch of a principal with a quota: its answer's bytes are charged
        self.running = running  # a produce counted as running by the admission until it is answered


class KafkaConnection(asyncio.Protocol):
    def __init__(self, listener: KafkaListener) -> None:
        self.listener = listener
        self.transport: Any = None
        self.buf = bytearray()
        self.slots: deque[_Slot] = deque()
        self.tasks: set[asyncio.Task] = set()
        self.closed = False
        self.write_paused = False
        self.read_paused = False
        self.hold = body_budget_of(listener.broker).hold()  # counts what ``buf`` holds
        self.frame_timer: asyncio.TimerHandle | None = None  # armed while a frame begun is not whole
        self.client_host = ""  # the peer's address, as Kafka's DescribeGroups shows a member's host
        # Who the requests are served for: None while a listener with tokens has not authenticated this
        # connection (or when it has none: every request is let in, nothing is set).
        self.principal: auth.Principal | None = None
        self.token_digest = b""  # of the token it authenticated with
        self.tokens_seen: list | None = None  # the tokens file's entries when ``principal`` was read from them
        self.mechanism: str | None = None  # the SASL mechanism a handshake chose
        self.quota_timer: asyncio.TimerHandle | None = None  # armed while a frame waits out its quota
        self.load_timer: asyncio.TimerHandle | None = None  # armed while a frame waits for the broker's load
        self.load_held = False  # the frame at the head was held for the load (and counted so)
        self.refused = False  # authentication failed: answer what was taken, then close

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if len(self.listener.connections) >= limits.CLIENT_CONNECTIONS_OPEN_MAX:
            log.warning("refusing a Kafka connection: %d are open (the bound)", limits.CLIENT_CONNECTIONS_OPEN_MAX)
            self.closed = True
            transport.close()
            return
        self.listener.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.client_host = f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        for timer in (self.quota_timer, self.load_timer):
            if timer is not None:
                timer.cancel()
        for slot in self.slots:  # what it had running is over
            if slot.running:
                slot.running = False
                self.listener.admission.finished()
        self.buf.clear()
        self.hold.release()
        self._time_frame()
        self.listener.connections.discard(self)
        for task in self.tasks:
            task.cancel()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._flow()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._flow()
        self._frames()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self.hold.charge(len(data))
        except Overloaded as exc:
            self.abort(exc.message)
            return
        self.buf += data
        self._frames()

    def _frames(self) -> None:
        """Take every whole frame buffered while there is room for its answer."""
        buf = self.buf
        while not self.closed and not self.refused and len(buf) >= 4 and not self._full():
            (size,) = _SIZE.unpack_from(buf)
            if not _HEADER_BYTES_MIN <= size <= limits.KAFKA_REQUEST_BYTES_MAX:
                self.abort(f"a frame of {size} bytes (at most {limits.KAFKA_REQUEST_BYTES_MAX})")
                return
            if len(buf) < 4 + size:
                break
            plane = _PLANES.get(_API_KEY.unpack_from(buf, 4)[0])
            if plane is not None and (self._over_load() or self.principal is not None
                                      and self._over_quota(plane, size)):
                break
            frame = bytes(buf[4:4 + size])
            del buf[:4 + size]
            self._request(frame)
        if self.hold.held > len(buf):  # what was taken out is given back (a smaller charge always fits)
            self.hold.release()
            self.hold.charge(len(buf))
        self._flow()
        self._time_frame()

    def _time_frame(self) -> None:
        """Arm the frame deadline when a frame has begun and the connection reads; else disarm it."""
        partial = bool(self.buf) and not self.read_paused and not self.closed
        if partial and self.frame_timer is None:
            self.frame_timer = asyncio.get_running_loop().call_later(limits.BODY_READ_TIMEOUT_S, self._frame_late)
        elif not partial and self.frame_timer is not None:
            self.frame_timer.cancel()
            self.frame_timer = None

    def _frame_late(self) -> None:
        self.frame_timer = None
        if self.buf and not self.read_paused and not self.closed:
            self.abort(f"a frame not whole within {limits.BODY_READ_TIMEOUT_S} s")

    def _full(self) -> bool:
        return (self.write_paused or len(self.slots) >= limits.KAFKA_REQUESTS_IN_FLIGHT_MAX
                or self.quota_timer is not None or self.load_timer is not None)

    def _current(self) -> auth.Principal | None:
        """The principal, read again from the tokens file when it was read again since (SIGHUP); None
        once its token is gone from it."""
        tokens = self.listener.tokens
        if tokens is not None and self.principal is not None and tokens.entries is not self.tokens_seen:
            self.principal, self.tokens_seen = tokens.by_digest(self.token_digest), tokens.entries
        return self.principal

    def _over_quota(self, kind: str, size: int) -> bool:
        """Whether the whole frame at the head of the buffer, a Produce or Fetch (``kind``) of ``size``
        bytes, must wait out its principal's quota: the connection is not read until then. Else its
        request is counted, and a produce's bytes charged."""
        principal = self._current()
        quota = principal.quota if principal is not None else None
        if quota is None:
            return False
        throttle, now = self.listener.throttle, self.listener.broker.clock.monotonic()
        wait_s = throttle.admit(now, principal.name, quota, kind)
        if wait_s:
            self.quota_timer = asyncio.get_running_loop().call_later(wait_s, self._quota_waited)
            return True
        if kind == quotas.PRODUCE:
            throttle.charge(now, principal.name, quota, kind, size)
        return False

    def _quota_waited(self) -> None:
        self.quota_timer = None
        self._frames()

    def _over_load(self) -> bool:
        """Whether the whole frame at the head of the buffer, a Produce or Fetch, must wait for the broker's
        load to fall below the admission's bounds: the connection is not read until then."""
        if self.listener.admission.overloaded(count=not self.load_held) is None:
            self.load_held = False
            return False
        self.load_held = True  # (counted as one refusal, however often it is looked at again)
        self.load_timer = asyncio.get_running_loop().call_later(limits.KAFKA_ADMISSION_RECHECK_MS / 1000,
                                                                self._load_waited)
        return True

    def _load_waited(self) -> None:
        self.load_timer = None
        self._frames()

    def _flow(self) -> None:
        """Read while there is room for another request; a whole frame waiting stops reading too."""
        if self.closed:
            return
        stop = self._full() or (len(self.buf) >= 4 and len(self.buf) >= 4 + _SIZE.unpack_from(self.buf)[0])
        if stop and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        elif not stop and self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def _request(self, frame: bytes) -> None:
        r = Reader(frame)
        cell: list[auth.Principal | None] | None = None
        reset = None
        try:
            header = read_header(r, apis.flexible)._replace(client_host=self.client_host)
            if header.api_key in sasl.KEYS or (self.principal is None and self.listener.tokens is not None):
                answer = self._authentication(header, r)
            else:
                if self.principal is not None:  # served for the principal, as are the tasks it starts
                    if self._current() is None:
                        raise apis.NotServed("its token was taken out of the tokens file")
                    cell = [self.principal]
                    reset = auth.CURRENT.set(cell)
                answer = apis.handle(self.listener.broker, header, r, self.listener.groups)
        except Malformed as exc:
            self.abort(f"a malformed request: {exc.message}")
            return self._served(reset, cell)
        except RingError as exc:  # an API or version not served, or a request no answer can be built for
            self.abort(exc.message)
            return self._served(reset, cell)
        except Exception:
            log.exception("a Kafka request failed")
            self.abort("a request failed")
            return self._served(reset, cell)
        quiet = isinstance(answer, Quiet)
        if quiet:
            answer = answer.work
        charged = (header.api_key == apis.FETCH and self.principal is not None
                   and self.principal.quota is not None)
        slot = _Slot(quiet, charged, header.api_key == apis.PRODUCE)
        if slot.running:
            self.listener.admission.started()
        self.slots.append(slot)
        head = _SIZE.pack(header.correlation_id)  # response header v0 ...
        if header.api_key != apis.API_VERSIONS and apis.flexible(header.api_key, header.api_version):
            head += b"\x00"  # ... or v1 (its tagged fields, none) for a flexible version but ApiVersions
        if isinstance(answer, (bytes, bytearray)):
            self._served(reset, cell)
            self._answered(slot, head, answer)
            return
        task = asyncio.ensure_future(answer)  # (it copies the context: the principal goes with it)
        self._served(reset, None)
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._settled(t, slot, head, cell))

    @staticmethod
    def _served(reset: Any, cell: list[auth.Principal | None] | None) -> None:
        """The request is handed on: the context is this connection's again; with ``cell``, the request is
        over too, and what it started acts as the broker from now on."""
        if reset is not None:
            auth.CURRENT.reset(reset)
        if cell is not None:
            cell[0] = None

    def _authentication(self, header: RequestHeader, r: Reader) -> bytes:
        """ApiVersions, SaslHandshake or SaslAuthenticate, which a connection may send before it has
        authenticated (anything else then closes it); the SASL APIs after it, answered in that state."""
        key, version = header.api_key, header.api_version
        if key == apis.API_VERSIONS:
            return apis.handle(self.listener.broker, header, r, self.listener.groups)
        if key not in sasl.KEYS:
            raise apis.NotServed(f"API key {key} before the connection authenticated with SASL")
        apis.check_served(header)
        tokens = self.listener.tokens
        if key == sasl.SASL_HANDSHAKE:
            mechanism = sasl.read_handshake(r)
            if tokens is None:
                return sasl.handshake_body(sasl.UNSUPPORTED_SASL_MECHANISM, False)
            if self.principal is not None or self.mechanism is not None:
                return sasl.handshake_body(sasl.ILLEGAL_SASL_STATE, True)
            if mechanism != sasl.PLAIN:
                return sasl.handshake_body(sasl.UNSUPPORTED_SASL_MECHANISM, True)
            self.mechanism = mechanism
            return sasl.handshake_body(0, True)
        message = sasl.read_authenticate(version, r)
        if tokens is None or self.principal is not None or self.mechanism is None:
            return sasl.authenticate_body(version, sasl.ILLEGAL_SASL_STATE,
                                          "SaslAuthenticate needs a SaslHandshake first, once a connection")
        found = sasl.plain(tokens, message)
        if found is not None:
            (self.principal, self.token_digest), self.tokens_seen = found, tokens.entries
        if self.principal is None:
            log.info("a Kafka connection from %s failed to authenticate", self.client_host or "?")
            self.refused = True
            return sasl.authenticate_body(version, sasl.SASL_AUTHENTICATION_FAILED, sasl.FAILED)
        return sasl.authenticate_body(version, 0, None)

    def _settled(self, task: asyncio.Task, slot: _Slot, head: bytes, cell: list | None) -> None:
        self.tasks.discard(task)
        if cell is not None:
            cell[0] = None  # what the request started acts as the broker from now on
        if task.cancelled() or self.closed:
            return
        exc = task.exception()
        if exc is not None:
            if isinstance(exc, RingError):
                self.abort(f"a request failed: {exc.message}")
            else:
                log.error("a Kafka request failed", exc_info=exc)
                self.abort("a request failed")
            return
        self._answered(slot, head, task.result())

    def _answered(self, slot: _Slot, head: bytes, body: bytes | bytearray) -> None:
        slot.answer = b"" if slot.quiet else _SIZE.pack(len(head) + len(body)) + head + body
        if slot.running:
            slot.running = False
            self.listener.admission.finished()
        principal = self.principal
        if slot.charged and principal is not None and principal.quota is not None:
            self.listener.throttle.charge(self.listener.broker.clock.monotonic(), principal.name, principal.quota,
                                          quotas.FETCH, len(body))
        while self.slots and self.slots[0].answer is not None and not self.closed:
            data = self.slots.popleft().answer
            if data:
                self.transport.write(data)
        if self.refused and not self.slots and not self.closed:  # its failure answered: closed, as Kafka does
            self.closed = True
            self.transport.close()
            return
        self._frames()

    def abort(self, why: str) -> None:
        """The client's fault: close at once, dropping what it sent and what was not answered."""
        log.info("closing a Kafka connection from %s: %s", self.transport.get_extra_info("peername"), why)
        self.closed = True
        self.buf.clear()
        self.hold.release()
        self._time_frame()
        self.transport.abort()


class KafkaListener:
    """The Kafka listener of one broker: ``start`` returns once it accepts, ``stop`` closes every connection."""

    def __init__(self, broker: Any, host: str, port: int, groups: Any = None, tokens: auth.TokenTable | None = None,
                 ssl_context: Any = None, admission: Admission | None = None) -> None:
        self.broker = broker
        self.groups = groups  # the broker's ring.groups.service.Groups: the group APIs are served by it
        self.tokens = tokens  # the client port's tokens (reloaded in place): SASL PLAIN required with them
        self.ssl_context = ssl_context  # TLS, with the client port's certificate
        # The client port's: one set of load bounds and one quota budget per token for both ports
        self.admission = admission if admission is not None else admission_of(broker)
        self.throttle = self.admission.throttle
        self.host = host
        self.port = port
        self.connections: set[KafkaConnection] = set()
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"kafka://{self.host}:{self.port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._server = await loop.create_server(lambda: KafkaConnection(self), self.host, self.port,
                                                reuse_address=True, family=family, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.connections):
            conn.closed = True
            conn.transport.abort()
            conn.connection_lost(None)
