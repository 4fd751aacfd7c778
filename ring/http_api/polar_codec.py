"""PolarStreams' wire formats: produce bodies in, poll answers out.

A produce body becomes records as PolarStreams stores them: an
``application/x-ndjson`` body one record per line (lines split at ``\\n``, a
trailing ``\\r`` dropped, empty lines skipped: Go's ``bufio.ScanLines``), any
other body one record, its bytes as sent (an ``application/json`` body is not
split, whatever it holds). The records are JSON for ring's own answers when
every one of them parses as JSON; otherwise they are stored as raw bytes.

A poll answer lists *items*: runs of consecutive records of one partition.
Each item carries PolarStreams' placement fields, filled from ring's: the
partition's ring token (``token``), the partition number (``rangeIndex``), the
group generation (``version``) and the offset of its first record
(``startOffset``). Two encodings:

* ``application/vnd.polar.consumermessage`` (PolarStreams' default), big-endian:
  ``uint16`` item count, then per item ``int64`` token, ``uint8`` range index
  (the partition number modulo 256: the field is one byte; the token tells
  partitions apart), ``uint32`` version, ``uint8`` topic length, the topic,
  ``int64`` start offset, ``int32`` payload length and the payload: one
  zstd frame (with its checksum) of records, each ``int64`` timestamp in
  microseconds, ``uint32`` body length, body.
* ``application/json`` (when the client's ``Accept`` is exactly that): an array
  of ``{topic, token, rangeIndex, version, startOffset, values}`` with the
  int64 fields as decimal strings; ``values`` holds each record as produced
  when it is JSON, else as a string (its UTF-8 text, or base64 when it is not
  UTF-8), so the answer is always valid JSON.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import orjson
import zstandard

CT_CONSUMER_MESSAGE = "application/vnd.polar.consumermessage"
CT_JSON = "application/json"
CT_NDJSON = "application/x-ndjson"

_ITEM_HEAD = struct.Struct(">qBI")  # token, range index, version
_RECORD_HEAD = struct.Struct(">qI")  # timestamp in microseconds, body length
_ITEMS_MAX = 0xFFFF  # the item count is a uint16
_ZSTD_LEVEL = 1  # fast: the answer is compressed once per poll, on the event loop


# --- produce ---------------------------------------------------------------------


def produce_values(content_type: str, body: bytes) -> tuple[list[bytes], bool]:
    """The records a produce body holds, and whether every one is JSON."""
    if content_type == CT_NDJSON:
        values = [line[:-1] if line.endswith(b"\r") else line for line in body.split(b"\n")]
        values = [v for v in values if v]
    else:
        values = [body] if body else []
    return values, bool(values) and all(_is_json(v) for v in values)


def _is_json(value: bytes) -> bool:
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return True


# --- poll answers ----------------------------------------------------------------


@dataclass
class Item:
    """A run of consecutive records of one partition, as one poll answer item."""

    topic: str
    partition: int
    token: int
    version: int
    start_offset: int
    # (timestamp ms, value, value is JSON); value None: a record without one, which PolarStreams'
    # formats cannot tell apart: an empty value in the binary answer, null in the JSON one
    records: list[tuple[int, bytes | None, bool]] = field(default_factory=list)


def items_of(records: Iterable[dict[str, Any]], token_of: Callable[[str, int], int], version: int) -> list[Item]:
    """Poll answer items from records (``topic``, ``partition``, ``offset``, ``timestamp``, ``value``,
    ``json``), in their order; a gap in the offsets or another partition starts a new item.
    ``token_of(topic, partition)`` is the partition's ring token."""
    items: list[Item] = []
    for r in records:
        last = items[-1] if items else None
        if last is None or last.topic != r["topic"] or last.partition != r["partition"] or \
                last.start_offset + len(last.records) != r["offset"]:
            last = Item(r["topic"], r["partition"], token_of(r["topic"], r["partition"]), version & 0xFFFFFFFF,
                        r["offset"])
            items.append(last)
        last.records.append((r["timestamp"], r["value"], bool(r["json"])))
    return items


def encode_binary(items: list[Item]) -> bytes:
    """``application/vnd.polar.consumermessage``."""
    # A poll answers at most FETCH_RECORDS_MAX records, so far fewer items than the count field holds;
    # dropping items here would acknowledge records the client never got.
    assert len(items) <= _ITEMS_MAX, len(items)
    compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True)
    out = [struct.pack(">H", len(items))]
    for item in items:
        topic = item.topic.encode("utf-8")
        payload = compressor.compress(b"".join(
            _RECORD_HEAD.pack(ts_ms * 1000, len(value or b"")) + (value or b"") for ts_ms, value, _ in item.records))
        out += [_ITEM_HEAD.pack(item.token, item.partition & 0xFF, item.version), struct.pack(">B", len(topic)),
                topic, struct.pack(">qi", item.start_offset, len(payload)), payload]
    return b"".join(out)


def _value(value: bytes | None, is_json: bool) -> Any:
    if value is None:
        return None
    if is_json:
        return orjson.Fragment(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii")


def encode_json(items: list[Item]) -> bytes:
    """The JSON answer (``Accept: application/json``)."""
    return orjson.dumps([{"topic": i.topic, "token": str(i.token), "rangeIndex": i.partition, "version": i.version,
                          "startOffset": str(i.start_offset), "values": [_value(v, j) for _, v, j in i.records]}
                         for i in items])
