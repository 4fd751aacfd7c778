"""The record batch: the unit ring stores, replicates and serves as bytes.

Layout (big-endian), header of ``HEADER_SIZE`` bytes then the payload::

    off size field            notes
    0   8    base_offset      int64   set by the leader; not covered by the CRC
    8   4    leader_epoch     int32   set by the leader; not covered by the CRC
    12  4    length           uint32  bytes after this field (crc .. payload end)
    16  4    crc              uint32  CRC-32 (zlib's) of bytes [20, 16 + length)
    20  1    magic            uint8   == MAGIC
    21  1    attributes       uint8   bits 0-2 codec, bit 3 value_format json, bit 4 sequences contiguous
    22  4    record_count     int32   >= 1
    26  8    first_timestamp  int64   ms since epoch; record deltas are from it
    34  8    max_timestamp    int64   ms
    42  8    producer_id      int64   -1 when not idempotent
    50  4    base_sequence    int32   -1 when not idempotent
    54  ...  payload          msgpack array of records, maybe compressed

A record in the payload is ``[timestamp_delta, key, value, headers]`` with key
``bin`` or nil; value ``bin``, or nil for a record without a value (Kafka's
tombstone, which is not the same as an empty value); headers nil or an array
of ``[str, bin or nil]`` pairs, in the producer's order, a name possibly
repeated (Kafka's record headers). A ``map`` of str to bin or nil is read as
headers too, as its pairs in order: batches stored before headers became
pairs hold that layout, and msgpack tells the two apart by type, so no batch
carries a format version for it.

Because the CRC skips the base offset and epoch, a leader assigns both by
writing 12 bytes in place (``stamp``); followers and fetches move the same
bytes. Decoding to records happens only when a client asks for JSON.

Every stored byte is CRC-checked several times on its way (the client's
batch on arrival, each read of the log, each follower's append), so the CRC
is ISA-L's (the ``isal`` package, vector instructions, ≈10× zlib's speed)
when it is installed, else zlib's: the same CRC-32, the same values.
"""

from __future__ import annotations

import struct
from typing import Callable, Iterator, NamedTuple, Sequence

try:
    from isal.isal_zlib import crc32
except ImportError:  # the same function, slower
    from zlib import crc32

import msgpack

from ring import limits
from ring.errors import BadRequest, CorruptBatch, PayloadTooLarge

# The layout's version. The rule (docs/OPERATIONS.md, Upgrading): the layout under a magic value never
# changes; a release reads every magic value of the previous release, and writes a new one only once the
# cluster's protocol version says every broker reads it (batches travel between brokers unchanged).
MAGIC = 1
HEADER = struct.Struct(">qiIIBBiqqqi")
HEADER_SIZE = HEADER.size  # 54
assert HEADER_SIZE == 54
# Bytes covered by `length`: everything after the length field.
_LENGTH_BASE = HEADER_SIZE - 16
_OFFSET_EPOCH = struct.Struct(">qi")

CODEC_NONE = 0
CODEC_ZSTD = 1
CODEC_LZ4 = 2
CODECS = {"none": CODEC_NONE, "zstd": CODEC_ZSTD, "lz4": CODEC_LZ4}
_CODEC_MASK = 0b0000_0111
VALUE_FORMAT_JSON = 0b0000_1000  # values are JSON texts (produced as JSON)
# An idempotent producer whose sequences per partition go up by one, with no gap (Kafka's): a batch
# after a gap is refused, so a batch lost on its way is never overtaken by the next. Zero in batches
# of producers that may skip sequences (ring's HTTP producers), and in every batch of older brokers,
# which read no meaning into it.
SEQUENCES_CONTIGUOUS = 0b0001_0000


class BatchHeader(NamedTuple):
    base_offset: int
    leader_epoch: int
    length: int
    crc: int
    magic: int
    attributes: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    base_sequence: int

    @property
    def size(self) -> int:
        """Whole batch size in bytes, header included."""
        return 16 + self.length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def codec(self) -> int:
        return self.attributes & _CODEC_MASK

    @property
    def values_are_json(self) -> bool:
        return bool(self.attributes & VALUE_FORMAT_JSON)

    @property
    def sequences_contiguous(self) -> bool:
        return bool(self.attributes & SEQUENCES_CONTIGUOUS)


