"""Hostile input into every client-facing decoder: only the project's bad-input errors come out.

Random bytes and structured garbage (wrong types, huge and negative numbers,
deep nesting, NaN/Infinity, invalid UTF-8, duplicate keys, lying counts and
lengths) go into the produce decoders of ``ring.http_api.codec`` and the
stored-batch format of ``ring.log.batch``. Every call either returns a result
that is sound (values parse, sizes are within the limits, a stored batch that
was accepted can be served back in every fetch format) or raises
``BadRequest`` (or a subclass) or ``PayloadTooLarge``; anything else would be a
500 for bad input. The same bodies also go through the real in-process client-port front
server whose handler calls the codec the way the produce handler does, under
the real error middleware, so streaming, Content-Type and query parsing are
covered too.
"""

from __future__ import annotations

import asyncio
import math
import struct
import threading
import zlib
from typing import Any, Callable, Iterator

import msgpack
import orjson
import pytest
from aiohttp import ClientSession, ClientTimeout
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ring import limits
from ring.errors import BadRequest, CorruptBatch, PayloadTooLarge
from ring.http_api import codec, fetch_codec, web
from ring.http_api.server import Server
from ring.log import batch as B
from ring.log import selection

BAD_INPUT = (BadRequest, PayloadTooLarge)
T0 = 1_700_000_000_000
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_SMALL = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rejects_cleanly(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when it refused the input with a bad-input error."""
    try:
        return fn(*args)
    except BAD_INPUT:
        return None


# --- strategies ------------------------------------------------------------------

INT_EDGES = [0, -1, 1, 2**31 - 1, 2**31, -(2**31), 2**53 + 1, 2**62, 2**63 - 1, -(2**63), 2**64 - 1]
ints = st.integers(-(2**63), 2**64 - 1) | st.sampled_from(INT_EDGES)
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([math.nan, math.inf, -math.inf, -0.0])
scalars = (st.none() | st.booleans() | ints | floats | st.text(max_size=8) | st.binary(max_size=8)
           | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4))
           | st.builds(msgpack.Timestamp, st.integers(0, 2**34), st.integers(0, 999_999_999)))


def nested(leaf: st.SearchStrategy) -> st.SearchStrategy:
    return st.recursive(
        leaf,
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=4),
        max_leaves=12,
    )


anything = nested(scalars)

# JSON-looking byte soup: the tokens a parser and the depth check care about.
JSON_TOKENS = [b"[", b"]", b"{", b"}", b'"', b"\\", b",", b":", b"1", b"-", b"e", b".", b"null", b"true",
               b"NaN", b"Infinity", b"-Infinity", b"1e400", b"18446744073709551616", b"\xff", b"\xc3",
               b"\xed\xa0\x80", b"\n", b"\r\n", b" ", b'"a"', b'"\\ud800"', b'"\\u0000"', b"\x00", b"\xef\xbb\xbf"]
json_soup = st.lists(st.sampled_from(JSON_TOKENS), max_size=40).map(b"".join)


@st.composite
def deep_json(draw: st.DrawFn) -> bytes:
    """Nesting around the depth limit and far past it, arrays and objects mixed."""
    depth = draw(st.sampled_from([limits.JSON_DEPTH_MAX - 1, limits.JSON_DEPTH_MAX, limits.JSON_DEPTH_MAX + 1,
                                  limits.JSON_DEPTH_MAX + 2, 1100, 5000]))
    mix = draw(st.integers(1, 7))  # which levels are objects: a pattern, not thousands of draws
    opens = [b'{"k":' if (i * mix) % 3 == 0 else b"[" for i in range(depth)]
    inner = draw(st.sampled_from([b"1", b"[]", b"{}", b'"x"']))
    closes = [b"]" if o == b"[" else b"}" for o in reversed(opens)]
    text = b"".join(opens) + inner + b"".join(closes)
    return b"[" + text + b"]" if draw(st.booleans()) else text


json_docs = (nested(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=6)
                    | st.floats(allow_nan=False, allow_infinity=False))
             .map(lambda v: orjson.dumps(v)))
json_bodies = st.binary(max_size=64) | json_soup | deep_json() | json_docs


def _bad_utf8_str(payload: bytes) -> bytes:
    """A msgpack str whose bytes are not UTF-8 (msgpack's packer never makes one)."""
    assert len(payload) < 32
    return bytes([0xA0 | len(payload)]) + payload


@st.composite
def raw_msgpack_maps(draw: st.DrawFn) -> bytes:
    """Hand-built msgpack maps: duplicate keys, non-UTF-8 keys, keys that are not strings."""
    keys = [msgpack.packb(k) for k in ("value", "key", "headers", "timestamp", "other")]
    keys += [_bad_utf8_str(b"\xff\xfe"), _bad_utf8_str(b"val\xc3"), msgpack.packb(1), msgpack.packb(b"value"),
             msgpack.packb(None), msgpack.packb([1])]
    values = [msgpack.packb(v, use_bin_type=True) for v in (b"v", "v", 1, None, {"h": b"x"}, 2**64 - 1, -1)]
    values += [_bad_utf8_str(b"\xff"), b"\xc1", b"\xdd\xff\xff\xff\xff"]  # never-used byte, array claiming 4G items
    n = draw(st.integers(0, 6))
    pairs = draw(st.lists(st.tuples(st.sampled_from(keys), st.sampled_from(values)), min_size=n, max_size=n))
    body = bytes([0x80 | n]) + b"".join(k + v for k, v in pairs)
    return draw(st.sampled_from([body, b"\x91" + body, b"\x92" + body + body]))


record_maps = st.dictionaries(
    st.sampled_from(["value", "key", "headers", "timestamp", "extra"]) | st.text(max_size=3),
    anything | st.dictionaries(st.text(max_size=3), anything, max_size=3),
    max_size=5,
)
msgpack_bodies = (
    st.binary(max_size=64)
    | raw_msgpack_maps()
    | anything.map(lambda v: msgpack.packb(v, use_bin_type=True))
    | record_maps.map(lambda v: msgpack.packb(v, use_bin_type=True))
    | st.lists(record_maps, max_size=4).map(lambda v: msgpack.packb(v, use_bin_type=True))
    | anything.map(lambda v: msgpack.packb(v, use_bin_type=False))
)
keys = st.none() | st.binary(max_size=8)


# --- produce decoders, called directly ---------------------------------------------


def _sound_records(r: codec.Records) -> None:
    assert r.records and len(r.records) == len(r.sizes) <= limits.RECORDS_PER_REQUEST_MAX
    assert max(r.sizes) <= limits.MESSAGE_BYTES_MAX
    for ts, key, value, headers in r.records:
        assert ts is None or (type(ts) is int and 0 <= ts < 2**62)
        assert key is None or type(key) is bytes
        assert value is None or type(value) is bytes
        if headers is not None:  # kept packed as stored until framed
            assert type(headers) is B.PackedHeaders
            pairs = msgpack.unpackb(headers)
            assert pairs and all(len(p) == 2 and type(p[0]) is str and (p[1] is None or type(p[1]) is bytes)
                                 for p in pairs)
        if r.values_are_json and value is not None:
            orjson.loads(value)  # fetch embeds JSON values verbatim: they must parse


@FUZZ
@given(json_bodies, keys)
@example(b"[" * 100_000 + b"]" * 100_000, None)
@example(b'{"a": NaN}', None)
@example(b"[1e400]", None)
@example(b"\xef\xbb\xbf{}", None)
def test_json_body(body: bytes, key: bytes | None) -> None:
    r = rejects_cleanly(codec.decode_produce, codec.CT_JSON, body, key)
    if r is not None:
        _sound_records(r)


@FUZZ
@given(st.lists(json_bodies, max_size=5).map(b"\n".join) | st.binary(max_size=64), keys)
@example(b"\n\n \n", None)
@example(b"{}\n" + b"[" * 70 + b"]" * 70, None)
def test_ndjson_body(body: bytes, key: bytes | None) -> None:
    r = rejects_cleanly(codec.decode_produce, codec.CT_NDJSON, body, key)
    if r is not None:
        _sound_records(r)


@FUZZ
@given(msgpack_bodies, keys)
@example(b"\x91\x81\xa5value\xc4\x01x", None)
@example(b"\xdc\xff\xff", None)  # array16 claiming 65535 items with none present
@example(msgpack.packb([{"value": b"v"}] * (limits.RECORDS_PER_REQUEST_MAX + 1)), None)
@example(msgpack.packb({"value": b"v", "headers": {str(i): b"" for i in range(65)}}), None)
@example(msgpack.packb({"value": b"v", "timestamp": 2**63}), None)
@example(msgpack.packb([{"key": b"k"}, {"value": None, "headers": [["a", b"1"], ["a", None]]}]), None)
@example(msgpack.packb({"value": b"v", "headers": [["a", b"1", b"2"], ["b"]]}), None)
def test_msgpack_body(body: bytes, key: bytes | None) -> None:
    r = rejects_cleanly(codec.decode_produce, codec.CT_MSGPACK, body, key)
    if r is not None:
        _sound_records(r)


@FUZZ_SMALL
@given(st.binary(max_size=32), keys)
def test_text_body(body: bytes, key: bytes | None) -> None:
    r = rejects_cleanly(codec.decode_produce, codec.CT_TEXT, body, key)
    if r is not None:
        _sound_records(r)
        assert r.records[0][2] == body


@FUZZ
@given(st.dictionaries(st.sampled_from(["partition", "key", "offset", "x"]),
                       st.text(max_size=12) | st.sampled_from(["-1", "2147483648", "1e3", "0x10", " 7", "٣", "9" * 30]),
                       max_size=3))
def test_query_parameters(query: dict[str, str]) -> None:
    rejects_cleanly(codec.int_param, query, "partition", None, 0, 2**31 - 1)
    rejects_cleanly(codec.int_param, query, "offset", 0, 0, 2**63 - 1)
    key = rejects_cleanly(codec.key_param, query)
    assert key is None or len(key) <= limits.KEY_BYTES_MAX


@FUZZ_SMALL
@given(json_bodies)
def test_admin_json_body(body: bytes) -> None:
    rejects_cleanly(codec.json_body, body)


# --- stored batches -------------------------------------------------------------------


def _frame(payload: bytes, *, count: int, first: int = T0, max_ts: int = T0, attributes: int = 0,
           base_offset: int = 0, epoch: int = 0, crc: int | None = None, length: int | None = None) -> bytes:
    """A batch with a hand-made payload and header; CRC made to match unless given."""
    length = B.HEADER_SIZE - 16 + len(payload) if length is None else length
    buf = bytearray(B.HEADER.pack(base_offset, epoch, length, 0, B.MAGIC, attributes, count, first, max_ts, -1, -1))
    buf += payload
    struct.pack_into(">I", buf, 16, zlib.crc32(bytes(buf[20:])) if crc is None else crc)
    return bytes(buf)


header_names = st.text(max_size=4) | st.sampled_from(["é" * 200, "h" * 257])
well_formed_records = st.tuples(
    st.sampled_from([0, 0, 1, 1000] + INT_EDGES) | st.integers(-(2**63), 2**64 - 1),
    st.none() | st.binary(max_size=6),
    st.none() | st.binary(max_size=8) | st.sampled_from([b"{}", b"[1]", b"1e400", b"\xff", b'"\\ud800"']),
    st.none() | st.dictionaries(header_names, st.none() | st.binary(max_size=4), max_size=3)
    | st.lists(st.tuples(header_names, st.none() | st.binary(max_size=4)).map(list)
               | st.lists(st.none() | st.text(max_size=2) | st.binary(max_size=2), max_size=3), max_size=3),
).map(list)
malformed_records = st.lists(anything, max_size=5) | anything
record_lists = st.lists(st.sampled_from([0, 1, 2, 3, 4]).flatmap(
    lambda i: malformed_records if i == 0 else well_formed_records), min_size=1, max_size=4)


def _honest_max(records: list, first: int) -> int:
    deltas = [r[0] for r in records if type(r) is list and r and type(r[0]) is int]
    return max(-(2**63), min(2**63 - 1, first + max(deltas, default=0)))


@st.composite
def crafted_batches(draw: st.DrawFn) -> bytes:
    """CRC-valid batches whose payload or header fields are wrong in the ways a hostile client could pick."""
    records = draw(record_lists)
    payload = draw(st.sampled_from(["list"] * 4 + ["raw", "value"]))
    if payload == "raw":
        body = draw(st.binary(max_size=40))
    elif payload == "value":
        body = msgpack.packb(draw(anything), use_bin_type=True)
    else:
        body = msgpack.packb(records, use_bin_type=True)
    codec_id = draw(st.sampled_from([B.CODEC_NONE] * 3 + [B.CODEC_ZSTD, B.CODEC_LZ4, 3, 7]))
    if codec_id in (B.CODEC_ZSTD, B.CODEC_LZ4) and draw(st.booleans()):
        body = B._compress(codec_id, body)
    count = draw(st.sampled_from([len(records)] * 4 + [0, -1, 2**31 - 1, len(records) + 1]))
    first = draw(st.sampled_from([T0, T0, 0, -1, -(2**63), 2**63 - 1, 2**62]))
    honest = _honest_max(records, first)
    max_ts = draw(st.sampled_from([honest, honest, first, T0, 2**63 - 1, -(2**63), min(first + 1, 2**63 - 1)]))
    attributes = codec_id | draw(st.sampled_from([0, 0, B.VALUE_FORMAT_JSON, 0xF0]))
    return _frame(body, count=count, first=first, max_ts=max_ts, attributes=attributes)


def _serve_back(batches: list[bytearray]) -> None:
    """What a fetch does with accepted batches, in every answer format: it must not fail."""
    data = bytearray()
    offset = 0
    for b in batches:
        h = B.read_header(b)
        B.stamp(b, 0, offset, 1)
        offset += h.record_count
        data += b
    data = bytes(data)
    for h, pos in B.scan(data):
        recs = B.decode(data, pos)[1]
        stamps = [r.timestamp for r in recs]
        assert all(0 <= t < 2**62 for t in stamps) and h.max_timestamp == max(stamps)
        for r in recs:  # the same header rules as for msgpack records and the client
            assert all(0 < len(n.encode()) <= limits.HEADER_NAME_BYTES_MAX for n, _ in r.headers or ()), r.headers
    selected, next_offset = selection.select_records(data, 0, limits.FETCH_RECORDS_MAX, offset)
    assert next_offset == offset and len(selected) == offset
    for accept in (codec.CT_JSON, codec.CT_NDJSON, codec.CT_MSGPACK):
        out = fetch_codec.encode_fetch(accept, "t", 0, selected, next_offset, offset)
        if accept == codec.CT_JSON:
            assert len(orjson.loads(out)["records"]) == offset
        elif accept == codec.CT_NDJSON:
            assert [orjson.loads(line)["offset"] for line in out.splitlines()] == list(range(offset))
        else:
            assert len(msgpack.unpackb(out, raw=False)["records"]) == offset
    assert selection.batches_next_offset(data, 0) == offset


@FUZZ
@given(st.lists(crafted_batches(), min_size=1, max_size=3).map(b"".join))
@example(_frame(msgpack.packb([[2**64 - 1, None, b"v", None]]), count=1, first=2**63 - 1, max_ts=2**63 - 1))
@example(_frame(msgpack.packb([[0, None, b"v", None], [5, None, b"w", None]]), count=2, first=T0, max_ts=T0))
def test_stored_batch_ingest_accepts_only_what_can_be_served(body: bytes) -> None:
    got = rejects_cleanly(codec.decode_produce, codec.CT_BATCH, body, None)
    if got is not None:
        assert got.record_count == sum(B.read_header(b).record_count for b in got.batches)
        _serve_back(got.batches)


def test_stored_batch_timestamps_must_be_sound() -> None:
    """Found by the fuzzer: a batch whose timestamps overflow 64 bits was accepted and then failed
    every JSON and msgpack fetch of its offsets with a 500; a lying max_timestamp misled retention."""
    def one(deltas: list[int], first: int, max_ts: int) -> bytes:
        return _frame(msgpack.packb([[d, None, b"v", None] for d in deltas]), count=len(deltas), first=first,
                      max_ts=max_ts)

    for deltas, first, max_ts in [([2**64 - 1], 2**63 - 1, 2**63 - 1), ([-1], -(2**63), -(2**63)),
                                  ([0], -5, -5), ([0, -10], 5, 5), ([0], 2**62, 2**62),
                                  ([0, 7], T0, T0), ([0], T0, 2**63 - 1)]:
        with pytest.raises(BadRequest):
            codec.decode_produce(codec.CT_BATCH, one(deltas, first, max_ts), None)
    for deltas, first, max_ts in [([0], 0, 0), ([0, 7, 3], T0, T0 + 7), ([5, -5], T0, T0 + 5), ([0], 2**62 - 1, 2**62 - 1)]:
        got = codec.decode_produce(codec.CT_BATCH, one(deltas, first, max_ts), None)
        _serve_back(got.batches)


def test_stored_batch_header_names_follow_the_msgpack_rules() -> None:
    """Stored batches refuse empty header names and count a name's length in bytes, not characters."""
    def with_headers(headers: dict) -> bytes:
        return _frame(msgpack.packb([[0, None, b"v", headers]]), count=1)

    for bad in ({"": b"x"}, {"\u00e9" * 200: None}, {"h" * (limits.HEADER_NAME_BYTES_MAX + 1): b""}):
        with pytest.raises(BadRequest):
            codec.decode_produce(codec.CT_BATCH, with_headers(bad), None)
    ok = {"h" * limits.HEADER_NAME_BYTES_MAX: b"", "\u00e9" * (limits.HEADER_NAME_BYTES_MAX // 2): None}
    _serve_back(codec.decode_produce(codec.CT_BATCH, with_headers(ok), None).batches)


def _valid_batches() -> st.SearchStrategy[bytes]:
    recs = st.lists(st.tuples(st.integers(T0, T0 + 10**6) | st.none(), st.none() | st.binary(max_size=5),
                              st.binary(max_size=12), st.none() | st.just({"h": b"1"})), min_size=1, max_size=4)
    return st.builds(lambda rs, c: bytes(B.encode(rs, now_ms=T0, codec=c)), recs,
                     st.sampled_from([B.CODEC_NONE, B.CODEC_ZSTD, B.CODEC_LZ4]))


@FUZZ
@given(st.lists(_valid_batches(), min_size=1, max_size=5), st.integers(0, 2**40))
def test_span_says_where_a_run_of_stored_batches_begins_and_ends(batches: list[bytes], base: int) -> None:
    """What the replication sender reads of a frame's batches, from their headers only, is what a scan finds."""
    stamped = []
    for b in map(bytearray, batches):
        B.stamp(b, 0, base, 3)
        base += B.read_header(b).record_count
        stamped.append(bytes(b))
    data = b"".join(stamped)
    headers = [h for h, _ in B.scan(data)]
    assert B.span(data) == (headers[0].base_offset, headers[-1].next_offset, len(headers))
    with pytest.raises(CorruptBatch):
        B.span(data[:-1])


@st.composite
def damaged(draw: st.DrawFn, source: st.SearchStrategy[bytes]) -> bytes:
    """A valid body with bits flipped, bytes cut or inserted, or batches glued wrongly."""
    data = bytearray(draw(source))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["flip", "cut", "insert", "overwrite"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if how == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut":
            del data[i:]
        elif how == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            data[i : i + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"]))
    return bytes(data)


@FUZZ
@given(damaged(st.lists(_valid_batches(), min_size=1, max_size=3).map(b"".join)))
def test_stored_batch_ingest_of_damaged_batches(body: bytes) -> None:
    got = rejects_cleanly(codec.decode_produce, codec.CT_BATCH, body, None)
    if got is not None:
        _serve_back(got.batches)


def _records_or_corrupt(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except (CorruptBatch, PayloadTooLarge):
        return None


@FUZZ
@given(st.binary(max_size=200) | damaged(_valid_batches()) | crafted_batches())
def test_batch_format_functions_raise_only_corrupt_batch(data: bytes) -> None:
    _records_or_corrupt(B.read_header, data)
    _records_or_corrupt(B.check, data)
    _records_or_corrupt(lambda: list(B.scan(data)))
    _records_or_corrupt(lambda: list(B.scan(data, verify=False)))
    _records_or_corrupt(B.span, data)
    _records_or_corrupt(B.decode, data)
    _records_or_corrupt(B.decode, data, 0, False)
    if len(data) >= B.HEADER_SIZE:
        for c in (B.CODEC_ZSTD, B.CODEC_LZ4, 5):
            _records_or_corrupt(B.decompress, c, memoryview(data)[B.HEADER_SIZE:])


@FUZZ
@given(_valid_batches(), st.data())
def test_damage_outside_the_crc_is_the_only_damage_check_misses(good: bytes, data: st.DataObject) -> None:
    """A flipped bit is caught by ``check`` unless it is in the base offset or epoch (set by the leader)."""
    i = data.draw(st.integers(0, len(good) - 1))
    bad = bytearray(good)
    bad[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        h = B.check(bad)
    except CorruptBatch:
        return
    assert i < 16 and i not in range(12, 16), f"a flip at byte {i} went unnoticed"
    assert B.decode(bad)[1] == [r._replace(offset=r.offset - B.read_header(good).base_offset + h.base_offset)
                                for r in B.decode(good)[1]]


def test_decompression_bombs_are_refused_by_size() -> None:
    import lz4.frame
    import zstandard

    big = b"\0" * (limits.REQUEST_BYTES_MAX + 1)
    for codec_id, blob in ((B.CODEC_ZSTD, zstandard.ZstdCompressor().compress(big)),
                           (B.CODEC_LZ4, lz4.frame.compress(big))):
        batch = _frame(blob, count=1, attributes=codec_id)
        with pytest.raises(PayloadTooLarge):
            codec.decode_produce(codec.CT_BATCH, batch, None)
        with pytest.raises(PayloadTooLarge):
            B.decode(batch)
    # A zstd frame that does not declare its size is bounded by the output limit all the same.
    stream = zstandard.ZstdCompressor().compressobj().compress(big) + zstandard.ZstdCompressor().compressobj().flush()
    with pytest.raises((PayloadTooLarge, CorruptBatch)):
        B.decompress(B.CODEC_ZSTD, stream)


# --- through the real client-port front ---------------------------------------------------


class _Args:
    key: bytes | None
    ctype: str
    line_bytes_max: int | None


def _prepare_like(request: web.Request) -> None:
    """The produce route's checks before its body, in its order, without a broker behind them."""
    args = _Args()
    codec.int_param(request.query, "partition", None, 0, 2**31 - 1)
    args.key = codec.key_param(request.query)
    args.ctype = codec.produce_type(request)
    args.line_bytes_max = limits.NDJSON_LINE_BYTES_MAX if args.ctype == codec.CT_NDJSON else None
    request.state = args


def _produce_like(request: web.Request) -> web.Response:
    decoded = codec.decode_produce(request.state.ctype, request.body, request.state.key)
    count = decoded.record_count if isinstance(decoded, codec.Batches) else len(decoded.records)
    return web.json({"count": count})


def _admin_like(request: web.Request) -> web.Response:
    body = codec.json_body(request.body)
    return web.json({"type": type(body).__name__})


class _Server:
    """The client port's front with two routes on a loopback port, run by a private event loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self._start())

    def run(self, coro: Any, timeout_s: float = 20.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def _start(self) -> None:
        app = web.App()
        app.router.add("POST", "/produce", _produce_like, body_max=limits.REQUEST_BYTES_MAX, prepare=_prepare_like)
        app.router.add("POST", "/admin", _admin_like, body_max=limits.ADMIN_BODY_BYTES_MAX)
        self.server = Server(app, "127.0.0.1", 0)
        await self.server.start()
        self.port = self.server.port
        self.session = ClientSession(timeout=ClientTimeout(total=15))

    async def post(self, path: str, body: bytes, ctype: str | None, query: dict[str, str],
                   chunked: bool) -> tuple[int, bytes]:
        headers = {"Content-Type": ctype} if ctype is not None else {"Content-Type": ""}
        data: Any = body
        if chunked:
            async def gen() -> Any:
                for i in range(0, len(body), 7):
                    yield body[i : i + 7]
            data = gen()
        async with self.session.post(f"http://127.0.0.1:{self.port}{path}", data=data, headers=headers,
                                     params=query) as resp:
            return resp.status, await resp.read()

    def close(self) -> None:
        async def stop() -> None:
            await self.session.close()
            await self.server.stop()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


CTYPES = [codec.CT_JSON, codec.CT_NDJSON, codec.CT_MSGPACK, codec.CT_X_MSGPACK, codec.CT_BATCH, codec.CT_TEXT,
          "application/json; charset=latin-1", "APPLICATION/JSON", "application/xml", "multipart/form-data",
          "text/plain; charset=\xff", None]
http_bodies = json_bodies | msgpack_bodies | crafted_batches() | damaged(_valid_batches()) | st.binary(max_size=64)
short_params = st.text(max_size=6) | st.sampled_from(["-1", "4294967296", "00", "1.0", "one"])
queries = st.fixed_dictionaries({}, optional={
    "partition": short_params, "consistency": short_params,
    "key": short_params | st.just("k" * (limits.KEY_BYTES_MAX + 1)),
})


def _check_answer(status: int, body: bytes) -> None:
    assert status == 200 or status in (400, 408, 413, 415), (status, body[:300])
    doc = orjson.loads(body)
    if status != 200:
        assert type(doc["error"]) is str and type(doc["message"]) is str


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(http_bodies, st.sampled_from(CTYPES), queries, st.booleans())
def test_produce_bodies_over_http(server: _Server, body: bytes, ctype: str | None, query: dict[str, str],
                                  chunked: bool) -> None:
    assume(not (ctype is None and not body))
    _check_answer(*server.run(server.post("/produce", body, ctype, query, chunked)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(json_bodies, st.booleans())
def test_admin_bodies_over_http(server: _Server, body: bytes, chunked: bool) -> None:
    _check_answer(*server.run(server.post("/admin", body, codec.CT_JSON, {}, chunked)))


def test_ndjson_line_limit_is_enforced_while_streaming(server: _Server) -> None:
    line = b'"' + b"a" * (limits.NDJSON_LINE_BYTES_MAX + 10) + b'"'
    status, body = server.run(server.post("/produce", line, codec.CT_NDJSON, {}, chunked=False))
    assert status == 413, body[:200]
