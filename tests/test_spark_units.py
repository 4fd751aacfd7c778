"""sparkio's pure parts, no Spark and no broker: the offset-range calculator,
the per-trigger rate limit, option parsing, streaming offsets through JSON,
and decoding fetch answers made of real stored batches."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring.errors import BadRequest
from ring.log import batch as batchfmt
from sparkio.client import CT_BATCHES, Response
from sparkio.fetch import decode_answer
from sparkio.options import EARLIEST, LATEST, parse_brokers, parse_read_options, parse_write_options
from sparkio.planner import PartitionState, created_of, from_json_offsets, to_json_offsets
from sparkio.ranges import OffsetRange, rate_limit, split_ranges

BOUNDED = settings(max_examples=150, deadline=None)


def R(p: int, start: int, end: int, topic: str = "t") -> OffsetRange:
    return OffsetRange(topic, p, start, end)


# --- the range calculator ------------------------------------------------------------


def test_no_options_keeps_one_split_per_nonempty_partition():
    ranges = [R(0, 0, 10), R(1, 5, 5), R(2, 3, 4)]
    assert split_ranges(ranges) == [R(0, 0, 10), R(2, 3, 4)]


def test_kafka_examples():
    # KafkaOffsetRangeCalculatorSuite: one range of 4 records, minPartitions 3.
    assert split_ranges([R(0, 1, 5)], min_partitions=3) == [R(0, 1, 2), R(0, 2, 3), R(0, 3, 5)]
    # Enough partitions already: nothing is cut.
    assert split_ranges([R(0, 1, 5), R(1, 1, 5)], min_partitions=2) == [R(0, 1, 5), R(1, 1, 5)]
    # Small ranges stay whole; the big one takes the rest of the proportion.
    out = split_ranges([R(0, 0, 1), R(1, 0, 1), R(2, 0, 100)], min_partitions=5)
    assert out[:2] == [R(0, 0, 1), R(1, 0, 1)]
    assert [s.size for s in out[2:]] == [33, 33, 34]


def test_max_records_cuts_evenly():
    assert split_ranges([R(0, 0, 10)], max_records=4) == [R(0, 0, 3), R(0, 3, 6), R(0, 6, 10)]
    assert split_ranges([R(0, 0, 8)], max_records=4) == [R(0, 0, 4), R(0, 4, 8)]


def test_rounding_shortfall_is_made_up():
    # Kafka's proportional rounding alone gives 3 splits here, not 4.
    out = split_ranges([R(0, 0, 10), R(1, 0, 10), R(2, 0, 10)], min_partitions=4)
    assert len(out) >= 4


ranges_st = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 200)), min_size=0, max_size=8)


@BOUNDED
@given(ranges_st, st.one_of(st.none(), st.integers(1, 40)), st.one_of(st.none(), st.integers(1, 60)))
def test_split_invariants(spec, min_partitions, max_records):
    ranges = [R(i, start, start + size) for i, (start, size) in enumerate(spec)]
    out = split_ranges(ranges, min_partitions, max_records)
    total = sum(r.size for r in ranges)
    # Exact cover, in order, contiguous per partition, nothing empty.
    by_partition: dict[int, list[OffsetRange]] = {}
    for s in out:
        assert s.size > 0
        by_partition.setdefault(s.partition, []).append(s)
    for r in ranges:
        pieces = by_partition.get(r.partition, [])
        if r.size == 0:
            assert pieces == []
            continue
        assert pieces[0].start == r.start and pieces[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    assert sum(s.size for s in out) == total
    if max_records is not None:
        assert max(s.size for s in out or [R(0, 0, 0)]) <= max_records
    if min_partitions is not None:
        assert len(out) >= min(min_partitions, total)
    if min_partitions is None and max_records is None:
        assert len(out) == sum(1 for r in ranges if r.size)


# --- the rate limit ------------------------------------------------------------------


def test_rate_limit_examples():
    start = {("t", 0): 0, ("t", 1): 0}
    assert rate_limit(start, {("t", 0): 1000, ("t", 1): 1}, 2) == {("t", 0): 1, ("t", 1): 1}
    assert rate_limit(start, {("t", 0): 30, ("t", 1): 10}, 8) == {("t", 0): 6, ("t", 1): 2}
    assert rate_limit(start, {("t", 0): 3, ("t", 1): 1}, 100) == {("t", 0): 3, ("t", 1): 1}


@BOUNDED
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 500)), min_size=1, max_size=10),
       st.integers(1, 700))
def test_rate_limit_invariants(spec, budget):
    start = {("t", i): s for i, (s, _) in enumerate(spec)}
    latest = {("t", i): s + n for i, (s, n) in enumerate(spec)}
    out = rate_limit(start, latest, budget)
    backlog = sum(n for _, n in spec)
    assert sum(out[tp] - start[tp] for tp in start) == min(budget, backlog)
    assert all(start[tp] <= out[tp] <= latest[tp] for tp in start)
    waiting = [tp for tp in start if latest[tp] > start[tp]]
    if budget >= len(waiting):
        assert all(out[tp] > start[tp] for tp in waiting), "a partition was starved"


# --- options ---------------------------------------------------------------------------


def test_brokers_parsing():
    assert parse_brokers("http://a:1/, b:2 ,,") == ("http://a:1", "http://b:2")
    with pytest.raises(BadRequest):
        parse_brokers(" , ")
    with pytest.raises(BadRequest):
        parse_brokers("ftp://x")


def test_read_options_case_insensitive_with_kafka_json():
    o = parse_read_options({
        "BROKERS": "127.0.0.1:1", "Subscribe": "a,b", "STARTINGOFFSETS": '{"a": {"0": 23, "1": -2}}',
        "endingOffsets": '{"b": {"2": -1}}', "minPartitions": "3", "failOnDataLoss": "FALSE",
        "includeHeaders": "true", "somethingElse": "ignored",
    }, streaming=False)
    assert o.subscription.topics == ("a", "b")
    assert o.starting.for_partition("a", 0) == 23
    assert o.starting.for_partition("a", 1) == EARLIEST
    assert o.ending.for_partition("b", 2) == LATEST
    assert (o.min_partitions, o.fail_on_data_loss, o.include_headers) == (3, False, True)


def test_streaming_defaults_and_batch_only_options():
    o = parse_read_options({"brokers": "h:1", "subscribePattern": "c.*", "maxOffsetsPerTrigger": "10"},
                           streaming=True)
    assert o.starting.default == LATEST and o.ending is None and o.max_offsets_per_trigger == 10
    # Kafka's pattern is found anywhere in the name (Scala's findFirstIn), not matched whole.
    assert o.subscription.matches("clicks") and o.subscription.matches("xclicks")
    assert not o.subscription.matches("alpha")
    with pytest.raises(BadRequest, match="endingOffsets is for batch"):
        parse_read_options({"brokers": "h:1", "subscribe": "t", "endingOffsets": "latest"}, streaming=True)


@pytest.mark.parametrize("opts, match", [
    ({"subscribe": "t", "assign": '{"t": [0]}'}, "exactly one"),
    ({}, "exactly one"),
    ({"subscribe": "t", "startingOffsets": "soon"}, "JSON"),
    ({"subscribe": "t", "startingOffsets": '{"other": {"0": 1}}'}, "does not read"),
    ({"subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "not allowed"),
    ({"subscribe": "t", "endingOffsets": "earliest"}, "not allowed"),
    ({"subscribe": "t", "minPartitions": "0"}, ">= 1"),
    ({"subscribe": "t", "failOnDataLoss": "maybe"}, "true or false"),
    ({"subscribePattern": "("}, "regex"),
    ({"subscribePattern": "  "}, "pattern is empty"),
    ({"assign": '{"t": []}'}, "list of partitions"),
    ({"assign": "t:0"}, "assign: expected a JSON object"),
    ({"subscribe": " , "}, "no topic named"),
    ({"subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "integer"),
    ({"subscribe": "t", "startingOffsets": "latest"}, "startingOffsets: latest is not allowed for batch"),
    ({"subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, "-1 .latest. is not allowed for t/0 for batch"),
    ({"subscribe": "t", "startingOffsetsByTimestampStrategy": "first"}, "startingOffsetsByTimestampStrategy"),
    ({"subscribe": "t", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger .10. is higher"),
    ({"subscribe": "t", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
    ({"subscribe": "t", "kafkaConsumer.pollTimeoutMs": "-1"}, "kafkaConsumer.pollTimeoutMs"),
    ({"subscribe": "t", "fetchOffset.numRetries": "0"}, "fetchOffset.numRetries"),
    ({"subscribe": "t", "kafka.bootstrap.servers": "other:1"}, "name different brokers"),
])
def test_bad_read_options_name_the_option(opts, match):
    with pytest.raises(BadRequest, match=match):
        parse_read_options({"brokers": "h:1", **opts}, streaming=False)


def test_kafka_names_and_what_batch_queries_allow():
    o = parse_read_options({"kafka.bootstrap.servers": "a:1,b:2", "subscribe": "t", "kafka.group.id": "g",
                            "kafkaConsumer.pollTimeoutMs": "500", "maxTriggerDelay": "2s",
                            "startingOffsetsByTimestampStrategy": "LATEST"}, streaming=False)
    assert o.brokers == ("http://a:1", "http://b:2") and o.poll_timeout_ms == 500
    assert o.max_trigger_delay_ms == 2_000 and o.starting_strategy == "latest"
    assert parse_read_options({"brokers": "h:1", "subscribe": "t", "pollTimeoutMs": "7"},
                              streaming=False).poll_timeout_ms == 7
    # latest is refused only where startingOffsets is the option in effect, as Kafka does
    o = parse_read_options({"brokers": "h:1", "subscribe": "t", "startingOffsets": "latest",
                            "startingTimestamp": "5"}, streaming=False)
    assert o.starting_timestamp_ms == 5
    assert parse_read_options({"brokers": "h:1", "subscribe": "t", "startingOffsets": "latest"},
                              streaming=True).starting.default == LATEST


@pytest.mark.parametrize("text, ms", [("15m", 900_000), ("10s", 10_000), ("250ms", 250), ("2h", 7_200_000),
                                      ("1d", 86_400_000), ("500", 500), (" 3 min ", 180_000)])
def test_durations_as_spark_writes_them(text, ms):
    from sparkio.options import parse_duration_ms

    assert parse_duration_ms("maxTriggerDelay", text) == ms


def test_assign_and_write_options():
    o = parse_read_options({"brokers": "h:1", "assign": '{"t": [2, 0, 2]}'}, streaming=False)
    assert o.subscription.assign == (("t", 0), ("t", 2))
    w = parse_write_options({"Brokers": "h:1,h:2", "TOPIC": "out"})
    assert w.brokers == ("http://h:1", "http://h:2") and w.topic == "out"
    assert parse_write_options({"kafka.bootstrap.servers": "h:3", "topic": " t "}) == \
        parse_write_options({"brokers": "http://h:3", "topic": "t"})


def test_stream_offsets_survive_json():
    offsets = {("a", 0): 5, ("a", 10): 7, ("b", 1): 0}
    doc = json.loads(json.dumps(to_json_offsets(offsets)))
    assert doc == {"a": {"0": 5, "10": 7}, "b": {"1": 0}}
    assert from_json_offsets(doc) == offsets
    doc = json.loads(json.dumps(to_json_offsets(offsets, {"a": 11, "b": 12, "gone": 13})))
    assert doc["@created_ms"] == {"a": 11, "b": 12} and from_json_offsets(doc) == offsets
    assert created_of(doc) == {"a": 11, "b": 12} and created_of({"a": {"0": 1}}) == {}


# --- decoding fetch answers ---------------------------------------------------------------


def _stored(base: int, n: int, ts: int = 1_000) -> bytes:
    buf = batchfmt.encode([(ts + i, b"k%d" % i, b"v%d" % (base + i), [("h", b"x"), ("h", b"y")] if i % 2 else None)
                           for i in range(n)], now_ms=ts)
    batchfmt.stamp(buf, 0, base, 1)
    return bytes(buf)


def test_decode_answer_trims_both_ends():
    body = _stored(0, 5) + _stored(5, 5) + _stored(10, 5)
    resp = Response(200, {"content-type": CT_BATCHES}, body, "http://x")
    pieces = decode_answer(resp, 3, 12)
    assert [(p.first, p.last) for p in pieces] == [(3, 4), (5, 9), (10, 11)]
    recs = [r for p in pieces for r in p.records()]
    assert [r.offset for r in recs] == list(range(3, 12))
    assert recs[0].value == b"v3" and recs[0].headers == [("h", b"x"), ("h", b"y")] and recs[1].headers is None
    assert recs[0].timestamp == 1_003


def test_decode_answer_rejects_a_damaged_batch():
    body = bytearray(_stored(0, 3))
    body[-1] ^= 0xFF
    resp = Response(200, {"content-type": CT_BATCHES}, bytes(body), "http://x")
    with pytest.raises(Exception, match="CRC"):
        decode_answer(resp, 0, 3)


def test_arrow_batches_are_built_column_by_column():
    from sparkio.schema import arrow_schema, spark_schema, to_arrow

    tomb = batchfmt.encode([(2_000, None, None, [("a", b"1"), ("a", None)])], now_ms=2_000)
    batchfmt.stamp(tomb, 0, 15, 1)
    body = _stored(0, 5) + _stored(5, 5) + _stored(10, 5) + bytes(tomb)
    pieces = decode_answer(Response(200, {"content-type": CT_BATCHES}, body, "http://x"), 3, 16)
    batch = to_arrow(pieces, "t", 4, arrow_schema(spark_schema(True)), True).to_pydict()
    assert batch["offset"] == list(range(3, 16)) and batch["partition"] == [4] * 13 and batch["topic"] == ["t"] * 13
    assert batch["value"][:2] == [b"v3", b"v4"] and batch["value"][-1] is None
    assert [round(t.timestamp() * 1000) for t in batch["timestamp"][:3]] == [1_003, 1_004, 1_000]
    assert batch["headers"][0] == [{"key": "h", "value": b"x"}, {"key": "h", "value": b"y"}]
    assert batch["headers"][1] is None
    assert batch["headers"][-1] == [{"key": "a", "value": b"1"}, {"key": "a", "value": None}]



_header_pair = st.tuples(st.text(min_size=1, max_size=4), st.none() | st.binary(max_size=4))
_record = st.tuples(
    st.integers(0, 2**62 - 1) | st.integers(1_700_000_000_000, 1_700_000_009_999),  # ms; µs past int64 overflow
    st.none() | st.binary(max_size=8),
    st.none() | st.binary(max_size=300),  # None: a tombstone, not b""
    st.none() | st.lists(_header_pair, min_size=1, max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(st.tuples(st.lists(_record, min_size=1, max_size=20), st.sampled_from(range(3))),
                        min_size=1, max_size=4),
       cut=st.tuples(st.integers(0, 79), st.integers(1, 80)), include_headers=st.booleans())
def test_arrow_batches_hold_every_record_of_the_answer_as_stored(batches, cut, include_headers):
    """Each row of the Arrow batch of a fetch answer's pieces is the record produced at its
    offset: none lost, none repeated, every column as given (keys, values, headers in order,
    timestamps to the µs, tombstones null), whatever the codec and wherever the answer is cut."""
    import pyarrow as pa

    from sparkio.schema import arrow_schema, spark_schema, to_arrow

    body, produced = b"", []
    for records, codec in batches:
        buf = batchfmt.encode(records, now_ms=0, codec=codec)
        batchfmt.stamp(buf, 0, len(produced), 1)
        body += bytes(buf)
        produced += records
    start = min(cut[0], len(produced) - 1)
    end = min(max(cut[1], start + 1), len(produced))
    pieces = decode_answer(Response(200, {"content-type": CT_BATCHES}, body, "http://x"), start, end)
    schema_pa = arrow_schema(spark_schema(include_headers))
    if any(ts * 1000 >= 2**63 for ts, *_ in produced[start:end]):
        with pytest.raises(OverflowError):
            to_arrow(pieces, "t", 2, schema_pa, include_headers)
        return
    got = to_arrow(pieces, "t", 2, schema_pa, include_headers)
    assert got.schema == schema_pa
    want = {"key": [], "value": [], "topic": [], "partition": [], "offset": [], "timestamp": [],
            "timestampType": [], **({"headers": []} if include_headers else {})}
    for offset in range(start, end):
        ts, key, value, headers = produced[offset]
        for name, v in (("key", key), ("value", value), ("topic", "t"), ("partition", 2), ("offset", offset),
                        ("timestamp", ts * 1000), ("timestampType", 0)):
            want[name].append(v)
        if include_headers:
            want["headers"].append([{"key": k, "value": v} for k, v in headers] if headers else None)
    want_batch = pa.RecordBatch.from_pydict(
        {**want, "timestamp": pa.array(want["timestamp"], schema_pa.field("timestamp").type)}, schema=schema_pa)
    assert got.equals(want_batch), (got.to_pydict(), want)


# --- where a stream's next batch ends ---------------------------------------------------------


def _states(*specs, created=1) -> dict:
    """(topic, partition, earliest, latest) -> PartitionState, all of one creation time."""
    return {(t, p): PartitionState(t, p, e, hw, (), created) for t, p, e, hw in specs}


def test_next_batch_reads_on_from_the_previous_end():
    from sparkio.stream_offsets import plan_next

    start = to_json_offsets({("t", 0): 10, ("t", 1): 4}, {"t": 1})
    nxt = plan_next(start, _states(("t", 0, 0, 25), ("t", 1, 0, 4), ("t", 2, 0, 3)), fail_on_data_loss=True)
    assert nxt.begin == {("t", 0): 10, ("t", 1): 4, ("t", 2): 0} and nxt.backlog() == 18 and not nxt.lost
    # an older view of a watermark (below what was read) never plans backwards
    stale = _states(("t", 0, 0, 7), ("t", 1, 0, 4))
    nxt = plan_next(start, stale, fail_on_data_loss=True)
    assert nxt.latest[("t", 0)] == 10 and nxt.backlog() == 0


@pytest.mark.parametrize("fail", [True, False])
def test_a_topic_created_again_is_data_loss_even_when_its_offsets_are_higher(fail):
    """The issue's case: 0-9 read, the topic recreated with 15 records: Kafka would read 10-14 alone."""
    from sparkio.fetch import DataLoss
    from sparkio.stream_offsets import plan_next

    start = to_json_offsets({("t", 0): 10}, {"t": 1})
    now = _states(("t", 0, 0, 15), created=2)
    if fail:
        with pytest.raises(DataLoss, match="t was deleted and created again.*failOnDataLoss=false"):
            plan_next(start, now, fail_on_data_loss=True)
        return
    nxt = plan_next(start, now, fail_on_data_loss=False)
    assert nxt.begin == {("t", 0): 0} and nxt.latest == {("t", 0): 15} and len(nxt.lost) == 1
    assert created_of(nxt.to_json()) == {"t": 2}


