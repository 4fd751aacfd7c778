"""Kafka's wire primitives: fixed-width big-endian integers, varints, strings, bytes, arrays and
tagged fields, in their classic and compact ("flexible version") forms, and request headers.

``Reader`` walks one request frame and raises ``Malformed`` (a ``BadRequest``: the client's fault)
at the first field that does not fit what is left: a length never makes it allocate more than the
frame holds. ``Writer`` builds an answer. Neither touches a socket; the listener (``server``) frames
requests by their size prefix and hands each whole frame here.
"""

from __future__ import annotations

import struct
from typing import Awaitable, Callable, NamedTuple, TypeVar

from ring.errors import BadRequest

T = TypeVar("T")

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">hhi")  # api_key, api_version, correlation_id


class Malformed(BadRequest):
    code = "malformed_kafka_request"


class Reader:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = memoryview(buf)
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    @property
    def left(self) -> int:
        return self.end - self.pos

    def _take(self, n: int) -> memoryview:
        if n < 0 or n > self.end - self.pos:
            raise Malformed(f"a field of {n} bytes at byte {self.pos} runs past the end of the frame ({self.end})")
        view = self.buf[self.pos:self.pos + n]
        self.pos += n
        return view

    def _fixed(self, s: struct.Struct) -> int:
        if self.end - self.pos < s.size:
            raise Malformed(f"truncated at byte {self.pos}")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def int8(self) -> int:
        return self._fixed(_I8)

    def int16(self) -> int:
        return self._fixed(_I16)

    def int32(self) -> int:
        return self._fixed(_I32)

    def int64(self) -> int:
        return self._fixed(_I64)

    def uint32(self) -> int:
        return self._fixed(_U32)

    def boolean(self) -> bool:
        return self.int8() != 0

    def uuid(self) -> bytes:
        """A UUID: 16 bytes (Kafka's topic ids)."""
        return bytes(self._take(16))

    def uvarint(self, bits: int = 32) -> int:
        value = shift = 0
        buf, pos, end = self.buf, self.pos, self.end
        while True:
            if pos >= end:
                raise Malformed(f"truncated varint at byte {self.pos}")
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift >= bits + 7:
                raise Malformed(f"varint longer than {bits} bits at byte {self.pos}")
        self.pos = pos
        return value

    def varint(self) -> int:
        """A zigzag-encoded signed varint (32 bits)."""
        v = self.uvarint(32)
        return (v >> 1) ^ -(v & 1)

    def varlong(self) -> int:
        """A zigzag-encoded signed varint (64 bits)."""
        v = self.uvarint(64)
        return (v >> 1) ^ -(v & 1)

    def _text(self, n: int) -> str:
        try:
            return str(self._take(n), "utf-8")
        except UnicodeDecodeError:
            raise Malformed(f"a string at byte {self.pos - n} is not UTF-8") from None

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise Malformed(f"a null where a string must be, at byte {self.pos}")
        return self._text(n)

    def nullable_string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self._text(n)

    def compact_string(self) -> str:
        s = self.compact_nullable_string()
        if s is None:
            raise Malformed(f"a null where a string must be, at byte {self.pos}")
        return s

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._text(n)

    def nullable_bytes(self) -> memoryview | None:
        n = self.int32()
        return None if n < 0 else self._take(n)

    def compact_nullable_bytes(self) -> memoryview | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._take(n)

    def _count(self, n: int) -> int:
        if n > self.left:  # every entry takes at least one byte: a count past that is a lie
            raise Malformed(f"an array of {n} entries in {self.left} bytes")
        return n

    def array(self, item: Callable[[Reader], T]) -> list[T] | None:
        n = self.int32()
        return None if n < 0 else [item(self) for _ in range(self._count(n))]

    def compact_array(self, item: Callable[[Reader], T]) -> list[T] | None:
        n = self.uvarint() - 1
        return None if n < 0 else [item(self) for _ in range(self._count(n))]

    def tagged_fields(self) -> None:
        """Skip a flexible version's tagged fields: none that this listener serves means anything."""
        for _ in range(self._count(self.uvarint())):
            self.uvarint()  # tag
            self._take(self.uvarint())


class Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def int8(self, v: int) -> Writer:
        self.buf += _I8.pack(v)
        return self

    def int16(self, v: int) -> Writer:
        self.buf += _I16.pack(v)
        return self

    def int32(self, v: int) -> Writer:
        self.buf += _I32.pack(v)
        return self

    def int64(self, v: int) -> Writer:
        self.buf += _I64.pack(v)
        return self

    def boolean(self, v: bool) -> Writer:
        self.buf.append(1 if v else 0)
        return self

    def uvarint(self, v: int) -> Writer:
        self.buf += uvarint_bytes(v)
        return self

    def varint(self, v: int) -> Writer:
        return self.uvarint(zigzag(v))

    def string(self, s: str) -> Writer:
        raw = s.encode()
        return self.int16(len(raw)).raw(raw)

    def nullable_string(self, s: str | None) -> Writer:
        return self.int16(-1) if s is None else self.string(s)

    def compact_string(self, s: str | None) -> Writer:
        if s is None:
            return self.uvarint(0)
        raw = s.encode()
        return self.uvarint(len(raw) + 1).raw(raw)

    def nullable_bytes(self, b: bytes | bytearray | memoryview | None) -> Writer:
        return self.int32(-1) if b is None else self.int32(len(b)).raw(b)

    def compact_bytes(self, b: bytes | bytearray | memoryview | None) -> Writer:
        return self.uvarint(0) if b is None else self.uvarint(len(b) + 1).raw(b)

    def array_len(self, n: int) -> Writer:
        return self.int32(n)

    def compact_array_len(self, n: int) -> Writer:
        return self.uvarint(n + 1)

    def tagged_fields(self) -> Writer:
        return self.uvarint(0)

    def raw(self, b: bytes | bytearray | memoryview) -> Writer:
        self.buf += b
        return self


def zigzag(v: int) -> int:
    return (v << 1) ^ (v >> 63)


def uvarint_bytes(v: int) -> bytes:
    assert v >= 0, v
    if v < 0x80:
        return bytes((v,))
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


class Quiet:
    """The answer to a request Kafka answers with nothing (a produce with acks=0): its work still runs,
    and takes its turn among the connection's answers."""

    __slots__ = ("work",)

    def __init__(self, work: Awaitable[object]) -> None:
        self.work = work


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str = ""  # the connection's peer, as Kafka names it ("/127.0.0.1"): the listener sets it


def read_header(r: Reader, flexible: Callable[[int, int], bool]) -> RequestHeader:
    """A request header: v1 (api key, version, correlation id, client id), or v2 (the same and tagged
    fields) when ``flexible(api_key, api_version)`` says the request is of a flexible version."""
    if r.left < _HEAD.size:
        raise Malformed("a request shorter than its header")
    api_key, api_version, correlation_id = _HEAD.unpack_from(r.buf, r.pos)
    r.pos += _HEAD.size
    client_id = r.nullable_string()  # a plain string even in header v2
    if flexible(api_key, api_version):
        r.tagged_fields()
    return RequestHeader(api_key, api_version, correlation_id, client_id)
