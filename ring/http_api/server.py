"""Serving the apps on their sockets: the client API on ring's own front, the peer API on aiohttp.

``Server`` listens for the client API (``web.App``) with the HTTP/1.1 front
of ``front.py``: the header, body and send deadlines, the connection bound,
the TLS handshake deadline and the body budget are all the front's, checked
by one periodic sweep. ``PeerServer`` serves the peer API (gossip,
replication websockets, forwarded produces) on aiohttp, with the connection
limits aiohttp lacks, below.

aiohttp has no deadline for receiving request headers, so a client sending
one byte a second holds a connection forever (slowloris). ``GuardedHandler``
adds one: from the first byte of a request (or from the connection's start)
the headers must be complete within ``HEADER_READ_TIMEOUT_S``, else the
connection is closed. It also answers the errors aiohttp detects before any
handler runs (bad request line, over-long header) in the API's JSON shape.

A byte counts as the start of a new request when the previous request's body
was fully received before that byte arrived; body bytes never arm the timer,
nor do the frames of a connection upgraded to a websocket.

Three more bounds hold a hostile or broken client in check: at most
``connections_max`` connections are open at once (the next one gets a 503
with ``Retry-After`` and is closed before its request is read); an answer
the client does not take within ``RESPONSE_SEND_TIMEOUT_S`` (a fetcher that
never reads) gets its connection aborted, dropping the buffered bytes; and
with TLS the handshake must end within ``TLS_HANDSHAKE_TIMEOUT_S``. Request
bodies have their own deadline (``BODY_READ_TIMEOUT_S``, in ``codec``). A body
aiohttp cannot read (a malformed gzip stream) costs one log line, not a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from email.utils import formatdate
from typing import Any, KeysView

import orjson

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from ring import limits
from ring.http_api.middleware import http_error_response

log = logging.getLogger("ring.http")


class GuardedHandler(RequestHandler):
    """aiohttp's connection handler plus a header deadline and JSON protocol errors."""

    def __init__(self, *args: Any, header_timeout_s: float = limits.HEADER_READ_TIMEOUT_S,
                 connections_max: int = limits.CLIENT_CONNECTIONS_OPEN_MAX,
                 send_timeout_s: float = limits.RESPONSE_SEND_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._connections_max = connections_max
        self._send_timeout_s = send_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._last_payload: Any = None  # body stream of the newest parsed request
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        if manager is not None and len(manager.connections) >= self._connections_max:
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._arm()

    def _refuse(self, transport: asyncio.BaseTransport) -> None:
        """Over the connection bound: a 503 the client can read, then close; the request is never read."""
        self._refused = True
        log.warning("refusing a connection: %d are open (the bound)", self._connections_max)
        body = orjson.dumps({"error": "unavailable", "message": f"{self._connections_max} connections are open "
                                                                "on this broker; retry later"})
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(head + body)
        transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._disarm()
        super().connection_lost(exc)

    async def finish_response(self, request: Any, resp: Any, start_time: float | None) -> tuple[Any, bool]:
        # A plain timer, not asyncio.timeout: the send it guards almost never waits, and
        # aborting the transport fails the wait for the drain (aiohttp then answers "reset").
        timer = self._loop.call_later(self._send_timeout_s, self._send_timed_out)
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            timer.cancel()

    def _send_timed_out(self) -> None:
        log.info("aborting a connection whose client did not take its answer within %g s", self._send_timeout_s)
        if self.transport is not None:
            self.transport.abort()  # close() would wait for the unread bytes to drain: forever
        self.force_close()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not data:
            return super().data_received(data)
        if self._upgraded or self._payload_parser is not None:
            # A websocket (the peer port's replication link): frames, not requests, from here on.
            self._disarm()
            return super().data_received(data)
        body_done = self._last_payload is None or self._last_payload.is_eof()
        parsed_before = self._request_count
        super().data_received(data)
        if self._request_count != parsed_before:
            self._disarm()  # headers complete
            if self._messages:
                self._last_payload = self._messages[-1][1]
        elif body_done and self._header_timer is None:
            self._arm()  # these bytes began a new request whose headers are not complete

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self._loop.call_later(self._header_timeout_s, self._header_timeout, self._request_count)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self, parsed_at_arm: int) -> None:
        self._header_timer = None
        if self._request_count == parsed_at_arm and self.transport is not None:
            log.info("closing a connection that sent no complete request headers within %g s",
                     self._header_timeout_s)
            self.force_close()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # A body aiohttp could not read (a malformed gzip stream, a broken chunk): the handler
        # answered 400 already, and aiohttp, draining the rest, would log a traceback for each.
        exc = kw.get("exc_info")
        if isinstance(exc, (RequestPayloadError, HttpProcessingError)):
            log.info("a request body could not be read (answered 400): %s", " ".join(str(exc).split()))
            return
        super().log_exception(*args, **kw)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        if status >= 500:
            log.error("error handling a request", exc_info=exc)
            message = "internal error; the broker log has the details"
        else:
            log.debug("protocol error %d: %s", status, message)
        resp = http_error_response(status, message)
        resp.force_close()
        return resp


