"""The offsets topic's records: group events as msgpack, keyed by group name.

Each record of ``__offsets`` is one event of one group (``group.Event``): the
key is the group name (UTF-8), the value a msgpack array whose first two items
are the event kind and the format version::

    ["members", 1, ts_ms, generation, [member...], [[topic, partitions]...]]
    ["commit",  1, ts_ms, [[topic, partition, offset]...], reset]
    ["state",   1, ts_ms, generation, [member...], [[topic, partitions]...], [[topic, partition, offset]...]]
    ["drop",    1, ts_ms]

    member = [id, [topic...], session_timeout_ms, client, reset, [[topic, partition]...]]

A record may carry the header ``ring-checkpoint``: the offset (decimal ASCII)
where the partition's latest complete checkpoint begins, so a new
coordinator reads the last record and replays from there instead of from the
start of the log. ``decode`` raises ``CorruptBatch`` for anything it does not
recognise (a record written by a newer broker, or damage); the replay skips
such records and logs them rather than stopping.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ring.errors import CorruptBatch
from ring.groups.group import Commit, Drop, Event, Members, MemberSpec, State

VERSION = 1
CHECKPOINT_HEADER = "ring-checkpoint"


def _member(m: MemberSpec) -> list[Any]:
    return [m.id, list(m.topics), m.session_timeout_ms, m.client, m.reset, [[t, p] for t, p in m.assignment]]


def encode(event: Event) -> bytes:
    if isinstance(event, Commit):
        doc: list[Any] = ["commit", VERSION, event.ts_ms, [list(o) for o in event.offsets], event.reset]
    elif isinstance(event, Members):
        doc = ["members", VERSION, event.ts_ms, event.generation, [_member(m) for m in event.members],
               [list(x) for x in event.partitions]]
    elif isinstance(event, State):
        doc = ["state", VERSION, event.ts_ms, event.generation, [_member(m) for m in event.members],
               [list(x) for x in event.partitions], [list(o) for o in event.committed]]
    else:
        assert isinstance(event, Drop), event
        doc = ["drop", VERSION, event.ts_ms]
    return msgpack.packb(doc, use_bin_type=True)


def _int(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise CorruptBatch(f"offsets record: {what} is not a non-negative integer")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise CorruptBatch(f"offsets record: {what} is not a string")
    return v


def _pairs(raw: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(raw, list):
        raise CorruptBatch("offsets record: a list was expected")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 2:
            raise CorruptBatch("offsets record: a [topic, number] pair was expected")
        out.append((_str(item[0], "topic"), _int(item[1], "partition")))
    return tuple(out)


def _offsets(raw: Any) -> tuple[tuple[str, int, int], ...]:
    if not isinstance(raw, list):
        raise CorruptBatch("offsets record: a list of offsets was expected")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 3:
            raise CorruptBatch("offsets record: a [topic, partition, offset] triple was expected")
        out.append((_str(item[0], "topic"), _int(item[1], "partition"), _int(item[2], "offset")))
    return tuple(out)


def _members(raw: Any) -> tuple[MemberSpec, ...]:
    if not isinstance(raw, list):
        raise CorruptBatch("offsets record: a list of members was expected")
    out = []
    for m in raw:
        if not isinstance(m, list) or len(m) != 6 or not isinstance(m[1], list):
            raise CorruptBatch("offsets record: a member is malformed")
        client = None if m[3] is None else _str(m[3], "client")
        out.append(MemberSpec(_str(m[0], "member id"), tuple(_str(t, "topic") for t in m[1]),
                              _int(m[2], "session timeout"), client, _str(m[4], "reset policy"), _pairs(m[5])))
    return tuple(out)


def decode(value: bytes) -> Event:
    try:
        doc = msgpack.unpackb(value, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptBatch(f"offsets record is not msgpack: {exc}") from None
    if not isinstance(doc, list) or len(doc) < 3 or doc[1] != VERSION:
        raise CorruptBatch("offsets record of an unknown kind or version")
    kind, ts = doc[0], _int(doc[2], "timestamp")
    if kind == "commit" and len(doc) == 5:
        return Commit(_offsets(doc[3]), ts, bool(doc[4]))
    if kind == "members" and len(doc) == 6:
        return Members(_int(doc[3], "generation"), _members(doc[4]), _pairs(doc[5]), ts)
    if kind == "state" and len(doc) == 7:
        return State(_int(doc[3], "generation"), _members(doc[4]), _pairs(doc[5]), _offsets(doc[6]), ts)
    if kind == "drop" and len(doc) == 3:
        return Drop(ts)
    raise CorruptBatch(f"offsets record of an unknown kind {str(kind)[:20]!r}")


def checkpoint_of(headers: list[tuple[str, bytes | None]] | None) -> int | None:
    """The checkpoint offset a record points at, or None."""
    raw = next((v for k, v in reversed(headers or ()) if k == CHECKPOINT_HEADER), None)
    if raw is None or not raw.isdigit() or len(raw) > 19:
        return None
    return int(raw)
