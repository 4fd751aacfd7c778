"""spark.read.format("ring") against a real broker: the Kafka column layout
and every reader option (offsets, timestamps, subscribe/pattern/assign,
minPartitions, maxRecordsPerPartition, includeHeaders, failOnDataLoss)."""

from __future__ import annotations

import pytest

from tests.spark.conftest import offsets, produce_numbered, read_df

T0 = 1_700_000_000_000  # record timestamps: T0 + n*1000 on partition 0, T0 + n*2000 on 1


@pytest.fixture(scope="module")
def opts_topic(broker):
    """Two partitions with known offsets, timestamps and headers."""
    from sparkio.client import BrokerClient

    with BrokerClient([broker.url]) as c:
        c.create_topic("dfopts", 2)
        c.produce("dfopts", [{"value": b"p0-%d" % n, "key": b"a", "timestamp": T0 + n * 1000,
                              "headers": [("n", str(n).encode()), ("empty", None), ("n", b"again")]
                              if n % 2 else None}
                             for n in range(100)], partition=0)
        c.produce("dfopts", [{"value": b"p1-%d" % n, "timestamp": T0 + n * 2000} for n in range(50)],
                  partition=1)
    return "dfopts"


def read(spark, broker, **options):
    return read_df(spark, broker.url, **options)


def test_kafka_column_layout_and_values(spark, broker, opts_topic):
    df = read(spark, broker, subscribe=opts_topic)
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>")
    rows = df.where("partition = 0 and offset = 7").selectExpr(
        "key", "cast(value as string) v", "topic", "unix_millis(timestamp) ms", "timestampType").collect()
    assert [tuple(r) for r in rows] == [(b"a", "p0-7", opts_topic, T0 + 7000, 0)]
    assert offsets(df) == {0: list(range(100)), 1: list(range(50))}
    with_headers = read(spark, broker, subscribe=opts_topic, includeHeaders="true")
    assert with_headers.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    got = {r.offset: r.headers for r in with_headers.where("partition = 0 and offset < 2").collect()}
    assert got[0] is None
    assert [(h.key, h.value) for h in got[1]] == [("n", b"1"), ("empty", None), ("n", b"again")]


def test_offsets_as_json_with_earliest_and_latest(spark, broker, opts_topic):
    df = read(spark, broker, subscribe=opts_topic, startingOffsets={opts_topic: {"0": 10, "1": -2}},
              endingOffsets={opts_topic: {"0": 20, "1": -1}})
    assert offsets(df) == {0: list(range(10, 20)), 1: list(range(50))}
    with pytest.raises(Exception, match="latest is not allowed for batch queries"):
        read(spark, broker, subscribe=opts_topic, startingOffsets="latest").count()


def test_timestamps(spark, broker, opts_topic):
    df = read(spark, broker, subscribe=opts_topic, startingTimestamp=str(T0 + 20_000),
              endingTimestamp=str(T0 + 60_000))
    assert offsets(df) == {0: list(range(20, 60)), 1: list(range(10, 30))}
    df = read(spark, broker, subscribe=opts_topic,
              startingOffsetsByTimestamp={opts_topic: {"0": T0, "1": T0 + 90_000}},
              endingOffsetsByTimestamp={opts_topic: {"0": T0 + 5_000, "1": T0 + 1_000_000}})
    assert offsets(df) == {0: list(range(0, 5)), 1: list(range(45, 50))}


def test_subscribe_pattern_and_assign(spark, broker, client, topic, opts_topic):
    a, b = topic(2, prefix="pat-x"), topic(1, prefix="pat-x")
    topic(1, prefix="other")
    produce_numbered(client, a, 40)
    produce_numbered(client, b, 10)
    df = read(spark, broker, subscribePattern="pat-x-.*")
    assert sorted(r.topic for r in df.select("topic").distinct().collect()) == sorted([a, b])
    assert df.count() == 50
    assert offsets(read(spark, broker, assign={opts_topic: [1]})) == {1: list(range(50))}


@pytest.mark.parametrize("options, expected", [
    ({}, 2),
    ({"minPartitions": "6"}, 6),
    ({"maxRecordsPerPartition": "30"}, 4 + 2),
    ({"minPartitions": "12", "maxRecordsPerPartition": "30"}, 12),
])
def test_partitions_follow_the_options(spark, broker, opts_topic, options, expected):
    df = read(spark, broker, subscribe=opts_topic, **options)
    assert df.rdd.getNumPartitions() >= expected
    if "minPartitions" not in options:
        assert df.rdd.getNumPartitions() == expected
    assert df.count() == 150


def test_fail_on_data_loss(spark, broker, client, topic):
    t = topic(1)
    produce_numbered(client, t, 100, keyed=False)
    client.truncate(t, 0, 30)
    start = {t: {"0": 10}}
    with pytest.raises(Exception, match=r"data loss: offsets 10\.\.29 of"):
        read(spark, broker, subscribe=t, startingOffsets=start).count()
    df = read(spark, broker, subscribe=t, startingOffsets=start, failOnDataLoss="false")
    assert offsets(df) == {0: list(range(30, 100))}
    # Starting at "earliest" is never a loss: it means whatever is kept.
    assert read(spark, broker, subscribe=t).count() == 70


def test_bad_options_fail_with_the_option_named(spark, broker, opts_topic):
    with pytest.raises(Exception, match="exactly one of the options subscribe"):
        read(spark, broker).count()
    with pytest.raises(Exception, match="endingOffsets"):
        read(spark, broker, subscribe=opts_topic, endingOffsets="earliest").count()
