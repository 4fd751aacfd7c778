"""The driver side of a read: which partitions, and which offsets of each.

The planner asks the cluster for each partition's earliest offset and high
watermark (consumers only ever see offsets below it, so a range planned from
it never includes data a failover could take back), turns the query's
options (``startingOffsets``, timestamps, ...) into one ``OffsetRange`` per
partition, and hands those to ``ranges.split_ranges``. Streaming queries use
the same pieces with offsets in Kafka's JSON shape, ``{"topic": {"0": 42}}``:
Spark stores that dict in the checkpoint and gives it back through JSON, so
partition numbers are strings there and ints everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ring import errors
from sparkio.client import BrokerClient
from sparkio.fetch import data_loss
from sparkio.options import EARLIEST, LATEST, OffsetSpec, ReadOptions, Subscription
from sparkio.ranges import OffsetRange

PartitionKey = tuple[str, int]


@dataclass(frozen=True)
class PartitionState:
    topic: str
    partition: int
    earliest: int
    latest: int  # the high watermark
    urls: tuple[str, ...] = ()  # replicas' client URLs, leader first, when known


def _replica_urls(doc: Mapping[str, Any], by_name: Mapping[str, str]) -> tuple[str, ...]:
    names = [doc.get("leader"), *(doc.get("replicas") or [])]
    return tuple(dict.fromkeys(by_name[n] for n in names if n in by_name))


def _broker_urls(client: BrokerClient) -> dict[str, str]:
    brokers = client.cluster() or []
    return {b["name"]: str(b["client_url"]).rstrip("/") for b in brokers
            if b.get("client_url") and b.get("status", "normal") not in ("removed", "down")}


def topics_of(client: BrokerClient, sub: Subscription) -> list[str]:
    if sub.pattern is not None:
        return [t for t in client.list_topics() if sub.matches(t)]
    if sub.assign:
        return sorted({t for t, _ in sub.assign})
    return list(sub.topics)


def partition_states(client: BrokerClient, sub: Subscription, *, missing_ok: bool) -> dict[PartitionKey, PartitionState]:
    """Every partition the subscription reads, with its watermarks.

    ``missing_ok``: a named topic that does not exist yet has no partitions
    (streams wait for it) instead of being an error (batch reads).
    """
    by_name = _broker_urls(client)
    out: dict[PartitionKey, PartitionState] = {}
    for topic in topics_of(client, sub):
        try:
            doc = client.describe_topic(topic)
        except errors.NotFound:
            if missing_ok or sub.pattern is not None:
                continue  # a pattern match deleted since the listing
            raise errors.UnknownTopic(f"topic {topic!r} does not exist", topic=topic) from None
        for p in doc.get("partitions", []):
            key = (topic, int(p["partition"]))
            out[key] = PartitionState(topic, key[1], int(p["earliest_offset"]), int(p["high_watermark"]),
                                      _replica_urls(p, by_name))
    if sub.assign:
        missing = [tp for tp in sub.assign if tp not in out and not missing_ok]
        if missing:
            raise errors.UnknownPartition(f"assigned partitions do not exist: {missing}")
        out = {tp: st for tp, st in out.items() if tp in set(sub.assign)}
    return dict(sorted(out.items()))


def _point(client: BrokerClient, st: PartitionState, spec: OffsetSpec, timestamp_ms: int | None,
           by_timestamp: Mapping[PartitionKey, int]) -> int:
    """Kafka's precedence: a global timestamp, then per-partition timestamps,
    then offsets. A timestamp later than every record resolves to the high
    watermark (nothing yet)."""
    key = (st.topic, st.partition)
    ts = timestamp_ms if timestamp_ms is not None else by_timestamp.get(key)
    if ts is not None:
        found = client.offset_for_timestamp(st.topic, st.partition, ts, prefer=st.urls)
        return st.latest if found is None else min(max(int(found), st.earliest), st.latest)
    off = spec.for_partition(*key)
    if off == EARLIEST:
        return st.earliest
    if off == LATEST:
        return st.latest
    return off


def _check_named_partitions(states: Mapping[PartitionKey, PartitionState], opts: ReadOptions) -> None:
    named = [tp for tp, _ in opts.starting.per_partition]
    if opts.ending is not None:
        named += [tp for tp, _ in opts.ending.per_partition]
    named += [tp for tp, _ in opts.starting_by_timestamp + opts.ending_by_timestamp]
    unknown = sorted(set(tp for tp in named if tp not in states))
    if unknown:
        raise errors.BadRequest(f"offsets are given for partitions that do not exist: {unknown}")


def batch_ranges(client: BrokerClient, opts: ReadOptions) -> list[OffsetRange]:
    """One range per partition for a batch query (empty ranges included)."""
    assert opts.ending is not None
    states = partition_states(client, opts.subscription, missing_ok=False)
    _check_named_partitions(states, opts)
    start_ts, end_ts = dict(opts.starting_by_timestamp), dict(opts.ending_by_timestamp)
    out = []
    for key, st in states.items():
        start = _point(client, st, opts.starting, opts.starting_timestamp_ms, start_ts)
        end = _point(client, st, opts.ending, opts.ending_timestamp_ms, end_ts)
        if end > st.latest:
            raise errors.BadRequest(
                f"endingOffsets {end} of {st.topic}/{st.partition} is beyond its high watermark {st.latest}")
        if start > st.latest:
            raise errors.BadRequest(
                f"startingOffsets {start} of {st.topic}/{st.partition} is beyond its high watermark {st.latest}")
        start = resolve_loss(st, start, end, opts.fail_on_data_loss)
        if start > end:
            raise errors.BadRequest(
                f"{st.topic}/{st.partition}: the starting offset {start} is after the ending offset {end}")
        out.append(OffsetRange(st.topic, st.partition, start, end, st.urls))
    return out


def resolve_loss(st: PartitionState, start: int, end: int, fail_on_data_loss: bool) -> int:
    """A start below the earliest offset: fail, or skip what is gone."""
    if start >= st.earliest:
        return start
    if fail_on_data_loss:
        raise data_loss(st.topic, st.partition, start, min(st.earliest, end) if end > start else st.earliest,
                        st.earliest)
    return min(st.earliest, max(end, start))


# --- streaming offsets: {"topic": {"0": 42}} --------------------------------------


def to_json_offsets(offsets: Mapping[PartitionKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def from_json_offsets(doc: Mapping[str, Mapping[Any, Any]] | None) -> dict[PartitionKey, int]:
    out: dict[PartitionKey, int] = {}
    for t, parts in (doc or {}).items():
        for p, off in parts.items():
            out[(str(t), int(p))] = int(off)
    return out


def initial_offsets(client: BrokerClient, opts: ReadOptions) -> dict[PartitionKey, int]:
    """Where a new stream starts: startingOffsets/startingTimestamp resolved now."""
    states = partition_states(client, opts.subscription, missing_ok=True)
    _check_named_partitions(states, opts)
    start_ts = dict(opts.starting_by_timestamp)
    out = {}
    for key, st in states.items():
        start = _point(client, st, opts.starting, opts.starting_timestamp_ms, start_ts)
        if start > st.latest:
            raise errors.BadRequest(
                f"startingOffsets {start} of {st.topic}/{st.partition} is beyond its high watermark {st.latest}")
        out[key] = resolve_loss(st, start, st.latest, opts.fail_on_data_loss)
    return out


def stream_ranges(
    client: BrokerClient,
    opts: ReadOptions,
    start: Mapping[PartitionKey, int],
    end: Mapping[PartitionKey, int],
) -> list[OffsetRange]:
    """Ranges of one micro-batch. A partition new in ``end`` starts at its
    earliest offset (it appeared after the previous batch was planned)."""
    states = partition_states(client, opts.subscription, missing_ok=True) if end else {}
    out = []
    for key, stop in sorted(end.items()):
        st = states.get(key)
        urls = st.urls if st else ()
        if key in start:
            begin = start[key]
        else:
            begin = st.earliest if st else 0
        if st is not None:
            begin = resolve_loss(st, begin, stop, opts.fail_on_data_loss)
        if stop > begin:
            out.append(OffsetRange(key[0], key[1], begin, stop, urls))
    return out


def latest_offsets(states: Iterable[PartitionState]) -> dict[PartitionKey, int]:
    return {(st.topic, st.partition): st.latest for st in states}
