"""Bytes in, records out; records out, bytes back: the client API's wire formats.

Produce bodies are decoded here into either plain records (JSON, NDJSON,
msgpack, text) that the broker frames into batches, or into client-built
stored batches (``application/vnd.ring.batch``) that are only validated and
then appended as they are; fetch answers are encoded from the stored batch
bytes the broker returns by ``fetch_codec``. Every per-request and per-record limit of
``ring.limits`` is enforced here (with ``jsonscan`` and ``unpack``, which take
JSON and msgpack bodies apart one event at a time so that a body costs memory
in proportion to its bytes), so nothing oversized or malformed reaches the
broker. Nothing here touches a socket except ``read_body``, which streams a
request body while counting it against its limit and the body budget.
"""

from __future__ import annotations

import asyncio
from itertools import chain
from typing import Any, Iterable

import msgpack
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ring import limits
from ring.errors import BadRequest, BodyTimeout, PayloadTooLarge, UnsupportedMediaType
from ring.http_api import budget, jsonscan, unpack
from ring.http_api.jsonscan import json_depth  # noqa: F401 (part of this module's interface)
from ring.log import batch as batchfmt
from ring.log.batch import BatchHeader, RecordIn
from ring.offsets import is_integer
from ring.produce import Batches, Records

CT_JSON = "application/json"
CT_NDJSON = "application/x-ndjson"
CT_MSGPACK = "application/msgpack"
CT_X_MSGPACK = "application/x-msgpack"
CT_BATCH = "application/vnd.ring.batch"
CT_BATCHES = "application/vnd.ring.batches"
CT_TEXT = "text/plain"
PRODUCE_TYPES = (CT_JSON, CT_NDJSON, CT_MSGPACK, CT_X_MSGPACK, CT_BATCH, CT_TEXT)
FETCH_TYPES = (CT_JSON, CT_NDJSON, CT_MSGPACK, CT_X_MSGPACK, CT_BATCHES)

H_NEXT_OFFSET = "Ring-Next-Offset"
H_HIGH_WATERMARK = "Ring-High-Watermark"

# Per-record overhead counted toward batch size when framing records into
# batches: the msgpack array and timestamp delta around key and value.
_RECORD_OVERHEAD_BYTES = 16
_TIMESTAMP_MAX_MS = 2**62
_NoneType = type(None)


# --- reading a body -------------------------------------------------------------


async def read_body(request: web.BaseRequest, limit_bytes: int, line_bytes_max: int | None = None) -> bytes:
    """The whole body, counted while streaming (Content-Length may be absent or lie).

    With ``line_bytes_max`` an unterminated line longer than that aborts the
    read early with 413, so an NDJSON client learns about its bad line at once.
    Every piece is charged to the request's body budget as it is taken (``budget``).
    """
    declared = request.content_length
    if declared is not None and declared > limit_bytes:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the limit of {limit_bytes}",
                              limit_bytes=limit_bytes)
    chunks: list[bytes] = []
    total = 0
    line_bytes = 0
    try:
        async with asyncio.timeout(limits.BODY_READ_TIMEOUT_S):
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    break
                total += len(chunk)
                if total > limit_bytes:
                    raise PayloadTooLarge(f"request body is over the limit of {limit_bytes} bytes",
                                          limit_bytes=limit_bytes)
                budget.charge(request, len(chunk))
                if line_bytes_max is not None:
                    newline = chunk.rfind(b"\n")
                    line_bytes = line_bytes + len(chunk) if newline < 0 else len(chunk) - newline - 1
                    if line_bytes > line_bytes_max:
                        raise PayloadTooLarge(f"a line is over the limit of {line_bytes_max} bytes",
                                              limit_bytes=line_bytes_max)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {limits.BODY_READ_TIMEOUT_S:g} s") from None
    except (RequestPayloadError, HttpProcessingError, ConnectionError) as exc:
        raise BadRequest(f"request body is incomplete or malformed: {exc}") from None
    return b"".join(chunks)


def produce_type(request: web.BaseRequest) -> str:
    """The request's Content-Type if produce speaks it, else 415."""
    ctype = request.content_type.lower()
    if ctype not in PRODUCE_TYPES:
        raise UnsupportedMediaType(f"unsupported content type {ctype!r}; use one of {', '.join(PRODUCE_TYPES)}")
    return ctype


