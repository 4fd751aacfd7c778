"""The offsets topic's records: group events as msgpack, keyed by group name.

Each record of ``__offsets`` is one event of one group (``group.Event``): the
key is the group name (UTF-8), the value a msgpack array whose first two items
are the event kind and the format version::

    ["members", 1, ts_ms, generation, [member...], [[topic, partitions]...]]
    ["commit",  1, ts_ms, [[topic, partition, offset]...], reset]
    ["state",   1, ts_ms, generation, [member...], [[topic, partitions]...], [[topic, partition, offset]...]]
    ["drop",    1, ts_ms]
    ["forget",  1, ts_ms, [[topic, topic_id]...]]

    member = [id, [topic...], session_timeout_ms, client, reset, [[topic, partition]...]]

A record may carry the header ``ring-checkpoint``: the offset (decimal ASCII)
where the partition's latest complete checkpoint begins, so a new
coordinator reads the last record and replays from there instead of from the
start of the log. The topic ids of a ``commit``, ``members`` or ``state``
event (``group``: which topic of a name its offsets and assignment are for)
travel in the header ``ring-topic-ids``, a msgpack array
``[[[topic, id]...] committed for, [[topic, id]...] assigned for]``, so a
broker of a release without ids still reads the event itself. A record
without the header (written by such a release) has no ids: ``group`` says
what that means. ``decode`` raises ``CorruptBatch`` for anything it does not
recognise (a record written by a newer broker, or damage); the replay skips
such records and logs them rather than stopping.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ring.errors import CorruptBatch
from ring.groups.group import Commit, Drop, Event, Forget, Rebalance, MemberSpec, State

VERSION = 1
CHECKPOINT_HEADER = "ring-checkpoint"
IDS_HEADER = "ring-topic-ids"


def _member(m: MemberSpec) -> list[Any]:
    return [m.id, list(m.topics), m.session_timeout_ms, m.client, m.reset, [[t, p] for t, p in m.assignment]]


def encode(event: Event) -> bytes:
    if isinstance(event, Commit):
        doc: list[Any] = ["commit", VERSION, event.ts_ms, [list(o) for o in event.offsets], event.reset]
    elif isinstance(event, Rebalance):
        doc = ["members", VERSION, event.ts_ms, event.generation, [_member(m) for m in event.members],
               [list(x) for x in event.partitions]]
    elif isinstance(event, State):
        doc = ["state", VERSION, event.ts_ms, event.generation, [_member(m) for m in event.members],
               [list(x) for x in event.partitions], [list(o) for o in event.committed]]
    elif isinstance(event, Forget):
        doc = ["forget", VERSION, event.ts_ms, [list(x) for x in event.topics]]
    else:
        assert isinstance(event, Drop), event
        doc = ["drop", VERSION, event.ts_ms]
    return msgpack.packb(doc, use_bin_type=True)


def ids_header(event: Event) -> tuple[str, bytes] | None:
    """The ``ring-topic-ids`` header of ``event``, or None when it names no topic ids."""
    if isinstance(event, Commit):
        committed, assigned = event.ids, ()
    elif isinstance(event, Rebalance):
        committed, assigned = (), event.ids
    elif isinstance(event, State):
        committed, assigned = event.ids, event.assigned_ids
    else:
        return None
    if not committed and not assigned:
        return None
    return IDS_HEADER, msgpack.packb([[list(x) for x in committed], [list(x) for x in assigned]], use_bin_type=True)


def _ids(raw: Any) -> tuple[tuple[str, str], ...]:
    return _pairs(raw, "topic id")


def _header_ids(headers: list[tuple[str, bytes | None]] | None) -> tuple[tuple[tuple[str, str], ...], ...]:
    """(committed for, assigned for) from a record's ``ring-topic-ids`` header; empty without one."""
    raw = next((v for k, v in reversed(headers or ()) if k == IDS_HEADER), None)
    if raw is None:
        return (), ()
    try:
        doc = msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptBatch(f"offsets record: its topic ids are not msgpack: {exc}") from None
    if not isinstance(doc, list) or len(doc) != 2:
        raise CorruptBatch("offsets record: its topic ids are malformed")
    return _ids(doc[0]), _ids(doc[1])


def _int(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise CorruptBatch(f"offsets record: {what} is not a non-negative integer")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise CorruptBatch(f"offsets record: {what} is not a string")
    return v


def _pairs(raw: Any, second: str = "partition") -> tuple[tuple[str, Any], ...]:
    """[topic, partition] pairs, or [topic, topic id] pairs (``second``: "topic id")."""
    if not isinstance(raw, list):
        raise CorruptBatch("offsets record: a list was expected")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 2:
            raise CorruptBatch(f"offsets record: a [topic, {second}] pair was expected")
        out.append((_str(item[0], "topic"), _str(item[1], second) if second == "topic id" else _int(item[1], second)))
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


def decode(value: bytes, headers: list[tuple[str, bytes | None]] | None = None) -> Event:
    try:
        doc = msgpack.unpackb(value, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptBatch(f"offsets record is not msgpack: {exc}") from None
    if not isinstance(doc, list) or len(doc) < 3 or doc[1] != VERSION:
        raise CorruptBatch("offsets record of an unknown kind or version")
    kind, ts = doc[0], _int(doc[2], "timestamp")
    committed_ids, assigned_ids = _header_ids(headers)
    if kind == "commit" and len(doc) == 5:
        return Commit(_offsets(doc[3]), ts, bool(doc[4]), committed_ids)
    if kind == "members" and len(doc) == 6:
        return Rebalance(_int(doc[3], "generation"), _members(doc[4]), _pairs(doc[5]), ts, assigned_ids)
    if kind == "state" and len(doc) == 7:
        return State(_int(doc[3], "generation"), _members(doc[4]), _pairs(doc[5]), _offsets(doc[6]), ts,
                     committed_ids, assigned_ids)
    if kind == "drop" and len(doc) == 3:
        return Drop(ts)
    if kind == "forget" and len(doc) == 4:
        return Forget(_ids(doc[3]), ts)
    raise CorruptBatch(f"offsets record of an unknown kind {str(kind)[:20]!r}")


def checkpoint_of(headers: list[tuple[str, bytes | None]] | None) -> int | None:
    """The checkpoint offset a record points at, or None."""
    raw = next((v for k, v in reversed(headers or ()) if k == CHECKPOINT_HEADER), None)
    if raw is None or not raw.isdigit() or len(raw) > 19:
        return None
    return int(raw)
