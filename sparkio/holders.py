"""Splits by range: a backlog scan reads each range from the brokers holding it.

A partition of a topic with ``local_retention_bytes`` set keeps only a local
tail on its replicas; the offsets below are ranges spread over the whole
ring (``ring.ranges``). ``by_range`` cuts the planner's offset ranges at the
partition's range boundaries and gives each piece inside a range its
holders' URLs to read from first (spread so each broker gets about as many
bytes as the others: ``ring.ranges.readers.spread``), so the Spark tasks of
a backlog scan, and their bytes, spread over every broker instead of the
partition's three replicas. Pieces in the local tail keep the replicas'
URLs. The range calculator then cuts the pieces further as the query's
options ask; a piece never spans two ranges.
"""

from __future__ import annotations

from typing import Any, Iterable

from ring import errors
from sparkio.client import BrokerClient
from sparkio.ranges import OffsetRange
from ring.ranges.readers import spread


def by_range(client: BrokerClient, ranges: Iterable[OffsetRange]) -> list[OffsetRange]:
    ranges = list(ranges)
    topics: dict[str, dict[str, Any]] = {}
    urls: dict[str, str] | None = None
    given: dict[str, int] = {}
    out: list[OffsetRange] = []
    for r in ranges:
        doc = topics.get(r.topic)
        if doc is None:
            doc = topics[r.topic] = client.describe_topic(r.topic)
        local = _local_start(doc, r.partition)
        ranged = type(doc.get("local_retention_bytes")) is int and doc["local_retention_bytes"] >= 0
        if r.size == 0 or (r.start >= local if local is not None else not ranged):
            out.append(r)  # all in the local tail (or a topic without ranges)
            continue
        try:
            answer = client.ranges(r.topic, r.partition)
        except errors.RingError:
            out.append(r)  # any broker proxies a fetch in a range: the split still reads, through them
            continue
        if urls is None:
            urls = {b["name"]: str(b["client_url"]).rstrip("/") for b in client.cluster() or []
                    if b.get("client_url") and b.get("status") not in ("down", "removed")}
        out += _cut(r, spread(answer.get("ranges") or [], given), urls)
    return out


def _local_start(doc: dict[str, Any], partition: int) -> int | None:
    for p in doc.get("partitions") or []:
        if p.get("partition") == partition:
            v = p.get("local_start_offset")
            return v if type(v) is int else None
    return None


def _cut(r: OffsetRange, held: list[tuple[int, int, list[str]]], urls: dict[str, str]) -> list[OffsetRange]:
    """``r`` cut at the boundaries of the ranges it crosses; pieces outside every range keep its URLs."""
    out, start = [], r.start
    for base, end, holders in held:
        if end <= start or start >= r.end:
            continue
        if base > start:  # offsets before this range: the replicas'
            stop = min(base, r.end)
            out.append(OffsetRange(r.topic, r.partition, start, stop, r.urls))
            start = stop
            if start >= r.end:
                break
        stop = min(end, r.end)
        first = tuple(urls[h] for h in holders if h in urls)
        out.append(OffsetRange(r.topic, r.partition, start, stop, tuple(dict.fromkeys(first + r.urls))))
        start = stop
    if start < r.end:
        out.append(OffsetRange(r.topic, r.partition, start, r.end, r.urls))
    return out