def test_a_topic_created_again_in_the_same_millisecond_is_told_apart_by_its_id():
    """The creation time cannot tell two incarnations created in one millisecond apart; the id can.
    Offsets written before ids (no "@topic_id") are judged by creation time alone."""
    from sparkio.fetch import DataLoss
    from sparkio.stream_offsets import plan_next, stale

    start = to_json_offsets({("t", 0): 10}, {"t": 1}, {"t": "A" * 22})
    assert start["@topic_id"] == {"t": "A" * 22} and from_json_offsets(start) == {("t", 0): 10}
    same = {("t", 0): PartitionState("t", 0, 0, 15, (), 1, "A" * 22)}
    assert plan_next(start, same, fail_on_data_loss=True).begin == {("t", 0): 10}
    again = {("t", 0): PartitionState("t", 0, 0, 15, (), 1, "B" * 22)}
    with pytest.raises(DataLoss, match="t was deleted and created again"):
        plan_next(start, again, fail_on_data_loss=True)
    nxt = plan_next(start, again, fail_on_data_loss=False)
    assert nxt.begin == {("t", 0): 0} and nxt.to_json()["@topic_id"] == {"t": "B" * 22}
    below = {("t", 0): PartitionState("t", 0, 0, 5, (), 1, "B" * 22)}
    assert stale(start, below) == []  # another topic, not an older view of this one
    old = to_json_offsets({("t", 0): 10}, {"t": 1})  # written without ids
    assert plan_next(old, again, fail_on_data_loss=True).begin == {("t", 0): 10}