class Front:
    """What the connections of one listening socket share: the app, the bounds, the clock of the sweep."""

    def __init__(self, app: Any, header_timeout_s: float, send_timeout_s: float, connections_max: int,
                 access_log: bool = False) -> None:
        self.app = app
        self.access_log = access_log  # one line per answer, at INFO on "ring.access"
        self.loop = asyncio.get_running_loop()
        self.clock = app.clock
        self.header_timeout_s = header_timeout_s
        self.send_timeout_s = send_timeout_s
        self.connections_max = connections_max
        # Dicts, not sets, of connections: visited in the order they came, not in an order that hangs on where
        # the objects sit in memory, so a simulated run replays exactly.
        self.connections: dict[Connection, None] = {}
        self.tasks: set[asyncio.Task] = set()  # handlers that are coroutines, while they run
        # Bytes of answers built and not yet sent, all connections together, and the connections
        # waiting for them to fall under FRONT_ANSWER_BYTES_IN_FLIGHT_MAX to run their next request.
        self.answer_bytes = 0
        self.stalled: dict[Connection, None] = {}  # (woken in the order they stalled)
        self._waking = False
        self.closing = False
        self.next_id = 0
        self.now = self.clock.monotonic()
        self._second = -1
        self.date = b""
        self._tick_date()
        self.sweep_interval_s = min(1.0, max(0.05, min(header_timeout_s, send_timeout_s,
                                                      limits.KEEPALIVE_TIMEOUT_S) / 4))
        # The sweep's timer also measures how late the loop runs (the admission's loop lag), more often
        # than the connections need visiting: those are visited once per sweep_interval_s.
        self.probe_interval_s = min(self.sweep_interval_s, limits.LOOP_LAG_PROBE_INTERVAL_S)
        self._visit_at = self.now + self.sweep_interval_s
        self._sweeper: asyncio.TimerHandle | None = None
        self._arm(self.now)

    def _tick_date(self) -> None:
        second = self.clock.wall_ms() // 1000
        if second != self._second:
            self._second = second
            self.date = f"Date: {formatdate(second, usegmt=True)}\r\n".encode()

    def _arm(self, now: float) -> None:
        due = now + self.probe_interval_s
        self._sweeper = self.loop.call_later(due - self.clock.monotonic(), self.sweep, due)

    def sweep(self, due: float | None = None) -> None:
        """Run by its timer (``due``: when it was due) every probe interval: how late the loop ran it,
        and once per sweep interval (or whenever called out of turn) the deadlines of every
        connection, the Date header, written answers."""
        self.now = now = self.clock.monotonic()
        self._tick_date()
        if due is not None:
            self.app.admission.lagged(max(0.0, now - due))
        if due is None or now >= self._visit_at:
            self._visit_at = now + self.sweep_interval_s
            if self.stalled:
                self._wake()
            for conn in list(self.connections):
                conn.check(now)
        if self._sweeper is not None:
            self._sweeper.cancel()  # (a sweep run out of turn keeps one timer, not two)
            self._sweeper = None
        if not self._stopped():
            self._arm(now)

    def may_run(self, conn: Connection) -> bool:
        """Whether ``conn`` may run its next request: its transport takes writes, and its answers
        not yet sent are under CONNECTION_ANSWER_BYTES_MAX; over FRONT_ANSWER_BYTES_IN_FLIGHT_MAX,
        only if it holds none (a client that reads runs on, adding one answer at most)."""
        if conn.paused or conn.answer_bytes >= limits.CONNECTION_ANSWER_BYTES_MAX:
            return False  # its own writes wake it (resume_writing, the sweep)
        if conn.answer_bytes and self.answer_bytes >= limits.FRONT_ANSWER_BYTES_IN_FLIGHT_MAX:
            self.stalled[conn] = None  # woken when the answers of others are sent
            return False
        return True

    def release(self, size: int, conn: Connection) -> None:
        """``conn``'s answers of ``size`` bytes are sent (or dropped): waiting connections may run."""
        self.answer_bytes -= size
        self.stalled.pop(conn, None)
        if self.stalled and not self._waking and self.answer_bytes < limits.FRONT_ANSWER_BYTES_IN_FLIGHT_MAX:
            self._waking = True
            self.loop.call_soon(self._wake)  # not from inside the connection that released

    def _wake(self) -> None:
        self._waking = False
        while self.stalled and self.answer_bytes < limits.FRONT_ANSWER_BYTES_IN_FLIGHT_MAX:
            conn = next(iter(self.stalled))
            del self.stalled[conn]
            conn.advance()

    def _stopped(self) -> bool:
        return self.closing and not self.connections

    def stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def protocol(self) -> Any:
        from ring.http_api.front import Connection

        return Connection(self)