Header = tuple[str, bytes | None]


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None  # None: a record without a value (a tombstone)
    headers: list[Header] | None  # in order; a name may repeat




class PackedHeaders(bytes):
    """A record's headers already packed as they are stored (a msgpack array of ``[name, value]``
    pairs): what a decoded produce body keeps for each record until it is framed, instead of a
    tuple per header (64 bytes of objects for 4 bytes on the wire)."""

    __slots__ = ()


# (timestamp or None for "now", key, value, headers)
RecordIn = tuple[int | None, bytes | None, bytes | None, Sequence[Header] | PackedHeaders | None]


def header_pairs(raw: Sequence[Sequence] | dict | None) -> list[Header] | None:
    """Stored or wire headers as ``(name, value)`` pairs in order; None when there are none.

    ``raw`` is an array of pairs, or a map (the stored layout of older
    batches, and what a client may still send), read in its order.
    """
    if not raw:
        return None
    if type(raw) is dict:
        return list(raw.items())
    return list(map(tuple, raw))


def check_headers(raw: object, as_bytes: Callable[[object, str], bytes]) -> tuple[list[Header] | None, int]:
    """A producer's headers, checked against the limits: ``(pairs or None, bytes they add)``.

    ``raw`` is a map of name to value or a sequence of ``(name, value)``
    pairs (which keeps order and repeated names); values go through
    ``as_bytes`` unless None. Raises BadRequest / PayloadTooLarge.
    """
    if raw is None:
        return None, 0
    if type(raw) is dict:
        items = list(raw.items())
    elif isinstance(raw, (list, tuple)):
        items = list(raw)
    else:
        raise BadRequest("headers must be a list of [name, value] pairs or a map of name to value")
    if len(items) > limits.HEADERS_PER_RECORD_MAX:
        raise PayloadTooLarge(f"more than {limits.HEADERS_PER_RECORD_MAX} headers on a record")
    pairs: list[Header] = []
    size = 0
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise BadRequest("each header must be a [name, value] pair")
        name, value = item
        name_bytes = len(name.encode("utf-8", "surrogatepass")) if type(name) is str else 0
        if not name_bytes or name_bytes > limits.HEADER_NAME_BYTES_MAX:
            raise BadRequest(f"header names must be non-empty strings of at most {limits.HEADER_NAME_BYTES_MAX} bytes")
        value = None if value is None else as_bytes(value, f"header {name[:40]!r}")
        pairs.append((name, value))
        size += name_bytes + (len(value) if value is not None else 0)
    return pairs or None, size


def _compress(codec: int, data: bytes) -> bytes:
    if codec == CODEC_NONE:
        return data
    if codec == CODEC_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    if codec == CODEC_LZ4:
        import lz4.frame

        return lz4.frame.compress(data)
    raise BadRequest(f"unknown codec {codec}")


def decompress(codec: int, data: bytes | memoryview, max_bytes: int = limits.REQUEST_BYTES_MAX) -> bytes | memoryview:
    """The uncompressed payload, refusing to inflate past ``max_bytes``: a small
    compressed batch from a client may claim gigabytes."""
    try:
        if codec == CODEC_NONE:
            return data
        if codec == CODEC_ZSTD:
            import zstandard

            if zstandard.frame_content_size(bytes(data[:18])) > max_bytes:
                raise PayloadTooLarge(f"a batch inflates to over {max_bytes} bytes")
            return zstandard.ZstdDecompressor().decompress(bytes(data), max_output_size=max_bytes)
        if codec == CODEC_LZ4:
            import lz4.frame

            inflater = lz4.frame.LZ4FrameDecompressor()
            out = inflater.decompress(bytes(data), max_length=max_bytes)
            if not inflater.eof:
                raise PayloadTooLarge(f"a batch inflates to over {max_bytes} bytes")
            return out
    except (PayloadTooLarge, CorruptBatch):
        raise
    except Exception as exc:  # each codec library raises its own error types
        raise CorruptBatch(f"batch payload does not decompress: {exc}") from None
    raise CorruptBatch(f"unknown codec {codec}")


