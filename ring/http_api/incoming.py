"""A request body as it arrives on the client port: decoded, bounded and counted, piece by piece.

The front hands each piece of a body to ``Incoming.add`` as the parser gives
it (after chunked framing is undone). A ``Content-Encoding`` of gzip or
deflate is inflated here, never to more than the route's limit (a 5 KB gzip
bomb stops at the limit, not at the gigabytes it would become); each decoded
piece is charged to the request's ``BodyHold`` (the broker's body budget)
before it is kept; a body
over the route's limit, or an NDJSON line over its own (``line_bytes_max``),
is refused with 413 as soon as the bytes that make it so arrive. Whatever
was charged is given back by ``release``, exactly once.
"""

from __future__ import annotations

import logging
import zlib

from ring.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from ring.http_api.budget import BodyHold

log = logging.getLogger("ring.http")

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoder_for(encoding: str | None) -> "zlib._Decompress | None":
    """The inflater of a Content-Encoding (None for identity); 415 for one ring does not speak."""
    if not encoding:
        return None
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip() and c.strip().lower() != "identity"]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _WBITS:
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding[:60]!r}; use gzip, deflate or none")
    return zlib.decompressobj(wbits=_WBITS[codings[0]])


class Incoming:
    __slots__ = ("chunks", "size", "limit", "line_bytes_max", "line_bytes", "inflate", "hold", "encoding")

    def __init__(self, limit_bytes: int, hold: BodyHold, encoding: str | None = None,
                 line_bytes_max: int | None = None) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit_bytes
        self.line_bytes_max = line_bytes_max
        self.line_bytes = 0
        self.encoding = encoding
        self.inflate = decoder_for(encoding)
        self.hold = hold

    def add(self, data: bytes) -> None:
        """Take one piece of the body as it came off the wire."""
        if self.inflate is not None:
            data = self._inflated(data)
        if not data:
            return
        size = self.size + len(data)
        if size > self.limit:
            raise PayloadTooLarge(f"request body is over the limit of {self.limit} bytes", limit_bytes=self.limit)
        if self.line_bytes_max is not None:
            newline = data.rfind(b"\n")
            self.line_bytes = self.line_bytes + len(data) if newline < 0 else len(data) - newline - 1
            if self.line_bytes > self.line_bytes_max:
                raise PayloadTooLarge(f"a line is over the limit of {self.line_bytes_max} bytes",
                                      limit_bytes=self.line_bytes_max)
        self.hold.charge(len(data))
        self.size = size
        self.chunks.append(data)

    def _inflated(self, data: bytes) -> bytes:
        assert self.inflate is not None
        room = self.limit - self.size
        try:
            out = self.inflate.decompress(data, room + 1)  # never more than one byte past the limit
        except zlib.error as exc:
            raise self._undecodable(f"cannot decode Content-Encoding {self.encoding}: {exc}") from None
        if len(out) > room:
            raise PayloadTooLarge(f"request body is over the limit of {self.limit} bytes (decoded)",
                                  limit_bytes=self.limit)
        return out

    def finish(self) -> bytes:
        """The whole body, once the last piece is in; 400 for a compressed body cut short."""
        if self.inflate is not None and not self.inflate.eof:
            raise self._undecodable(f"its Content-Encoding {self.encoding} stream ends early")
        body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks = []
        return body

    def _undecodable(self, why: str) -> BadRequest:
        log.warning("refused a request body: %s", why)  # one line, not a traceback: a client can send many
        return BadRequest(f"request body is incomplete or malformed: {why}")

    def release(self) -> None:
        self.hold.release()
        self.chunks = []
