"""Kafka's RecordBatch v2 (magic 2): decoded from a produce into ring's records, and built from ring's
stored batches for a fetch, with the same offsets.

Layout (big-endian)::

    off size field
    0   8    base_offset
    8   4    batch_length            bytes after this field
    12  4    partition_leader_epoch
    16  1    magic                   2
    17  4    crc                     CRC-32C of bytes [21, end)
    21  2    attributes              bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control
    23  4    last_offset_delta
    27  8    base_timestamp
    35  8    max_timestamp
    43  8    producer_id
    51  2    producer_epoch
    53  4    base_sequence
    57  4    record count
    61  ...  records, maybe compressed

A record: its length (varint), attributes (int8), timestamp delta (varlong),
offset delta, key length and key, value length and value (-1: null), then its
headers (count, and for each a key and a nullable value). Compression none and
gzip are read here; snappy, lz4 and zstd are answered UNSUPPORTED_COMPRESSION_TYPE
(``Unsupported``), and so are transactional and control batches. Fetches answer
uncompressed batches.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple, Sequence

from crc32c import crc32c

from ring import limits
from ring.errors import BadRequest, CorruptBatch, PayloadTooLarge
from ring.kafka_api.errors import UNSUPPORTED_COMPRESSION_TYPE
from ring.kafka_api.wire import Malformed, Reader, uvarint_bytes, zigzag
from ring.log import batch as batchfmt

MAGIC = 2
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 61
_CRC_FROM = 21
_LENGTH_BASE = HEADER_SIZE - 12  # batch_length counts the bytes after its own field

COMPRESSION_NONE, COMPRESSION_GZIP = 0, 1
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_TRANSACTIONAL, _CONTROL = 0x10, 0x20
_NO_TIMESTAMP = -1


class Unsupported(BadRequest):
    """A batch this listener does not read yet: a compression or a transactional or control batch."""

    code = "unsupported_kafka_batch"


class KafkaRecord(NamedTuple):
    offset: int
    timestamp: int  # ms since the epoch; -1 for none
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _read_record(r: Reader, base_offset: int, base_ts: int) -> KafkaRecord:
    length = r.varint()
    if length < 0 or length > r.left:
        raise CorruptBatch(f"a record of {length} bytes in {r.left}")
    end = r.pos + length
    rec = Reader(r.buf, r.pos, end)
    rec.int8()  # attributes: unused
    ts_delta = rec.varlong()
    offset_delta = rec.varint()
    key = _nullable(rec)
    value = _nullable(rec)
    count = rec.varint()
    if count < 0 or count > limits.HEADERS_PER_RECORD_MAX:
        raise BadRequest(f"a record with {count} headers: at most {limits.HEADERS_PER_RECORD_MAX}")
    headers = []
    for _ in range(count):
        name_len = rec.varint()
        if name_len < 1 or name_len > limits.HEADER_NAME_BYTES_MAX:
            raise BadRequest(f"header names must be 1 to {limits.HEADER_NAME_BYTES_MAX} bytes, not {name_len}")
        name = rec._text(name_len)
        headers.append((name, _nullable(rec)))
    if rec.pos != end:
        raise CorruptBatch(f"a record's length says {length} bytes, its fields take {rec.pos - r.pos}")
    r.pos = end
    return KafkaRecord(base_offset + offset_delta, base_ts + ts_delta if base_ts != _NO_TIMESTAMP else _NO_TIMESTAMP,
                       key, value, headers)


def _nullable(r: Reader) -> bytes | None:
    n = r.varint()
    return None if n < 0 else bytes(r._take(n))


def decode_batches(data: bytes | memoryview, inflate_max: int = limits.REQUEST_BYTES_MAX) -> list[KafkaRecord]:
    """Every record of the batches of one produce's partition, checked (magic, CRC-32C, lengths,
    counts, header limits); raises CorruptBatch, Unsupported, PayloadTooLarge or BadRequest. The
    compressed batches together inflate to at most ``inflate_max`` bytes."""
    view = memoryview(data)
    out: list[KafkaRecord] = []
    pos = 0
    while pos < len(view):
        if len(view) - pos < HEADER_SIZE:
            raise CorruptBatch("a truncated record batch header")
        (base_offset, length, _epoch, magic, crc, attributes, _last_delta, base_ts, _max_ts, _pid, _pepoch, _seq,
         count) = HEADER.unpack_from(view, pos)
        if magic != MAGIC:
            raise Unsupported(f"record batch magic {magic}: only magic 2 (RecordBatch v2) is read")
        end = pos + 12 + length
        if length < _LENGTH_BASE or end > len(view):
            raise CorruptBatch(f"a record batch length of {length} in {len(view) - pos} bytes")
        if crc32c(view[pos + _CRC_FROM:end]) != crc:
            raise CorruptBatch("record batch CRC-32C mismatch")
        if attributes & (_TRANSACTIONAL | _CONTROL):
            raise Unsupported("transactional and control batches are not served")
        if count < 1 or count > limits.RECORDS_PER_REQUEST_MAX - len(out):
            raise CorruptBatch(f"a record batch of {count} records (at most {limits.RECORDS_PER_REQUEST_MAX} "
                               "in a request)")
        body = _inflate(attributes & 0x07, view[pos + HEADER_SIZE:end], inflate_max)
        if attributes & 0x07:
            inflate_max -= len(body)
        r = Reader(body)
        try:
            for _ in range(count):
                out.append(_read_record(r, base_offset, base_ts))
        except Malformed as exc:
            raise CorruptBatch(f"a record does not parse: {exc}") from None
        if r.left:
            raise CorruptBatch(f"a record batch holds {r.left} bytes past its {count} records")
        pos = end
    return out


def _inflate(compression: int, body: memoryview, inflate_max: int) -> bytes | memoryview:
    if compression == COMPRESSION_NONE:
        return body
    if compression != COMPRESSION_GZIP:
        raise Unsupported(f"compression {COMPRESSION_NAMES.get(compression, compression)} is not read yet "
                          "(none and gzip are)", kafka_error=UNSUPPORTED_COMPRESSION_TYPE)
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, max(1, inflate_max))
    except zlib.error as exc:
        raise CorruptBatch(f"a gzip batch does not inflate: {exc}") from None
    if inflater.unconsumed_tail or len(out) > inflate_max:
        raise PayloadTooLarge(f"the batches of a request inflate to over {limits.REQUEST_BYTES_MAX} bytes")
    if not inflater.eof:
        raise CorruptBatch("a truncated gzip batch")
    return out


def encode_batch(base_offset: int, leader_epoch: int, records: Sequence[tuple[int, bytes | None, bytes | None,
                 Sequence[tuple[str, bytes | None]] | None]], compression: int = COMPRESSION_NONE) -> bytearray:
    """One batch of ``(timestamp, key, value, headers)`` records at consecutive offsets from
    ``base_offset``, not idempotent, CreateTime timestamps; ``compression`` none or gzip."""
    assert records
    base_ts = records[0][0]
    max_ts = base_ts
    body = bytearray()
    for delta, (ts, key, value, headers) in enumerate(records):
        max_ts = ts if ts > max_ts else max_ts
        rec = bytearray(b"\x00")
        rec += uvarint_bytes(zigzag(ts - base_ts))
        rec += uvarint_bytes(zigzag(delta))
        _put_nullable(rec, key)
        _put_nullable(rec, value)
        rec += uvarint_bytes(zigzag(len(headers or ())))
        for name, hvalue in headers or ():
            _put_nullable(rec, name.encode("utf-8", "surrogatepass"))
            _put_nullable(rec, hvalue)
        body += uvarint_bytes(zigzag(len(rec)))
        body += rec
    if compression == COMPRESSION_GZIP:
        packer = zlib.compressobj(6, zlib.DEFLATED, 31)
        body = bytearray(packer.compress(body) + packer.flush())
    else:
        assert compression == COMPRESSION_NONE, compression
    buf = bytearray(HEADER_SIZE)
    HEADER.pack_into(buf, 0, base_offset, _LENGTH_BASE + len(body), leader_epoch, MAGIC, 0, compression,
                     len(records) - 1, base_ts, max_ts, -1, -1, -1, len(records))
    buf += body
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[_CRC_FROM:]))
    return buf


def _put_nullable(out: bytearray, b: bytes | None) -> None:
    if b is None:
        out += b"\x01"  # zigzag(-1)
    else:
        out += uvarint_bytes(zigzag(len(b)))
        out += b


def from_stored(data: bytes | memoryview) -> bytearray:
    """ring's stored batches (read back from a log, so already checked) as Kafka batches: one for each,
    with its base offset, leader epoch, timestamps, keys, values and headers."""
    out = bytearray()
    for h, pos in batchfmt.scan(data, verify=False):
        _, records = batchfmt.decode(data, pos, verify=False)
        out += encode_batch(h.base_offset, h.leader_epoch, [(r.timestamp, r.key, r.value, r.headers)
                                                            for r in records])
    return out
