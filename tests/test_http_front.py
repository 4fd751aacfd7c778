"""What the client port's front tells a handler about its connection: a stable identity, and when an
answer has left this process whole (``Response.on_written``, ``Connection.written_through``), never
for an answer its connection lost. Driven with a transport whose buffer the test controls."""

from __future__ import annotations

from typing import Any

from ring.clock import ManualClock
from ring.http_api import web
from ring.http_api.server import Front


class Transport:
    def __init__(self) -> None:
        self.out = b""
        self.buffered = 0  # what the kernel has not taken yet

    def write(self, data: bytes) -> None:
        self.out += data

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def test_an_answer_is_reported_written_once_it_left_the_transport_and_never_if_the_connection_went() -> None:
    written: list[tuple[int, int]] = []

    def handler(request: web.Request) -> web.Response:
        resp = web.json({"seq": request.seq})
        resp.on_written = lambda: written.append((request.conn.id, request.seq))
        return resp

    app = web.App()
    app.router.add("GET", "/poll", handler)
    front = Front(app, 10.0, 10.0, 10)
    try:
        conn, transport = front.protocol(), Transport()
        conn.connection_made(transport)
        other = front.protocol()
        other.connection_made(Transport())
        assert conn.id != other.id
        conn.data_received(b"GET /poll HTTP/1.1\r\nHost: x\r\n\r\n")
        assert written == [(conn.id, 0)] and conn.written_through(0)

        transport.buffered = 100  # the next answer is handed over but not yet taken by the kernel
        conn.data_received(b"GET /poll HTTP/1.1\r\nHost: x\r\n\r\n")
        assert transport.out.count(b"HTTP/1.1 200") == 2
        assert written == [(conn.id, 0)] and not conn.written_through(1)
        transport.buffered = 0
        front.sweep()  # (or resume_writing, or the next bytes from the client)
        assert written == [(conn.id, 0), (conn.id, 1)] and conn.written_through(1)

        transport.buffered = 100
        conn.data_received(b"GET /poll HTTP/1.1\r\nHost: x\r\n\r\n")
        conn.connection_lost(ConnectionResetError())
        transport.buffered = 0
        front.sweep()
        assert written == [(conn.id, 0), (conn.id, 1)]  # the third never left whole
    finally:
        front.stop_sweeping()


async def test_the_sweep_ends_connections_past_their_deadline_in_the_order_they_came() -> None:
    """The sweep visits the connections in the order they were made, not in an order that follows where the
    objects sit in memory, so a simulated run (``tests.sim``) replays the same whatever else the process
    allocated."""
    closed: list[int] = []

    class Closing(Transport):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n = n

        def close(self) -> None:
            closed.append(self.n)

    app = web.App()
    app.clock = clock = ManualClock()
    front = Front(app, 1.0, 10.0, 100)
    try:
        for n in range(60):  # (enough that a set of them would not come back in the order they went in)
            front.protocol().connection_made(Closing(n))
        clock.advance(2.0)  # past every connection's deadline for its first request
        front.sweep()
        assert closed == list(range(60))
    finally:
        front.stop_sweeping()
