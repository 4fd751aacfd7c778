"""df.write.format("ring") and writeStream: records land on the partition
their key hashes to (the producer's partition_for_key), with headers and
timestamps, topics from the option or a column, and the batch and streaming
writers agree with a read back."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

import sparkio
from ring.hashing import partition_for_key
from tests.spark.conftest import produce_numbered


def read_back(spark, client, topic):
    return sparkio.read_rdd(spark.sparkContext, client.urls[0], topic).rdd.collect()


def test_write_round_trip_places_keys_like_the_producer(spark, broker, client, topic):
    t = topic(5)
    ts = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    rows = [(f"user-{i % 37}", f'{{"n": {i}}}', [("src", b"spark"), ("i", str(i).encode())], ts)
            for i in range(1_000)]
    df = spark.createDataFrame(rows, "key string, value string, headers array<struct<key:string,value:binary>>, "
                                     "timestamp timestamp").repartition(3)
    df.write.format("ring").option("brokers", broker.url).option("topic", t).mode("append").save()

    got = read_back(spark, client, t)
    assert len(got) == 1_000
    assert sorted(r.value for r in got) == sorted(v.encode() for _, v, _, _ in rows)
    for r in got:
        assert r.partition == partition_for_key(r.key, 5), r
        n = r.value.decode().split()[-1].rstrip("}")
        assert r.headers == [("src", b"spark"), ("i", n.encode())]
        assert r.timestamp == int(ts.timestamp() * 1000)
    # Records with one key stay in the order they were written.
    per_key = {}
    for r in sorted(got, key=lambda r: r.offset):
        per_key.setdefault(r.key, []).append(r.offset)
    assert len(per_key) == 37


def test_topic_column_and_binary_values(spark, broker, client, topic):
    a, b = topic(2), topic(1)
    df = spark.createDataFrame([(a if i % 3 else b, bytes([i % 256, 0, 255])) for i in range(300)],
                               "topic string, value binary")
    df.write.format("ring").option("brokers", broker.url).mode("append").save()
    assert Counter(r.value for r in read_back(spark, client, a)) == Counter(
        bytes([i % 256, 0, 255]) for i in range(300) if i % 3)
    assert len(read_back(spark, client, b)) == 100


def test_stream_to_stream(spark, broker, client, topic, tmp_path):
    src, dst = topic(3), topic(4)
    values = produce_numbered(client, src, 400)
    q = (spark.readStream.format("ring").option("brokers", broker.url).option("subscribe", src)
         .option("startingOffsets", "earliest").load()
         .selectExpr("key", "upper(cast(value as string)) value")
         .writeStream.format("ring").option("brokers", broker.url).option("topic", dst)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(60) and q.exception() is None
    got = read_back(spark, client, dst)
    assert sorted(r.value for r in got) == sorted(v.upper() for v in values)
    assert all(r.partition == partition_for_key(r.key, 4) for r in got)


def test_writer_refuses_bad_input(spark, broker, topic):
    t = topic(1)
    with pytest.raises(Exception, match="needs a value column"):
        spark.createDataFrame([("x",)], "key string").write.format("ring") \
            .option("brokers", broker.url).option("topic", t).mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        spark.createDataFrame([("x",)], "value string").write.format("ring") \
            .option("brokers", broker.url).option("topic", t).mode("overwrite").save()
    with pytest.raises(Exception, match="topic option or a topic column"):
        spark.createDataFrame([("x",)], "value string").write.format("ring") \
            .option("brokers", broker.url).mode("append").save()


def test_partition_column_wins_over_the_key(spark, broker, client, topic):
    t = topic(3)
    df = spark.createDataFrame([("same-key", f"v{i}", i % 3) for i in range(90)],
                               "key string, value string, partition int")
    df.write.format("ring").option("brokers", broker.url).option("topic", t).mode("append").save()
    got = read_back(spark, client, t)
    assert Counter(r.partition for r in got) == {0: 30, 1: 30, 2: 30}
    assert all(int(r.value[1:]) % 3 == r.partition for r in got)