class _Listening:
    """An app, the address it listens on (``port`` becomes the bound one once started) and its bounds."""

    def __init__(self, app: Any, host: str, port: int, header_timeout_s: float = limits.HEADER_READ_TIMEOUT_S,
                 access_log: bool = False, ssl_context: ssl.SSLContext | None = None,
                 connections_max: int = limits.CLIENT_CONNECTIONS_OPEN_MAX,
                 send_timeout_s: float = limits.RESPONSE_SEND_TIMEOUT_S) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._header_timeout_s = header_timeout_s
        self._access_log = access_log
        self.ssl_context = ssl_context
        self._connections_max = connections_max
        self._send_timeout_s = send_timeout_s
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.ssl_context is not None else 'http'}://{host}:{self.port}"

    def _tls(self) -> dict[str, Any]:
        if self.ssl_context is None:
            return {}
        return {"ssl": self.ssl_context, "ssl_handshake_timeout": limits.TLS_HANDSHAKE_TIMEOUT_S}


class PeerServer(_Listening):
    """The peer app on one listening socket: ``start`` returns once it accepts, ``stop`` drains."""

    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        kwargs: dict[str, Any] = dict(
            keepalive_timeout=limits.KEEPALIVE_TIMEOUT_S,
            max_line_size=limits.HEADER_LINE_BYTES_MAX,
            max_field_size=limits.HEADER_LINE_BYTES_MAX,
        )
        if not self._access_log:
            kwargs["access_log"] = None
        self._runner = web.AppRunner(self.app, shutdown_timeout=limits.SHUTDOWN_GRACE_S, **kwargs)
        await self._runner.setup()
        manager = self._runner.server
        assert manager is not None
        loop = asyncio.get_running_loop()
        handler_kwargs = {**kwargs, "header_timeout_s": self._header_timeout_s,
                          "connections_max": self._connections_max, "send_timeout_s": self._send_timeout_s}

        def factory() -> GuardedHandler:
            return GuardedHandler(manager, loop=loop, **handler_kwargs)

        self._server = await loop.create_server(factory, self.host, self.port, reuse_address=True,
                                                family=socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                                                **self._tls())
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to the grace), close connections."""
        if self._server is not None:
            self._server.close()  # no new connections; open ones drain below
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class Server(_Listening):
    """The client API on one listening socket, served by the front: ``start`` returns once it
    accepts, ``stop`` lets requests in flight finish (up to SHUTDOWN_GRACE_S) and closes.

    ``shared_port``: a second port the same front accepts on with SO_REUSEPORT, which every member of
    one host listens on too (``ring serve --members``): the kernel spreads the connections over them
    and each forwards what it does not lead."""

    front: Any = None
    shared_port: int | None = None
    _shared: asyncio.base_events.Server | None = None

    @property
    def connections(self) -> KeysView:
        return {}.keys() if self.front is None else self.front.connections.keys()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.front = Front(self.app, self._header_timeout_s, self._send_timeout_s, self._connections_max,
                           self._access_log)
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            self._server = await loop.create_server(self.front.protocol, self.host, self.port, reuse_address=True,
                                                    family=family, **self._tls())
            if self.shared_port is not None:
                self._shared = await loop.create_server(self.front.protocol, self.host, self.shared_port,
                                                        reuse_address=True, reuse_port=True, family=family,
                                                        **self._tls())
        except BaseException:
            if self._server is not None:
                self._server.close()
                self._server = None
            self.front.stop_sweeping()
            self.front = None
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        await self.app.startup()

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to the grace), close every connection."""
        if self._server is not None:
            self._server.close()  # no new connections; open ones drain below
            self._server = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        front = self.front
        if front is not None:
            front.closing = True
            for conn in list(front.connections):
                conn.close_when_sent = True  # each closes once it has answered what it took in
                if not conn.queue and conn.receiving is None:
                    conn.close()  # idle: nothing to finish
            deadline = front.clock.monotonic() + limits.SHUTDOWN_GRACE_S
            while front.connections and front.clock.monotonic() < deadline:
                await front.clock.sleep(0.05)
            for conn in list(front.connections):
                conn.transport.abort()
                conn.connection_lost(None)
            front.stop_sweeping()
            for task in list(front.tasks):
                task.cancel()
            await asyncio.gather(*front.tasks, return_exceptions=True)
            self.front = None
            await self.app.cleanup()