def encode(
    records: Sequence[RecordIn],
    *,
    now_ms: int,
    codec: int = CODEC_NONE,
    values_are_json: bool = False,
    producer_id: int = -1,
    base_sequence: int = -1,
    sequences_contiguous: bool = False,
) -> bytearray:
    """Build one batch (base offset 0, epoch 0) from records.

    ``now_ms`` is used for records whose timestamp is None.
    """
    assert records, "a batch holds at least one record"
    # Packed one record at a time: no list of every record's fields is built (about 100 bytes a
    # record, 5 MB for a request at the record limit), and it is faster than packb of such a list.
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    packer.pack_array_header(len(records))
    pack = packer.pack
    first = now_ms if records[0][0] is None else records[0][0]
    highest = first
    for r in records:
        ts = now_ms if r[0] is None else r[0]
        highest = ts if ts > highest else highest
        headers = r[3]
        if type(headers) is PackedHeaders:  # the same bytes again (msgpack has no call to copy packed bytes in)
            headers = msgpack.unpackb(headers, use_list=False)
        pack((ts - first, r[1], r[2], headers))
    return encode_payload(
        packer.bytes(),
        record_count=len(records),
        first_timestamp=first,
        max_timestamp=highest,
        codec=codec,
        values_are_json=values_are_json,
        producer_id=producer_id,
        base_sequence=base_sequence,
        sequences_contiguous=sequences_contiguous,
    )


def encode_payload(
    payload: bytes,
    *,
    record_count: int,
    first_timestamp: int,
    max_timestamp: int,
    codec: int = CODEC_NONE,
    values_are_json: bool = False,
    producer_id: int = -1,
    base_sequence: int = -1,
    sequences_contiguous: bool = False,
) -> bytearray:
    """Frame an already packed (uncompressed) msgpack payload as a batch."""
    assert producer_id >= 0 or not sequences_contiguous
    body = _compress(codec, payload)
    attributes = (codec | (VALUE_FORMAT_JSON if values_are_json else 0)
                  | (SEQUENCES_CONTIGUOUS if sequences_contiguous else 0))
    buf = bytearray(HEADER_SIZE + len(body))
    HEADER.pack_into(
        buf, 0, 0, 0, _LENGTH_BASE + len(body), 0, MAGIC, attributes,
        record_count, first_timestamp, max_timestamp, producer_id, base_sequence,
    )
    buf[HEADER_SIZE:] = body
    struct.pack_into(">I", buf, 16, crc32(memoryview(buf)[20:]))
    return buf


_make_header = BatchHeader._make  # from the unpacked tuple as it is: no argument unpacking per header
_COUNT_NEWEST = struct.Struct(">i8xq")  # record_count, (first_timestamp), max_timestamp
_COUNT_POS = 22


