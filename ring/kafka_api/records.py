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
headers (count, and for each a key and a nullable value). Compression none, gzip,
snappy (raw, or in the xerial framing of Kafka's Java client), lz4 (the LZ4 frame) and
zstd are read here and stored as ring's records; any other codec id is answered
UNSUPPORTED_COMPRESSION_TYPE (``Unsupported``), and so are transactional and control
batches. Fetches answer uncompressed batches. An idempotent producer's id, epoch and base
sequence are kept: in the stored batches' headers (``producer_ids.fold``), and in the
batches a fetch answers.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple, Sequence

import cramjam
import lz4.frame
import zstandard
from crc32c import crc32c

from ring import limits
from ring.errors import BadRequest, CorruptBatch, PayloadTooLarge
from ring.kafka_api.errors import UNSUPPORTED_COMPRESSION_TYPE
from ring.kafka_api.producer_ids import unfold
from ring.kafka_api.wire import uvarint_bytes
from ring.log import batch as batchfmt

MAGIC = 2
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 61
_CRC_FROM = 21
_LENGTH_BASE = HEADER_SIZE - 12  # batch_length counts the bytes after its own field

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = 0, 1, 2, 3, 4
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


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos``: (value, the position after it). IndexError past the end."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value, shift = b & 0x7F, 7
    while True:
        pos += 1
        b = buf[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 63:
            raise CorruptBatch("a varint longer than 64 bits")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag-encoded signed varint at ``pos``."""
    v, pos = _uvarint(buf, pos)
    return (v >> 1) ^ -(v & 1), pos


def _read_records(buf: bytes, count: int, base_offset: int, base_ts: int) -> list[KafkaRecord]:
    """``count`` records filling ``buf`` exactly. One flat loop, no reader object per record: this
    is the produce path's cost per record. A varint of one byte (zigzag: -64 to 63, most deltas,
    lengths and counts) is read in place, and so is one of two bytes where one is common (a record's
    and a value's length); a longer one by ``_varint``. Records are made with
    ``tuple.__new__``, which skips the named tuple's Python-level constructor."""
    out = []
    append, new, record = out.append, tuple.__new__, KafkaRecord
    pos, end = 0, len(buf)
    headers_max, name_max = limits.HEADERS_PER_RECORD_MAX, limits.HEADER_NAME_BYTES_MAX
    try:
        for _ in range(count):
            b = buf[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif buf[pos + 1] < 0x80:  # two bytes: a record of 64 to 8191 bytes
                u = (b & 0x7F) | buf[pos + 1] << 7
                length, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                length, pos = _varint(buf, pos)
            rec_end = pos + length
            if length < 0 or rec_end > end:
                raise CorruptBatch(f"a record of {length} bytes in {end - pos}")
            pos += 1  # the record's attributes, unused
            b = buf[pos]
            ts_delta, pos = ((b >> 1) ^ -(b & 1), pos + 1) if b < 0x80 else _varint(buf, pos)
            b = buf[pos]
            offset_delta, pos = ((b >> 1) ^ -(b & 1), pos + 1) if b < 0x80 else _varint(buf, pos)
            b = buf[pos]
            n, pos = ((b >> 1) ^ -(b & 1), pos + 1) if b < 0x80 else _varint(buf, pos)
            key = None if n < 0 else buf[pos:pos + n]
            pos += max(n, 0)
            b = buf[pos]
            if b < 0x80:
                n, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif buf[pos + 1] < 0x80:
                u = (b & 0x7F) | buf[pos + 1] << 7
                n, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                n, pos = _varint(buf, pos)
            value = None if n < 0 else buf[pos:pos + n]
            pos += max(n, 0)
            b = buf[pos]
            count_h, pos = ((b >> 1) ^ -(b & 1), pos + 1) if b < 0x80 else _varint(buf, pos)
            if count_h < 0 or count_h > headers_max:
                raise BadRequest(f"a record with {count_h} headers: at most {headers_max}")
            headers = []
            for _ in range(count_h):
                n, pos = _varint(buf, pos)
                if n < 1 or n > name_max:
                    raise BadRequest(f"header names must be 1 to {name_max} bytes, not {n}")
                name = buf[pos:pos + n].decode()
                n2, pos = _varint(buf, pos + n)
                headers.append((name, None if n2 < 0 else buf[pos:pos + n2]))
                pos += max(n2, 0)
            if pos != rec_end:
                raise CorruptBatch(f"a record's length says {length} bytes, its fields take {pos - rec_end + length}")
            append(new(record, (base_offset + offset_delta,
                                base_ts + ts_delta if base_ts != _NO_TIMESTAMP else _NO_TIMESTAMP,
                                key, value, headers)))
    except IndexError:
        raise CorruptBatch("a record runs past the end of its batch") from None
    except UnicodeDecodeError:
        raise CorruptBatch("a header name is not UTF-8") from None
    if pos != end:
        raise CorruptBatch(f"a record batch holds {end - pos} bytes past its {count} records")
    return out


class KafkaProducerId(NamedTuple):
    """The idempotent producer of a partition's batches: Kafka's id and epoch, and the first record's sequence."""

    producer_id: int
    epoch: int
    base_sequence: int


def decode_batches(data: bytes | memoryview, inflate_max: int = limits.REQUEST_BYTES_MAX) -> list[KafkaRecord]:
    """Every record of the batches of one produce's partition (``decode_produced`` without the producer)."""
    return decode_produced(data, inflate_max)[0]


def decode_produced(data: bytes | memoryview,
                    inflate_max: int = limits.REQUEST_BYTES_MAX) -> tuple[list[KafkaRecord], KafkaProducerId | None]:
    """Every record of the batches of one produce's partition, checked (magic, CRC-32C, lengths,
    counts, header limits), and their idempotent producer (None: not idempotent); raises CorruptBatch,
    Unsupported, PayloadTooLarge or BadRequest. The compressed batches together inflate to at most
    ``inflate_max`` bytes. Batches of an idempotent producer must all be its, one after another in
    sequence, as Kafka's one batch per partition of a request is."""
    view = memoryview(data)
    out: list[KafkaRecord] = []
    producer: KafkaProducerId | None = None
    pos = 0
    while pos < len(view):
        if len(view) - pos < HEADER_SIZE:
            raise CorruptBatch("a truncated record batch header")
        (base_offset, length, _epoch, magic, crc, attributes, _last_delta, base_ts, _max_ts, pid, pepoch, seq,
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
        if pos == 0:
            producer = None if pid < 0 else KafkaProducerId(pid, pepoch, seq)
        elif (pid >= 0) != (producer is not None) or producer is not None and (
                (pid, pepoch) != producer[:2] or seq != producer.base_sequence + len(out)):
            raise BadRequest("the batches of a partition are of one idempotent producer, in sequence, or of none")
        if producer is not None and (pepoch < 0 or seq < 0):
            raise BadRequest(f"an idempotent batch (producer {pid}) with epoch {pepoch} and sequence {seq}")
        body = _inflate(attributes & 0x07, view[pos + HEADER_SIZE:end], inflate_max)
        if attributes & 0x07:
            inflate_max -= len(body)
        out += _read_records(bytes(body), count, base_offset, base_ts)
        pos = end
    return out, producer


def _inflate(compression: int, body: memoryview, inflate_max: int) -> bytes | memoryview:
    """``body`` decompressed, at most ``inflate_max`` bytes of it: memory is bounded by that, never by
    a size the batch claims. PayloadTooLarge past it, CorruptBatch for a stream that does not decode."""
    if compression == COMPRESSION_NONE:
        return body
    inflate = _INFLATERS.get(compression)
    if inflate is None:
        raise Unsupported(f"compression {COMPRESSION_NAMES.get(compression, compression)} is not read "
                          "(none, gzip, snappy, lz4 and zstd are)", kafka_error=UNSUPPORTED_COMPRESSION_TYPE)
    name = COMPRESSION_NAMES[compression]
    try:
        out = inflate(body, max(0, inflate_max))
    except _TooLarge:
        raise PayloadTooLarge(f"the batches of a request inflate to over {limits.REQUEST_BYTES_MAX} bytes") from None
    except (zlib.error, zstandard.ZstdError, cramjam.DecompressionError,
            struct.error, ValueError, RuntimeError) as exc:
        raise CorruptBatch(f"a {name} batch does not decompress: {exc}") from None
    if out is None:
        raise CorruptBatch(f"a truncated {name} batch")
    return out


class _TooLarge(Exception):
    """A compressed batch inflating past what the request may still take."""


def _gunzip(body: memoryview, inflate_max: int) -> bytes | None:
    inflater = zlib.decompressobj(wbits=31)
    out = inflater.decompress(body, inflate_max + 1)
    if inflater.unconsumed_tail or len(out) > inflate_max:
        raise _TooLarge
    return out if inflater.eof else None


# The framing snappy-java's SnappyOutputStream writes (Kafka's Java client): this magic, a version and a
# compatible version (int32 each), then blocks, each an int32 length and that many bytes of raw snappy.
# Kafka's broker and librdkafka read it and plain raw snappy both, telling them apart by the magic.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16


def _unsnappy(body: memoryview, inflate_max: int) -> bytearray | None:
    if bytes(body[:len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return _unsnappy_raw(body, inflate_max)
    if len(body) < _XERIAL_HEADER:
        return None
    out = bytearray()
    pos = _XERIAL_HEADER
    while pos < len(body):
        if len(body) - pos < 4:
            return None
        (n,) = struct.unpack_from(">i", body, pos)
        pos += 4
        if n < 0 or pos + n > len(body):
            return None
        out += _unsnappy_raw(body[pos:pos + n], inflate_max - len(out))
        pos += n
    return out


def _unsnappy_raw(block: memoryview, inflate_max: int) -> bytearray:
    """One raw snappy block: its uncompressed length (the varint it starts with) is checked against
    ``inflate_max`` before anything is allocated, and the block must fill exactly that."""
    claimed = cramjam.snappy.decompress_raw_len(bytes(block[:10]))
    if claimed > inflate_max:
        raise _TooLarge
    out = bytearray(claimed)
    written = cramjam.snappy.decompress_raw_into(bytes(block), out)
    if written != claimed:
        raise ValueError(f"a snappy block claims {claimed} bytes and holds {written}")
    return out


def _unlz4(body: memoryview, inflate_max: int) -> bytes | None:
    # Kafka's lz4 for RecordBatch v2 is the standard LZ4 frame; the header-checksum bug of Kafka's old
    # KafkaLZ4BlockOutputStream applied to magic 0 message sets only, which this listener does not read.
    inflater = lz4.frame.LZ4FrameDecompressor()
    out = inflater.decompress(bytes(body), inflate_max + 1)
    if len(out) > inflate_max:
        raise _TooLarge
    return out if inflater.eof else None


def _unzstd(body: memoryview, inflate_max: int) -> bytes | None:
    # A stream reader reads the frames whatever size their headers claim (or if they claim none), and
    # never more than is asked of it: that bounds the output. It passes over a truncated frame silently,
    # so once the output is known to be in bounds, a second pass checks that every frame ends.
    data = bytes(body)
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
        if len(reader.read(inflate_max + 1)) > inflate_max:
            raise _TooLarge
    parts = []
    while data:
        inflater = zstandard.ZstdDecompressor().decompressobj()
        parts.append(inflater.decompress(data))
        if not inflater.eof:
            return None
        data = inflater.unused_data
    return b"".join(parts)


_INFLATERS = {COMPRESSION_GZIP: _gunzip, COMPRESSION_SNAPPY: _unsnappy, COMPRESSION_LZ4: _unlz4,
              COMPRESSION_ZSTD: _unzstd}


_SMALL = [bytes((i,)) for i in range(0x80)]


def _zz(v: int) -> bytes:
    """``v`` as a zigzag-encoded varint."""
    u = (v << 1) ^ (v >> 63)
    return _SMALL[u] if u < 0x80 else uvarint_bytes(u)


def encode_batch(base_offset: int, leader_epoch: int, records: Sequence[tuple[int, bytes | None, bytes | None,
                 Sequence[tuple[str, bytes | None]] | None]], compression: int = COMPRESSION_NONE,
                 producer: KafkaProducerId | None = None) -> bytearray:
    """One batch of ``(timestamp, key, value, headers)`` records at consecutive offsets from
    ``base_offset``, of ``producer`` (None: not idempotent), CreateTime timestamps; ``compression``
    none or gzip."""
    assert records
    base_ts = records[0][0]
    max_ts = base_ts
    parts: list[bytes] = []
    small = _SMALL
    for delta, (ts, key, value, headers) in enumerate(records):
        max_ts = ts if ts > max_ts else max_ts
        # The varints most records have, made in place when they fit one byte (zigzag 0-127): the
        # timestamp's and offset's deltas, and the key's length; the value's and the record's length
        # in one or two bytes (below 8 KiB); ``_zz`` otherwise.
        u = (ts - base_ts) << 1 ^ (ts - base_ts) >> 63
        rec = [b"\x00", small[u] if u < 0x80 else _zz(ts - base_ts), small[delta << 1] if delta < 0x40 else _zz(delta)]
        if key is None:
            rec.append(b"\x01")  # -1: null
        else:
            n = len(key)
            rec += (small[n << 1] if n < 0x40 else _zz(n), key)
        if value is None:
            rec.append(b"\x01")
        else:
            n = len(value)
            rec += (small[n << 1] if n < 0x40 else bytes(((n << 1) & 0x7F | 0x80, n >> 6)) if n < 0x2000
                    else _zz(n), value)
        if headers:
            rec.append(_zz(len(headers)))
            for name, hvalue in headers:
                raw = name.encode("utf-8", "surrogatepass")
                rec += (_zz(len(raw)), raw)
                if hvalue is None:
                    rec.append(b"\x01")
                else:
                    rec += (_zz(len(hvalue)), hvalue)
        else:
            rec.append(b"\x00")
        one = b"".join(rec)
        n = len(one)
        parts += (small[n << 1] if n < 0x40 else bytes(((n << 1) & 0x7F | 0x80, n >> 6)) if n < 0x2000
                  else _zz(n), one)
    body = b"".join(parts)
    if compression == COMPRESSION_GZIP:
        packer = zlib.compressobj(6, zlib.DEFLATED, 31)
        body = packer.compress(body) + packer.flush()
    else:
        assert compression == COMPRESSION_NONE, compression
    buf = bytearray(HEADER_SIZE)
    HEADER.pack_into(buf, 0, base_offset, _LENGTH_BASE + len(body), leader_epoch, MAGIC, 0, compression,
                     len(records) - 1, base_ts, max_ts, *(producer or (-1, -1, -1)), len(records))
    buf += body
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[_CRC_FROM:]))
    return buf


def from_stored(data: bytes | memoryview) -> bytearray:
    """ring's stored batches (read back from a log, so already checked) as Kafka batches: one for each,
    with its base offset, leader epoch, timestamps, keys, values and headers, and the producer id,
    epoch and base sequence of an idempotent one (``producer_ids.unfold``)."""
    out = bytearray()
    for h, pos in batchfmt.scan(data, verify=False):
        _, records = batchfmt.decode(data, pos, verify=False)
        producer = None if h.producer_id < 0 else KafkaProducerId(*unfold(h.producer_id), h.base_sequence)
        out += encode_batch(h.base_offset, h.leader_epoch, [(r.timestamp, r.key, r.value, r.headers)
                                                            for r in records], producer=producer)
    return out
