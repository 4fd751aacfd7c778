"""Records out: a fetch's answer, encoded from the stored batch bytes the broker returns.

The records ``ring.log.selection`` selects from whole stored batches are
encoded as the client asked (``encode_fetch``: JSON, NDJSON or msgpack). A key, value or header that is
not UTF-8 text goes out base64, and says so; a JSON value goes out as the
JSON it is, on one line in NDJSON.
"""

from __future__ import annotations

import base64
from typing import Any, Iterable

import msgpack
import orjson

from ring.http_api import jsonscan
from ring.http_api.codec import CT_MSGPACK, CT_NDJSON
from ring.log.batch import Record


def _text_or_base64(raw: bytes) -> tuple[str, bool]:
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), True


def record_json(rec: Record, is_json: bool) -> dict[str, Any]:
    """A record for JSON answers. A record without a value has no ``value``
    field, which tells it apart from a JSON ``null`` value; headers are
    ``[name, value]`` pairs in order."""
    doc: dict[str, Any] = {"offset": rec.offset, "timestamp": rec.timestamp, "key": None}
    if rec.key is not None:
        doc["key"], b64 = _text_or_base64(rec.key)
        if b64:
            doc["key_encoding"] = "base64"
    if rec.value is None:
        pass
    elif is_json:
        doc["value"] = orjson.Fragment(rec.value)
    else:
        doc["value"], b64 = _text_or_base64(rec.value)
        if b64:
            doc["value_encoding"] = "base64"
    headers: list[tuple[str, str | None]] = []
    if rec.headers:
        try:
            headers = [(k, None if v is None else v.decode("utf-8")) for k, v in rec.headers]
        except UnicodeDecodeError:
            headers = [(k, None if v is None else base64.b64encode(v).decode("ascii")) for k, v in rec.headers]
            doc["headers_encoding"] = "base64"
    doc["headers"] = headers
    return doc


def record_msgpack(rec: Record) -> dict[str, Any]:
    """A record for msgpack answers: value nil when the record has none (a JSON
    null value is the bytes ``null``); headers ``[name, value]`` pairs."""
    return {"offset": rec.offset, "timestamp": rec.timestamp, "key": rec.key,
            "value": rec.value, "headers": rec.headers or []}


def encode_fetch(accept: str, topic: str, partition: int, selected: Iterable[tuple[Record, bool]],
                 next_offset: int, high_watermark: int) -> bytes:
    """The answer body for JSON, NDJSON or msgpack (stored batches are sent as they are)."""
    if accept == CT_NDJSON:
        return _ndjson(selected)
    if accept == CT_MSGPACK:
        return msgpack.packb({
            "topic": topic, "partition": partition,
            "records": [record_msgpack(r) for r, _ in selected],
            "next_offset": next_offset, "high_watermark": high_watermark,
        }, use_bin_type=True)
    return orjson.dumps({
        "topic": topic, "partition": partition,
        "records": [record_json(r, j) for r, j in selected],
        "next_offset": next_offset, "high_watermark": high_watermark,
    })


def _ndjson(selected: Iterable[tuple[Record, bool]]) -> bytes:
    """One record per line whatever the stored bytes (a client-built batch may hold JSON that was
    never made compact)."""
    out = bytearray()  # each orjson output is dropped once copied: kept, each would hold ~4 KiB
    for rec, is_json in selected:
        out += orjson.dumps(record_line(rec, is_json), option=orjson.OPT_APPEND_NEWLINE)
    return bytes(out)


def record_line(rec: Any, is_json: bool) -> dict[str, Any]:
    """``record_json`` for a record written on a line of its own (NDJSON): a JSON value that holds
    a line break is sent compact, one that is not JSON after all as text."""
    line = jsonscan.one_line(rec.value) if is_json and rec.value is not None else None
    doc = record_json(rec, is_json and line is not None)
    if line is not None and line is not rec.value:
        doc["value"] = orjson.Fragment(line)
    return doc