def count_and_newest(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """(record_count, max_timestamp) of the batch at ``pos``, from its header alone."""
    return _COUNT_NEWEST.unpack_from(buf, pos + _COUNT_POS)


_PRODUCER_ID = struct.Struct(">q")
_PRODUCER_ID_POS = struct.calcsize(HEADER.format[:10])  # the nine fields before it: base_offset .. max_timestamp
assert HEADER.format[10] == "q" and _PRODUCER_ID_POS == 42


def producer_id(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """The producer id field of the batch at ``pos`` (-1: not idempotent), without parsing the header."""
    return _PRODUCER_ID.unpack_from(buf, pos + _PRODUCER_ID_POS)[0]


_PRODUCER = struct.Struct(">qi")  # producer_id, base_sequence


def set_producer(buf: bytearray, producer_id: int, base_sequence: int) -> None:
    """Give the (single, encoded) batch ``buf`` another producer id and base sequence, and its CRC
    again: an idempotent client moving a batch it never delivered to another partition."""
    _PRODUCER.pack_into(buf, _PRODUCER_ID_POS, producer_id, base_sequence)
    struct.pack_into(">I", buf, 16, crc32(memoryview(buf)[20:]))


def stamp(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Assign offset and epoch in place; the CRC stays valid."""
    _OFFSET_EPOCH.pack_into(buf, pos, base_offset, leader_epoch)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos``; raises CorruptBatch if it cannot be a header."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatch("truncated batch header")
    h = _make_header(HEADER.unpack_from(buf, pos))
    if h.magic != MAGIC:
        raise CorruptBatch(f"bad magic {h.magic}")
    if h.length < _LENGTH_BASE or h.record_count < 1:
        raise CorruptBatch("bad batch length or record count")
    return h


def check(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Header of the whole, CRC-valid batch at ``pos``, else CorruptBatch."""
    h = read_header(buf, pos)
    check_crc(memoryview(buf), pos, h)
    return h


def check_crc(view: memoryview, pos: int, h: BatchHeader) -> None:
    """The batch at ``pos`` of ``view``, whose header ``h`` was read already, is whole and CRC-valid."""
    end = pos + 16 + h.length
    if end > len(view):
        raise CorruptBatch("truncated batch")
    if crc32(view[pos + 20 : end]) != h.crc:
        raise CorruptBatch("batch CRC mismatch")


def scan(buf: bytes | bytearray | memoryview, verify: bool = True) -> Iterator[tuple[BatchHeader, int]]:
    """Yield (header, position) of each batch in a buffer of whole batches.

    Raises CorruptBatch at the first bad or truncated batch.
    """
    pos, end = 0, len(buf)
    while pos < end:
        h = check(buf, pos) if verify else read_header(buf, pos)
        if pos + h.size > end:
            raise CorruptBatch("truncated batch")
        yield h, pos
        pos += h.size


_SPAN = struct.Struct(">qiI6xi")  # base_offset, leader_epoch, length, (crc, magic, attributes), record_count


def span(buf: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(first base offset, the offset after the last batch, batch count) of whole batches read back
    from a log (headers checked there): only the header fields that say where each batch ends."""
    pos, end, first, count = 0, len(buf), -1, 0
    nxt = -1
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise CorruptBatch("truncated batch header")
        base, _, length, records = _SPAN.unpack_from(buf, pos)
        if length < _LENGTH_BASE or records < 1:
            raise CorruptBatch("bad batch length or record count")
        if first < 0:
            first = base
        nxt, count, pos = base + records, count + 1, pos + 16 + length
    if pos != end:
        raise CorruptBatch("truncated batch")
    return first, nxt, count


def decode(buf: bytes | bytearray | memoryview, pos: int = 0, verify: bool = True) -> tuple[BatchHeader, list[Record]]:
    """Records of the batch at ``pos`` with their absolute offsets and timestamps."""
    h = check(buf, pos) if verify else read_header(buf, pos)
    return h, _records(buf, pos, h)


def _records(buf: bytes | bytearray | memoryview, pos: int, h: BatchHeader) -> list[Record]:
    """The records of the batch at ``pos``, whose header ``h`` was read (and checked) already."""
    raw = decompress(h.codec, memoryview(buf)[pos + HEADER_SIZE : pos + h.size])
    try:
        items = msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True)
        new, base, first = tuple.__new__, h.base_offset, h.first_timestamp  # (no named tuple __new__ per record)
        records = [
            new(Record, (base + i, first + it[0], it[1], it[2], header_pairs(it[3]) if it[3] else None))
            for i, it in enumerate(items)
        ]
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise CorruptBatch(f"batch payload is not a record list: {exc}") from None
    if len(records) != h.record_count:
        raise CorruptBatch("record count does not match the header")
    return records


def records_between(data: bytes | bytearray | memoryview, start: int, stop: int, limit: int,
                    verify: bool = True) -> Iterator[tuple[Record, bool]]:
    """``(record, value_is_json)`` for records of stored batches with ``start <= offset < stop``,
    at most ``limit`` of them: how every reader picks what a fetch answered.

    A fetch answer starts with the batch that contains ``start``, so records
    below it are skipped; batches at or above ``stop`` (the high watermark)
    are not decoded at all. ``verify`` checks each batch's CRC (a client
    reading over the network); the broker's own reads were checked by the log.
    """
    count = 0
    for h, pos in scan(data, verify=verify):
        if h.next_offset <= start:
            continue
        if h.base_offset >= stop or count >= limit:
            return
        for rec in _records(data, pos, h):  # the header scan read is the one decode would read again
            if rec.offset < start:
                continue
            if rec.offset >= stop or count >= limit:
                return
            count += 1
            yield rec, h.values_are_json