def test_gone_partitions_went_back_offsets_and_late_partitions():
    from sparkio.fetch import DataLoss
    from sparkio.stream_offsets import plan_next

    start = to_json_offsets({("t", 0): 10, ("u", 0): 3}, {"t": 1})
    with pytest.raises(DataLoss, match="partitions t/0 .read up to offset 10. are gone"):
        plan_next(start, _states(("u", 0, 0, 3)), fail_on_data_loss=True)
    nxt = plan_next(start, _states(("u", 0, 0, 3)), fail_on_data_loss=False)
    assert set(nxt.latest) == {("u", 0)}  # dropped, as Kafka drops them
    # u's offset went back and its offsets do not say when it was created: Kafka's "offset was changed"
    with pytest.raises(DataLoss, match="offset of u/0 went back from 3 to 1"):
        plan_next(start, _states(("t", 0, 0, 10), ("u", 0, 0, 1)), fail_on_data_loss=True)
    # a partition appearing with records already removed below it
    with pytest.raises(DataLoss, match="t/1 appeared during the query but starts at offset 4"):
        plan_next(start, _states(("t", 0, 0, 10), ("t", 1, 4, 9), ("u", 0, 0, 3)), fail_on_data_loss=True)


def test_available_now_stops_at_the_watermarks_it_started_with():
    from sparkio.stream_offsets import plan_next

    start = to_json_offsets({("t", 0): 2}, {"t": 1})
    target = to_json_offsets({("t", 0): 6}, {"t": 1})
    nxt = plan_next(start, _states(("t", 0, 0, 9), ("t", 1, 0, 5)), fail_on_data_loss=True, target=target)
    assert nxt.latest == {("t", 0): 6, ("t", 1): 0}  # t/1 was born after the query started
