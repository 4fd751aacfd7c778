"""The driver side of a read: which partitions, and which offsets of each.

The planner asks the cluster for each partition's earliest offset and high
watermark (consumers only ever see offsets below it, so a range planned from
it never includes data a failover could take back), turns the query's
options (``startingOffsets``, timestamps, ...) into one ``OffsetRange`` per
partition, and hands those to ``ranges.split_ranges``. Streaming queries use
the same pieces with offsets in Kafka's JSON shape, ``{"topic": {"0": 42}}``:
Spark stores that dict in the checkpoint and gives it back through JSON, so
partition numbers are strings there and ints everywhere else. Beside the
topics the dict holds ``"@created_ms": {"topic": ms}``, when each topic read
was created, and ``"@topic_id": {"topic": id}``, its id: a topic deleted and
created again under a query has the same name and offsets that start over,
and only its id (or its creation time, in offsets written before ids) tells
the two apart (``sparkio.stream_offsets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ring import errors
from ring.catalog import INTERNAL_TOPICS
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
    created_ms: int = 0  # when the topic was created: which incarnation of the name this is
    topic_id: str = ""  # the incarnation's id ("": a broker without topic ids)


def _replica_urls(doc: Mapping[str, Any], by_name: Mapping[str, str]) -> tuple[str, ...]:
    names = [doc.get("leader"), *(doc.get("replicas") or [])]
    return tuple(dict.fromkeys(by_name[n] for n in names if n in by_name))


def _broker_urls(client: BrokerClient) -> dict[str, str]:
    brokers = client.cluster() or []
    return {b["name"]: str(b["client_url"]).rstrip("/") for b in brokers
            if b.get("client_url") and b.get("status", "normal") not in ("removed", "down")}


def topics_of(client: BrokerClient, sub: Subscription) -> list[str]:
    if sub.pattern is not None:  # as Kafka's: internal topics never match
        return [t for t in client.list_topics() if sub.matches(t) and t not in INTERNAL_TOPICS]
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
        created, topic_id = int(doc.get("created_ms") or 0), str(doc.get("id") or "")
        asked: dict[str, dict[str, Any]] = {}
        for p in doc.get("partitions", []):
            if p.get("earliest_offset") is None or p.get("high_watermark") is None:
                p = _from_replica(client, topic, p, by_name, asked)
            key = (topic, int(p["partition"]))
            out[key] = PartitionState(topic, key[1], int(p["earliest_offset"]), int(p["high_watermark"]),
                                      _replica_urls(p, by_name), created, topic_id)
    if sub.assign:
        missing = [tp for tp in sub.assign if tp not in out and not missing_ok]
        if missing:
            raise errors.UnknownPartition(f"assigned partitions do not exist: {missing}")
        out = {tp: st for tp, st in out.items() if tp in set(sub.assign)}
    return dict(sorted(out.items()))


def _from_replica(client: BrokerClient, topic: str, p: Mapping[str, Any], by_name: Mapping[str, str],
                  asked: dict[str, dict[str, Any]]) -> Mapping[str, Any]:
    """A partition's description by one of its replicas: a broker holding none describes its offsets as
    null."""
    for url in _replica_urls(p, by_name):
        if url not in asked:
            asked[url] = client.describe_topic(topic, prefer=[url])
        for q in asked[url].get("partitions", []):
            if q.get("partition") == p.get("partition") and q.get("high_watermark") is not None:
                return q
    raise errors.Unavailable(f"no replica of {topic}/{p.get('partition')} described its offsets", topic=topic)


@dataclass(frozen=True)
class Bound:
    """One end of a query as Kafka resolves it: the first of a timestamp for
    every partition, timestamps per partition, offsets (the others are ignored)."""

    option: str  # the option in effect, for messages
    timestamp_ms: int | None
    by_timestamp: Mapping[PartitionKey, int]
    offsets: OffsetSpec
    starting: bool  # a start: no match for a timestamp follows startingOffsetsByTimestampStrategy

    def named(self) -> set[PartitionKey] | None:
        """The partitions the option in effect names, when it must name every one."""
        if self.timestamp_ms is not None:
            return None
        if self.by_timestamp:
            return set(self.by_timestamp)
        return {tp for tp, _ in self.offsets.per_partition} or None


def start_bound(opts: ReadOptions) -> Bound:
    kind = ("startingTimestamp" if opts.starting_timestamp_ms is not None else
            "startingOffsetsByTimestamp" if opts.starting_by_timestamp else "startingOffsets")
    return Bound(kind, opts.starting_timestamp_ms, dict(opts.starting_by_timestamp), opts.starting, True)


def end_bound(opts: ReadOptions) -> Bound:
    assert opts.ending is not None
    kind = ("endingTimestamp" if opts.ending_timestamp_ms is not None else
            "endingOffsetsByTimestamp" if opts.ending_by_timestamp else "endingOffsets")
    return Bound(kind, opts.ending_timestamp_ms, dict(opts.ending_by_timestamp), opts.ending, False)


def _point(client: BrokerClient, st: PartitionState, bound: Bound, strategy: str) -> int:
    """Where ``bound`` puts partition ``st``. A timestamp later than every
    record: an end is the high watermark; a start fails, or with the strategy
    ``latest`` is the high watermark (Kafka's startingOffsetsByTimestampStrategy)."""
    key = (st.topic, st.partition)
    ts = bound.timestamp_ms if bound.timestamp_ms is not None else bound.by_timestamp.get(key)
    if ts is not None:
        found = client.offset_for_timestamp(st.topic, st.partition, ts, prefer=st.urls)
        # A broker answers "no record that late" with its high watermark; one
        # produced since the planner looked is not part of this query either.
        found = None if found is None or int(found) >= st.latest else int(found)
        if found is None and bound.starting and strategy == "error":
            raise errors.BadRequest(
                f"option {bound.option}: no record of {st.topic}/{st.partition} has a timestamp at or after {ts} "
                "(set startingOffsetsByTimestampStrategy=latest to start such partitions at the latest offset)")
        return st.latest if found is None else max(found, st.earliest)
    off = bound.offsets.for_partition(*key)
    if off == EARLIEST:
        return st.earliest
    if off == LATEST:
        return st.latest
    return off


def _check_named_partitions(states: Mapping[PartitionKey, PartitionState], *bounds: Bound) -> None:
    """Kafka's rule: offsets or timestamps given per partition name every partition the query reads."""
    for bound in bounds:
        named = bound.named()
        if named is None or named == set(states):
            continue
        missing, unknown = sorted(set(states) - named), sorted(named - set(states))
        what = (f"misses {_partitions(missing)}" if missing else "") + (" and " if missing and unknown else "") + \
            (f"names {_partitions(unknown)}, which do not exist" if unknown else "")
        raise errors.BadRequest(f"option {bound.option} must name every partition the query reads "
                                f"(-2 earliest, -1 latest): it {what}")


def _partitions(tps: list[PartitionKey]) -> str:
    shown = ", ".join(f"{t}/{p}" for t, p in tps[:10])
    return shown + (f" and {len(tps) - 10} more" if len(tps) > 10 else "")


def batch_ranges(client: BrokerClient, opts: ReadOptions) -> list[OffsetRange]:
    """One range per partition for a batch query (empty ranges included)."""
    states = partition_states(client, opts.subscription, missing_ok=False)
    start_at, end_at = start_bound(opts), end_bound(opts)
    _check_named_partitions(states, start_at, end_at)
    out = []
    for key, st in states.items():
        start = _point(client, st, start_at, opts.starting_strategy)
        end = _point(client, st, end_at, opts.starting_strategy)
        if end > st.latest:
            raise errors.BadRequest(
                f"option {end_at.option}: {end} of {st.topic}/{st.partition} is beyond its high watermark {st.latest}")
        if start > st.latest:
            raise errors.BadRequest(f"option {start_at.option}: {start} of {st.topic}/{st.partition} is beyond "
                                    f"its high watermark {st.latest}")
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


# --- streaming offsets: {"topic": {"0": 42}, "@created_ms": {"topic": ms}} ----------------

CREATED = "@created_ms"  # not a topic name: "@" is not allowed in one
TOPIC_ID = "@topic_id"


def to_json_offsets(offsets: Mapping[PartitionKey, int], created_ms: Mapping[str, int] | None = None,
                    topic_ids: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    marks = {t: int(ms) for t, ms in sorted((created_ms or {}).items()) if t in out}
    ids = {t: str(i) for t, i in sorted((topic_ids or {}).items()) if t in out and i}
    if marks:
        out[CREATED] = marks
    if ids:
        out[TOPIC_ID] = ids
    return out


def from_json_offsets(doc: Mapping[str, Mapping[Any, Any]] | None) -> dict[PartitionKey, int]:
    out: dict[PartitionKey, int] = {}
    for t, parts in (doc or {}).items():
        if t in (CREATED, TOPIC_ID):
            continue
        for p, off in parts.items():
            out[(str(t), int(p))] = int(off)
    return out


def created_of(doc: Mapping[str, Any] | None) -> dict[str, int]:
    """When each topic of a streaming offset was created (absent in offsets written without it)."""
    return {str(t): int(ms) for t, ms in ((doc or {}).get(CREATED) or {}).items()}


def ids_of(doc: Mapping[str, Any] | None) -> dict[str, str]:
    """The id of each topic of a streaming offset (absent in offsets written without ids)."""
    return {str(t): str(i) for t, i in ((doc or {}).get(TOPIC_ID) or {}).items()}


def created_ms(states: Iterable[PartitionState]) -> dict[str, int]:
    return {st.topic: st.created_ms for st in states}


def topic_ids(states: Iterable[PartitionState]) -> dict[str, str]:
    return {st.topic: st.topic_id for st in states if st.topic_id}


def initial_offsets(client: BrokerClient, opts: ReadOptions) -> dict[str, Any]:
    """Where a new stream starts: startingOffsets/startingTimestamp resolved now, as a JSON offset."""
    states = partition_states(client, opts.subscription, missing_ok=True)
    start_at = start_bound(opts)
    _check_named_partitions(states, start_at)
    out = {}
    for key, st in states.items():
        start = _point(client, st, start_at, opts.starting_strategy)
        if start > st.latest:
            raise errors.BadRequest(f"option {start_at.option}: {start} of {st.topic}/{st.partition} is beyond "
                                    f"its high watermark {st.latest}")
        out[key] = resolve_loss(st, start, st.latest, opts.fail_on_data_loss)
    return to_json_offsets(out, created_ms(states.values()), topic_ids(states.values()))


def stream_ranges(client: BrokerClient, opts: ReadOptions, start_doc: Mapping[str, Any],
                  end_doc: Mapping[str, Any]) -> list[OffsetRange]:
    """Ranges of one micro-batch. A partition starts at its earliest offset when
    it is new in ``end`` (it appeared after the previous batch was planned), or
    when its topic was created again in between, or its offset went back (a
    topic created again, seen by a query whose offsets do not say when its
    topics were created): the planner let those through only with failOnDataLoss=false."""
    start, end = from_json_offsets(start_doc), from_json_offsets(end_doc)
    was, now = created_of(start_doc), created_of(end_doc)
    states = partition_states(client, opts.subscription, missing_ok=True) if end else {}
    out = []
    for key, stop in sorted(end.items()):
        st = states.get(key)
        urls = st.urls if st else ()
        same = key in start and was.get(key[0]) in (None, now.get(key[0])) and start[key] <= stop
        begin = start[key] if same else (st.earliest if st else 0)
        if st is not None:
            begin = resolve_loss(st, begin, stop, opts.fail_on_data_loss)
        if stop > begin:
            out.append(OffsetRange(key[0], key[1], begin, stop, urls))
    return out


def latest_offsets(states: Iterable[PartitionState]) -> dict[PartitionKey, int]:
    return {(st.topic, st.partition): st.latest for st in states}
