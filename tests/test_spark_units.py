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
from sparkio.planner import from_json_offsets, to_json_offsets
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
    assert o.starting.for_partition("b", 9) == EARLIEST  # the default for unnamed partitions
    assert o.ending.for_partition("b", 2) == LATEST
    assert (o.min_partitions, o.fail_on_data_loss, o.include_headers) == (3, False, True)


def test_streaming_defaults_and_batch_only_options():
    o = parse_read_options({"brokers": "h:1", "subscribePattern": "c.*", "maxOffsetsPerTrigger": "10"},
                           streaming=True)
    assert o.starting.default == LATEST and o.ending is None and o.max_offsets_per_trigger == 10
    assert o.subscription.matches("clicks") and not o.subscription.matches("xclicks")
    with pytest.raises(BadRequest, match="batch"):
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
    ({"assign": '{"t": []}'}, "list of partitions"),
    ({"subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "integer"),
])
def test_bad_read_options_name_the_option(opts, match):
    with pytest.raises(BadRequest, match=match):
        parse_read_options({"brokers": "h:1", **opts}, streaming=False)


def test_assign_and_write_options():
    o = parse_read_options({"brokers": "h:1", "assign": '{"t": [2, 0, 2]}'}, streaming=False)
    assert o.subscription.assign == (("t", 0), ("t", 2))
    w = parse_write_options({"Brokers": "h:1,h:2", "TOPIC": "out"})
    assert w.brokers == ("http://h:1", "http://h:2") and w.topic == "out"


def test_stream_offsets_survive_json():
    offsets = {("a", 0): 5, ("a", 10): 7, ("b", 1): 0}
    doc = json.loads(json.dumps(to_json_offsets(offsets)))
    assert doc == {"a": {"0": 5, "10": 7}, "b": {"1": 0}}
    assert from_json_offsets(doc) == offsets


# --- decoding fetch answers ---------------------------------------------------------------


def _stored(base: int, n: int, ts: int = 1_000) -> bytes:
    buf = batchfmt.encode([(ts + i, b"k%d" % i, b"v%d" % (base + i), {"h": b"x"} if i % 2 else None)
                           for i in range(n)], now_ms=ts)
    batchfmt.stamp(buf, 0, base, 1)
    return bytes(buf)


def test_decode_answer_trims_both_ends():
    body = _stored(0, 5) + _stored(5, 5) + _stored(10, 5)
    resp = Response(200, {"content-type": CT_BATCHES}, body, "http://x")
    recs = decode_answer(resp, 3, 12)
    assert [r.offset for r in recs] == list(range(3, 12))
    assert recs[0].value == b"v3" and recs[0].headers == {"h": b"x"} and recs[1].headers is None
    assert recs[0].timestamp == 1_003


def test_decode_answer_rejects_a_damaged_batch():
    body = bytearray(_stored(0, 3))
    body[-1] ^= 0xFF
    resp = Response(200, {"content-type": CT_BATCHES}, bytes(body), "http://x")
    with pytest.raises(Exception, match="CRC"):
        decode_answer(resp, 0, 3)