def fetch_type(accept: str | None) -> str:
    """The first supported type named in Accept (q-values ignored); JSON by default."""
    if not accept:
        return CT_JSON
    for part in accept.split(","):
        mime = part.split(";", 1)[0].strip().lower()
        if mime in FETCH_TYPES:
            return CT_MSGPACK if mime == CT_X_MSGPACK else mime
    return CT_JSON


# --- query parameters -----------------------------------------------------------


def int_param(query: Any, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if raw.isascii() and raw.isdigit() and len(raw) < 19:  # the common case: no regular expression
        value = int(raw)
        if not lo <= value <= hi:
            raise BadRequest(f"{name} must be in [{lo}, {hi}]", parameter=name)
        return value
    if not is_integer(raw):
        raise BadRequest(f"{name} must be an integer in ASCII digits", parameter=name)
    try:
        value = int(raw, 10)
    except ValueError:  # more digits than int() converts: out of range whatever the range
        value = hi + 1
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be in [{lo}, {hi}]", parameter=name)
    return value


def key_param(query: Any) -> bytes | None:
    raw = query.get("key")
    if raw is None:
        return None
    key = raw.encode("utf-8", "surrogatepass")
    if len(key) > limits.KEY_BYTES_MAX:
        raise PayloadTooLarge(f"key is over the limit of {limits.KEY_BYTES_MAX} bytes")
    return key


def json_body(body: bytes) -> Any:
    """An administrative JSON body (create topic, truncate)."""
    if not body:
        raise BadRequest("empty body: expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None


# --- produce: decoders ----------------------------------------------------------

def _check_counts(n: int) -> None:
    if n == 0:
        raise BadRequest("no records in the body")
    if n > limits.RECORDS_PER_REQUEST_MAX:
        raise PayloadTooLarge(f"{n} records in one request; the limit is {limits.RECORDS_PER_REQUEST_MAX}")


def _check_sizes(sizes: list[int]) -> None:
    if max(sizes) > limits.MESSAGE_BYTES_MAX:
        raise PayloadTooLarge(f"a record is over the limit of {limits.MESSAGE_BYTES_MAX} bytes",
                              limit_bytes=limits.MESSAGE_BYTES_MAX)


def _json_records(values: list[bytes], key: bytes | None) -> Records:
    return stored_as_given(values, key, True)


def stored_as_given(values: list[bytes], key: bytes | None, values_are_json: bool) -> Records:
    """Records of these values (all with ``key``), each stored as it is."""
    extra = _RECORD_OVERHEAD_BYTES + (len(key) if key else 0)
    if len(values) == 1:  # the common one-record produce, without the lists' comprehensions
        size = len(values[0]) + extra
        _check_sizes([size])
        return Records([(None, key, values[0], None)], [size], values_are_json, False)
    _check_counts(len(values))
    sizes = [len(v) + extra for v in values]
    _check_sizes(sizes)
    return Records([(None, key, v, None) for v in values], sizes, values_are_json, False)


def decode_json(body: bytes, key: bytes | None) -> Records:
    """One event, or a top-level array of events; each stored as compact JSON (see ``jsonscan``)."""
    values = jsonscan.array_values(body) if jsonscan.starts_array(body) else [jsonscan.single_value(body)]
    return _json_records(values, key)


def decode_ndjson(body: bytes, key: bytes | None) -> Records:
    """One JSON event per line; blank lines are skipped."""
    return _json_records(jsonscan.ndjson_values(body), key)


def decode_text(body: bytes, key: bytes | None) -> Records:
    """The whole body is one raw value."""
    if not body:
        raise BadRequest("empty body")
    size = len(body) + _RECORD_OVERHEAD_BYTES + (len(key) if key else 0)
    _check_sizes([size])
    return Records([(None, key, body, None)], [size], False, False)


def _as_bytes(value: object, what: str) -> bytes:
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode("utf-8", "surrogatepass")
    raise BadRequest(f"{what} must be bytes or a string")


def decode_msgpack(body: bytes, key: bytes | None) -> Records:
    """A map ``{value?, key?, headers?, timestamp?}`` or an array of such maps.

    A nil or absent value is a record without a value (a tombstone); headers
    are ``[[name, value], ...]`` pairs (order kept, names may repeat) or a map.
    """
    records: list[RecordIn] = []
    sizes: list[int] = []
    keyed = False
    try:
        for item in unpack.record_maps(body):
            record, size, own_key = _msgpack_record(item, key)
            keyed = keyed or own_key
            records.append(record)
            sizes.append(size)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise unpack.unpack_error(exc, "the body") from None
    _check_counts(len(records))
    _check_sizes(sizes)
    return Records(records, sizes, False, keyed)


def _msgpack_record(item: Any, key: bytes | None) -> tuple[RecordIn, int, bool]:
    """The record of one map, its stored size, and whether it names its own key."""
    if not isinstance(item, dict):
        raise BadRequest("each msgpack record must be a map {value?, key?, headers?, timestamp?}")
    if not item.keys() <= {"value", "key", "headers", "timestamp"}:
        raise BadRequest("a msgpack record may hold only value, key, headers, timestamp")
    raw_value = item.get("value")
    value = None if raw_value is None else _as_bytes(raw_value, "value")
    rec_key = key
    own_key = item.get("key") is not None
    if own_key:
        rec_key = _as_bytes(item["key"], "key")
        if len(rec_key) > limits.KEY_BYTES_MAX:
            raise PayloadTooLarge(f"key is over the limit of {limits.KEY_BYTES_MAX} bytes")
    ts = item.get("timestamp")
    if ts is not None and (type(ts) is not int or not 0 <= ts < _TIMESTAMP_MAX_MS):
        raise BadRequest("timestamp must be an integer of milliseconds since the epoch")
    pairs, header_bytes = batchfmt.check_headers(item.get("headers"), _as_bytes)
    size = (len(value) if value is not None else 0) + (len(rec_key) if rec_key else 0) + header_bytes \
        + _RECORD_OVERHEAD_BYTES
    # Kept packed until framed: a tuple per header would cost 16 times its bytes.
    headers = batchfmt.PackedHeaders(msgpack.packb(pairs, use_bin_type=True)) if pairs else None
    return (ts, rec_key, value, headers), size, own_key


def _check_stored_headers(headers: Iterable[dict | tuple]) -> None:
    """Headers of a client-built batch: ``[name, value]`` pairs (a map is taken too)."""
    for hdrs in headers:
        if len(hdrs) > limits.HEADERS_PER_RECORD_MAX:
            raise PayloadTooLarge(f"more than {limits.HEADERS_PER_RECORD_MAX} headers on a record")
        if type(hdrs) is dict:
            names, values = list(hdrs), list(hdrs.values())
        else:  # unpack.payload_records let only [name, value] pairs of scalars through
            names, values = [h[0] for h in hdrs], [h[1] for h in hdrs]
        if not set(map(type, names)) <= {str} or not set(map(type, values)) <= {bytes, _NoneType}:
            raise BadRequest("stored record header names must be strings and values bytes or nil")
        # The rule of msgpack records and the client: non-empty names, counted in UTF-8 bytes.
        if not all(names) or max(len(name.encode()) for name in names) > limits.HEADER_NAME_BYTES_MAX:
            raise BadRequest(f"header names must be non-empty strings of at most {limits.HEADER_NAME_BYTES_MAX} bytes")


def _check_stored_sizes(keys: list, values: list, headers: list) -> None:
    """Each record's key, value and headers (names in UTF-8, values) within MESSAGE_BYTES_MAX, as
    a msgpack produce counts them: every bin is within it, but a record of several may not be."""
    for key, value, hdrs in zip(keys, values, headers):
        size = (len(key) if key else 0) + (len(value) if value else 0)
        if hdrs:
            size += sum(len(name.encode()) + (len(v) if v else 0)
                        for name, v in (hdrs.items() if type(hdrs) is dict else hdrs))
        if size > limits.MESSAGE_BYTES_MAX:
            raise PayloadTooLarge(f"a record (key, value and headers) is over the limit of {limits.MESSAGE_BYTES_MAX} "
                                  "bytes", limit_bytes=limits.MESSAGE_BYTES_MAX)


def _check_batch_payload(h: BatchHeader, data: memoryview, pos: int) -> None:
    """The payload is a list of ``record_count`` well-formed records, checked C-level.

    A few whole-batch passes, no loop per record: the records are unpacked as
    tuples, flattened, and each field's column checked by its set of types.
    """
    raw = batchfmt.decompress(h.codec, data[pos + batchfmt.HEADER_SIZE : pos + h.size])
    items = unpack.payload_records(raw, h.record_count)
    if set(map(type, items)) != {tuple} or set(map(len, items)) != {4}:
        raise BadRequest("each record in a batch must be [timestamp_delta, key, value, headers]")
    fields = list(chain.from_iterable(items))
    deltas, keys, values, headers = fields[0::4], fields[1::4], fields[2::4], fields[3::4]
    if not set(map(type, deltas)) <= {int} or not set(map(type, values)) <= {bytes, _NoneType}:
        raise BadRequest("record timestamp deltas must be integers and values bytes or nil")
    # Fetch answers carry each timestamp as a 64-bit integer, and retention and
    # time lookups trust max_timestamp: a batch that lies here would fail every
    # fetch of its offsets, or hide from a time lookup, or never expire.
    lowest, highest = h.first_timestamp + min(deltas), h.first_timestamp + max(deltas)
    if not 0 <= lowest <= highest < _TIMESTAMP_MAX_MS:
        raise BadRequest("record timestamps must be milliseconds since the epoch, in [0, 2**62)")
    if h.max_timestamp != highest:
        raise BadRequest("the batch's max_timestamp must be the largest of its record timestamps")
    if not set(map(type, keys)) <= {bytes, _NoneType} or not set(map(type, headers)) <= {tuple, dict, _NoneType}:
        raise BadRequest("record keys must be bytes or nil and headers arrays of pairs, maps or nil")
    # Values (and every other bin) are within MESSAGE_BYTES_MAX: the unpacker refused longer ones.
    present_keys = [k for k in keys if k is not None]
    if present_keys and max(map(len, present_keys)) > limits.KEY_BYTES_MAX:
        raise PayloadTooLarge(f"key is over the limit of {limits.KEY_BYTES_MAX} bytes")
    _check_stored_headers(filter(None, headers))  # rare: only records that carry headers
    if len(raw) > limits.MESSAGE_BYTES_MAX:  # else no record can be: a record's bytes are in the payload
        _check_stored_sizes(keys, values, headers)
    if h.values_are_json:
        # Fetch embeds these values verbatim in JSON answers: they meet a JSON produce's rules.
        jsonscan.check_stored([v for v in values if v is not None])  # a record without a value is no JSON


def decode_batches(body: bytes) -> Batches:
    """One or more unstamped stored batches, validated at C level (one small hook call per record);
    the record limit is checked on the batch headers, before a payload is unpacked."""
    if not body:
        raise BadRequest("empty body")
    data = memoryview(body)
    batches: list[bytearray] = []
    count = 0
    pos = 0
    while pos < len(body):
        h = batchfmt.read_header(data, pos)
        if h.size > limits.BATCH_BYTES_MAX:
            raise PayloadTooLarge(f"a batch is over the limit of {limits.BATCH_BYTES_MAX} bytes",
                                  limit_bytes=limits.BATCH_BYTES_MAX)
        count += h.record_count
        if count > limits.RECORDS_PER_REQUEST_MAX:
            _check_counts(count)
        batchfmt.check(data, pos)
        _check_batch_payload(h, data, pos)
        batches.append(bytearray(data[pos : pos + h.size]))
        pos += h.size
    _check_counts(count)
    return Batches(batches, count)


def decode_produce(ctype: str, body: bytes, key: bytes | None) -> Records | Batches:
    if not body:
        raise BadRequest("empty body")
    if ctype == CT_JSON:
        return decode_json(body, key)
    if ctype == CT_NDJSON:
        return decode_ndjson(body, key)
    if ctype in (CT_MSGPACK, CT_X_MSGPACK):
        return decode_msgpack(body, key)
    if ctype == CT_BATCH:
        return decode_batches(body)
    assert ctype == CT_TEXT, ctype
    return decode_text(body, key)
