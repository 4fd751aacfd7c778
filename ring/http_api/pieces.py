"""What a client connection has read and not parsed yet, handed to the parser in pieces that cannot
complete more requests than the pipeline has room for (``Unparsed``).

httptools parses a whole buffer at once, with no way to stop after a request
and say where it stopped: fed a read of thousands of pipelined requests, it
completes them all. So the front (``front.Connection``) feeds it pieces of at
most REQUEST_BYTES_MIN bytes (the shortest request the parser completes) per
request the pipeline has room for, past what is left of the body being
received. A Content-Length body's rest is known. A chunked body can end only
at a line starting "0" (its last chunk), so it is fed whole up to the next
"\\n0"; past one, in small pieces, until a piece with no "\\n0" in it gives
body bytes (the "0" was data: the body goes on) or the body ends. When there
is no room the rest waits here (never more than one read of the transport,
CONNECTION_UNPARSED_BYTES_MAX) and the front stops reading. No sockets, no
clock: bytes in, pieces out.
"""

from __future__ import annotations

from ring import limits


class Unparsed:
    __slots__ = ("data", "pos", "body_left", "chunked", "whole", "took_body", "last_nl0", "last_nl")

    def __init__(self) -> None:
        self.data = b""  # what was read and not fed yet, from ``pos`` (empty: nothing waits)
        self.pos = 0
        self.body_left = 0  # bytes still to come of the Content-Length body being received
        self.chunked = False  # the body being received is chunked
        self.whole = False  # ... and cannot have ended: fed whole up to its next "\n0"
        self.took_body = False  # the parser gave body bytes since the last piece was cut
        self.last_nl0 = False  # the last piece held a "\n0" (its "0" in it)
        self.last_nl = False  # the last piece ended with "\n"

    def add(self, data: bytes) -> None:
        self.data = self.data[self.pos:] + data if self.data else data
        self.pos = 0

    def drop(self) -> None:
        """Nothing more is parsed on this connection."""
        self.data = b""
        self.pos = 0

    def body(self, length: int | None, chunked: bool) -> None:
        """A request's head is in: its body (``length`` bytes, or chunked) comes next."""
        self.chunked = chunked
        self.whole = self.took_body = False
        self.body_left = 0 if chunked else length or 0

    def took(self, size: int) -> None:
        """The parser gave ``size`` bytes of the body being received."""
        if self.body_left:
            self.body_left -= size
        self.took_body = True

    def ended(self) -> None:
        """The request being received is complete."""
        self.body_left = 0
        self.chunked = self.whole = False

    def _nl0(self, start: int, end: int) -> int:
        """Where the first "\\n0" whose "0" lies in data[start:end] starts (-1 before the data); None."""
        data = self.data
        if start == 0 and self.last_nl and data[:1] == b"0":
            return -1
        at = data.find(b"\n0", max(start - 1, 0), end)
        return None if at < 0 else at

    def piece(self, room: int) -> memoryview | bytes:
        """The next piece to parse, for a pipeline with ``room`` places (more than 0) free."""
        data, pos = self.data, self.pos
        assert data and room > 0
        if self.chunked and not self.whole and self.took_body and not self.last_nl0:
            self.whole = True  # body bytes came after the last "\n0" seen: the body goes on
        self.took_body = False
        small = room * limits.REQUEST_BYTES_MIN
        end = pos + small + self.body_left
        if self.whole:
            at = self._nl0(pos, len(data))
            if at is None:
                end = len(data)
            else:
                end = max(end, at + 2 + small)
                self.whole = False  # past it the body may have ended
        end = min(end, len(data))
        self.last_nl0 = self._nl0(pos, end) is not None
        self.last_nl = data[end - 1:end] == b"\n"
        if end == len(data):
            self.data, self.pos = b"", 0
            return memoryview(data)[pos:] if pos else data
        self.pos = end
        return memoryview(data)[pos:end]
