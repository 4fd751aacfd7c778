"""msgpack bodies unpacked one object at a time, with every bound enforced while unpacking.

``msgpack.unpackb`` builds a whole body before anything can be checked, and a
msgpack byte can become a Python object of 50-100 bytes: 16 MiB of empty maps
would be a gigabyte of dicts before their count could be refused. Here an array's count
is read from its header and refused before any item is built, items are
unpacked one at a time, every bin and str is held to the record size limit,
and hooks refuse the nesting no record has (the only arrays in a record are
its headers, ``[name, value]`` pairs of scalars; maps nest at most a record
and its headers) as soon as the first such container is complete, so what is
built before a refusal stays small.
"""

from __future__ import annotations

import io
from itertools import islice
from typing import Any, Iterator

import msgpack

from ring import limits
from ring.errors import BadRequest, PayloadTooLarge


class _RecordMap(dict):
    """A msgpack map holding a map (a record and its headers); no map may hold one of these."""


def _shallow_map(pairs: list[tuple[Any, Any]]) -> dict:
    # object_pairs_hook: maps nest at most two deep (a record, its headers), so a body of nested
    # maps is refused at its third level instead of being built whole first.
    kinds = {type(v) for _, v in pairs}
    if _RecordMap in kinds:
        raise BadRequest("msgpack maps nest at most two deep (a record and its headers)")
    return _RecordMap(pairs) if dict in kinds else dict(pairs)


def _pairs_only(items: list) -> list:
    # list_hook of produce bodies: the only arrays are headers ([[name, value], ...]) and their
    # pairs, so an array is refused as soon as it holds anything else.
    if _is_pair(items) or all(type(i) is list and _is_pair(i) for i in items):
        return items
    raise BadRequest("a msgpack record holds no arrays but its headers' [name, value] pairs")


def _is_pair(items: list | tuple) -> bool:
    return len(items) == 2 and type(items[0]) not in _CONTAINERS and type(items[1]) not in _CONTAINERS


_CONTAINERS = (list, tuple, dict)


def _unpacker(body: bytes | memoryview, **hooks: Any) -> msgpack.Unpacker:
    """An unpacker over ``body`` that builds one object at a time, every bin and str within the
    record limit; it reads ``body`` in place when it is bytes."""
    unpacker = msgpack.Unpacker(io.BytesIO(body) if type(body) is bytes else None, raw=False,
                                strict_map_key=True, max_bin_len=limits.MESSAGE_BYTES_MAX,
                                max_str_len=limits.MESSAGE_BYTES_MAX, max_ext_len=16,
                                max_map_len=limits.HEADERS_PER_RECORD_MAX,
                                max_buffer_size=max(len(body), 1), **hooks)
    if type(body) is not bytes:
        unpacker.feed(body)
    return unpacker


def unpack_error(exc: Exception, what: str) -> Exception:
    # msgpack names the limit it enforced in its message; the two that are a record's size limits:
    if "max_bin_len" in str(exc) or "max_str_len" in str(exc):
        return PayloadTooLarge(f"a record is over the limit of {limits.MESSAGE_BYTES_MAX} bytes",
                               limit_bytes=limits.MESSAGE_BYTES_MAX)
    if "max_map_len" in str(exc) or "max_array_len" in str(exc):  # only headers hold that many
        return PayloadTooLarge(f"more than {limits.HEADERS_PER_RECORD_MAX} headers on a record")
    return BadRequest(f"{what} is not msgpack: {str(exc) or type(exc).__name__}")


def _items(unpacker: msgpack.Unpacker, body: bytes | memoryview, count: int) -> Iterator[Any]:
    """The ``count`` objects after the array header, one at a time, then a check that nothing follows."""
    got = 0
    for item in islice(unpacker, count):
        got += 1
        yield item
    if got < count or unpacker.tell() != len(body):
        raise BadRequest(f"the msgpack body holds {'fewer' if got < count else 'more'} items than it says")


def record_maps(body: bytes) -> Iterator[Any]:
    """The record maps of a body that is one map or an array of them; 413 past the record limit
    before any record is unpacked."""
    unpacker = _unpacker(body, object_pairs_hook=_shallow_map, list_hook=_pairs_only,
                         max_array_len=limits.HEADERS_PER_RECORD_MAX)
    first = body[0]
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        count = unpacker.read_array_header()
        if count == 0:
            raise BadRequest("no records in the body")
        if count > limits.RECORDS_PER_REQUEST_MAX:
            raise PayloadTooLarge(f"{count} records in one request; the limit is {limits.RECORDS_PER_REQUEST_MAX}")
    else:
        count = 1
    return _items(unpacker, body, count)


def _flat_map(pairs: list[tuple[Any, Any]]) -> dict:
    # object_pairs_hook of batch payloads: the only maps are record headers, which hold no containers.
    if {type(v) for _, v in pairs} & {dict, tuple}:
        raise BadRequest("stored record headers must map strings to bytes or nil")
    return dict(pairs)


def _flat_record(items: tuple) -> tuple:
    # list_hook of batch payloads: the arrays are records [timestamp_delta, key, value, headers],
    # headers (an array of [name, value] pairs) and pairs, so nesting deeper than a record's
    # headers is refused as soon as the first array past it is complete.
    inner = [i for i in items if type(i) is tuple]
    if not inner and len(items) in (0, 2, 4):  # no headers, a pair, a record with map or nil headers
        return items
    if inner and len(inner) == len(items) and all(_is_pair(i) for i in items):  # headers
        return items
    if len(items) == 4 and len(inner) == 1 and type(items[3]) is tuple and all(
            type(i) is tuple and _is_pair(i) for i in items[3]):  # a record with headers
        return items
    raise BadRequest("each record in a batch must be [timestamp_delta, key, value, headers]")


def payload_records(raw: bytes | memoryview, record_count: int) -> tuple:
    """The payload's records, unpacked one at a time with every limit enforced on the way (C level):
    the record count before any record, values within the record limit, no nesting."""
    unpacker = _unpacker(raw, use_list=False, max_array_len=max(4, limits.HEADERS_PER_RECORD_MAX),
                         object_pairs_hook=_flat_map, list_hook=_flat_record)
    try:
        if unpacker.read_array_header() != record_count:
            raise BadRequest("batch payload does not hold record_count records")
        return tuple(_items(unpacker, raw, record_count))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise unpack_error(exc, "batch payload") from None
