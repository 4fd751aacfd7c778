"""read_rdd against a real broker and a real local Spark: every record once,
offset order inside each Spark partition, split counts as asked, and data
loss handled as the query says when history is removed mid-job."""

from __future__ import annotations

import pytest

import sparkio
from ring.errors import BadRequest, UnknownTopic
from tests.spark.conftest import produce_numbered


def test_rdd_holds_every_record_once_in_offset_order(spark, client, topic):
    t = topic(4)
    values = produce_numbered(client, t, 3_000, headers=True)
    result = sparkio.read_rdd(spark.sparkContext, client.urls[0], t, min_partitions=7,
                              max_records_per_partition=500)
    assert result.rdd.getNumPartitions() == len(result.ranges) >= 7
    chunks = result.rdd.glom().collect()
    assert len(chunks) == len(result.ranges)
    seen = []
    for split, records in zip(result.ranges, chunks):
        # Partition i holds exactly split i, in offset order.
        assert [(r.topic, r.partition, r.offset) for r in records] == [
            (split.topic, split.partition, o) for o in range(split.start, split.end)]
        seen.extend(records)
    assert sorted(r.value for r in seen) == sorted(values)
    assert len({(r.partition, r.offset) for r in seen}) == len(values)
    r = seen[0]
    n = int(r.value[1:])
    assert r.key == b"k%d" % (n % 97) and r.headers == [("n", str(n).encode()), ("src", b"test")]
    assert r.timestamp > 1_600_000_000_000


@pytest.mark.parametrize("min_partitions, max_records", [(None, None), (10, None), (None, 70), (25, 40)])
def test_split_counts_follow_the_options(spark, client, topic, min_partitions, max_records):
    t = topic(3)
    produce_numbered(client, t, 600)
    res = sparkio.read_rdd(spark.sparkContext, client.urls[0], [t], min_partitions=min_partitions,
                           max_records_per_partition=max_records)
    sizes = [s.size for s in res.ranges]
    assert sum(sizes) == 600 and res.rdd.getNumPartitions() == len(sizes)
    if min_partitions is None and max_records is None:
        assert len(sizes) == 3
    if min_partitions:
        assert len(sizes) >= min_partitions
    if max_records:
        assert max(sizes) <= max_records and len(sizes) >= -(-600 // max_records)
    if min_partitions and not max_records:
        assert len(sizes) <= min_partitions + 3  # proportional, not one per record


def test_offsets_given_per_partition(spark, client, topic):
    t = topic(2)
    produce_numbered(client, t, 200)
    res = sparkio.read_rdd(spark.sparkContext, client.urls[0], t,
                           starting_offsets={t: {0: 10, 1: -2}}, ending_offsets=f'{{"{t}": {{"0": 20, "1": -1}}}}')
    ranges = {(s.partition): (s.start, s.end) for s in res.ranges}
    assert ranges[0] == (10, 20) and ranges[1][0] == 0
    offsets = res.rdd.map(lambda r: (r.partition, r.offset)).collect()
    assert sorted(o for p, o in offsets if p == 0) == list(range(10, 20))


def test_bad_requests_fail_on_the_driver(spark, client, topic):
    t = topic(1)
    produce_numbered(client, t, 10)
    with pytest.raises(UnknownTopic):
        sparkio.read_rdd(spark.sparkContext, client.urls[0], "no-such-topic")
    with pytest.raises(BadRequest, match="beyond its high watermark"):
        sparkio.read_rdd(spark.sparkContext, client.urls[0], t, ending_offsets={t: {0: 11}})


@pytest.mark.parametrize("fail", [True, False])
def test_truncation_while_a_job_is_planned(spark, client, topic, fail):
    t = topic(1)
    produce_numbered(client, t, 300, keyed=False)
    res = sparkio.read_rdd(spark.sparkContext, client.urls[0], t, max_records_per_partition=100,
                           fail_on_data_loss=fail)
    assert [(s.start, s.end) for s in res.ranges] == [(0, 100), (100, 200), (200, 300)]
    client.truncate(t, 0, 150)  # after planning, before the tasks run
    if fail:
        with pytest.raises(Exception, match=r"data loss: offsets (0\.\.99|100\.\.149) of"):
            res.rdd.count()
    else:
        assert sorted(res.rdd.map(lambda r: r.offset).collect()) == list(range(150, 300))
