"""sparkio against the Kafka connector's documented behaviour, one test per row
of the option and column tables of the Spark Structured Streaming + Kafka
Integration Guide (source options, sink options, source columns, sink
columns), each run as a batch query, a stream, or both, against a real
3-broker cluster. docs/SPARK.md is the same table in prose, with every
difference from Kafka and why.

A refusal must reach the user as one line naming the option: Spark wraps a
Python data source's error in its own message, so ``refused`` checks that
the ring error is there once, with no sparkio frames and no second error
chained after it.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest

import sparkio
from ring import errors
from sparkio.client import BrokerClient
from tests.brokers import TestCluster
from tests.spark.conftest import offsets, read_df
from tests.support import wait_for

T0 = 1_700_000_000_000
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = TestCluster(tmp_path_factory.mktemp("parity"), 3, args=["--fsync", "never", "--log-level", "warning"])
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def urls(cluster) -> str:
    return ",".join(m.url for m in cluster)


@pytest.fixture(scope="module", autouse=True)
def progress_of_idle_triggers(spark):
    """Every trigger that starts no batch is reported too, so a test can see a trigger decide to wait."""
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "50")
    yield
    spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


@pytest.fixture
def client(cluster):
    with BrokerClient([m.url for m in cluster]) as c:
        yield c


_n = iter(range(10_000))


def new_topic(client: BrokerClient, partitions: int = 3, prefix: str = "par") -> str:
    name = f"{prefix}-{next(_n)}-{int(time.time() * 1000) % 100_000}"
    client.create_topic(name, partitions)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        parts = client.describe_topic(name)["partitions"]
        if len(parts) == partitions and all(p.get("leader") for p in parts):
            return name
        time.sleep(0.1)
    raise TimeoutError(f"{name} has no leaders")


def recreate(client: BrokerClient, topic: str, partitions: int, while_gone=lambda: None) -> None:
    """Delete ``topic`` and create it again, waiting for each step to show."""
    client.request("DELETE", f"/v1/topics/{topic}")
    wait_for("the topic to be gone", lambda: topic not in client.list_topics(), WAIT_S)
    while_gone()
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            client.create_topic(topic, partitions)
            break
        except errors.Conflict:  # another broker still deleting the old one
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    wait_for("leaders", lambda: all(p.get("leader") for p in client.describe_topic(topic)["partitions"]), WAIT_S)


def fill(client: BrokerClient, topic: str, per_partition: int, partitions: int = 3, *, ts_step: int = 10,
         headers=None) -> None:
    """``per_partition`` records on each partition: value b"p<p>-<i>", timestamp T0 + i*ts_step."""
    for p in range(partitions):
        client.produce(topic, [{"value": b"p%d-%d" % (p, i), "timestamp": T0 + i * ts_step,
                                **({"headers": headers} if headers else {})}
                               for i in range(per_partition)], partition=p)


def read(spark, urls: str | None, **options):
    return read_df(spark, urls, **options)


def refused(action) -> str:
    """The one line a refusal shows; fails if the error is buried in tracebacks or chained."""
    with pytest.raises(Exception) as info:
        action()
    text = str(info.value)
    assert "UnboundLocalError" not in text and "During handling" not in text, text
    assert "/sparkio/options.py" not in text and "/sparkio/planner.py" not in text, text
    lines = {m.group(0).strip() for m in ERROR_LINE.finditer(text)}
    assert len(lines) == 1, text
    return lines.pop()


ERROR_LINE = re.compile(r"^(?:ring\.errors|sparkio\.\w+)\.[A-Z]\w*: .*$", re.M)


def stream(spark, urls, name, checkpoint, trigger=None, **options):
    """A stream into the memory table ``name``; or, when ``name`` is a path, into parquet
    files there (a sink that can restart from its checkpoint)."""
    r = spark.readStream.format("ring").option("brokers", urls)
    for k, v in options.items():
        r = r.option(k, v if isinstance(v, str) else json.dumps(v))
    w = (r.load().selectExpr("topic", "partition", "offset", "cast(value as string) v").writeStream
         .option("checkpointLocation", str(checkpoint)))
    w = w.format("memory").queryName(name) if isinstance(name, str) else w.format("parquet").option("path", str(name))
    return w.trigger(**(trigger or {"availableNow": True})).start()


def run_stream(spark, urls, name, checkpoint, **options) -> list:
    q = stream(spark, urls, name, checkpoint, **options)
    assert q.awaitTermination(WAIT_S), "availableNow query did not finish"
    if q.exception() is not None:
        raise q.exception()
    table = spark.sql(f"select * from {name}") if isinstance(name, str) else spark.read.parquet(str(name))
    return [tuple(r) for r in table.collect()]


def sizes(q) -> list[int]:
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


# --- source options that choose what to read ------------------------------------------------


def test_assign(spark, urls, client):
    t = new_topic(client)
    fill(client, t, 5)
    assert offsets(read(spark, urls, assign={t: [0, 2]})) == {0: list(range(5)), 2: list(range(5))}
    line = refused(lambda: read(spark, urls, assign="not json").count())
    assert "assign" in line
    rows = run_stream(spark, urls, "par_assign", f"/tmp/ck-{t}", assign={t: [1]}, startingOffsets="earliest")
    assert sorted(r[1] for r in rows) == [1] * 5


def test_subscribe(spark, urls, client):
    a, b = new_topic(client, 1), new_topic(client, 2)
    fill(client, a, 3, 1)
    fill(client, b, 3, 2)
    assert read(spark, urls, subscribe=f" {a} , {b} ,").count() == 9  # Kafka trims and drops empty names
    assert "subscribe" in refused(lambda: read(spark, urls, subscribe=" , ").count())
    assert "exactly one" in refused(lambda: read(spark, urls, subscribe=a, assign={a: [0]}).count())


def test_subscribePattern(spark, urls, client):
    """A Java regex found anywhere in the name (Kafka's findFirstIn), not a full match; internal
    topics are never matched."""
    stem = f"audit{next(_n)}x"
    names = [new_topic(client, 1, prefix=f"{stem}-a"), new_topic(client, 1, prefix=f"z-{stem}")]
    for n in names:
        fill(client, n, 2, 1)
    assert {r.topic for r in read(spark, urls, subscribePattern=stem).collect()} == set(names)
    assert read(spark, urls, subscribePattern=f"^{stem}").select("topic").distinct().count() == 1
    assert read(spark, urls, subscribePattern="offsets", startingOffsets="earliest").where(
        "topic = '__offsets'").count() == 0
    assert "subscribePattern" in refused(lambda: read(spark, urls, subscribePattern="(").count())


def test_kafka_bootstrap_servers(spark, cluster, client):
    t = new_topic(client, 1)
    fill(client, t, 4, 1)
    hostports = ",".join(m.url.removeprefix("http://") for m in cluster)  # host:port, as for Kafka
    df = read(spark, None, **{"kafka.bootstrap.servers": hostports, "subscribe": t,
                              "kafka.security.protocol": "PLAINTEXT", "kafka.max.poll.records": "7"})
    assert df.count() == 4  # other kafka.* options are ignored
    assert "brokers" in refused(lambda: read(spark, None, subscribe=t).count())


# --- where a read starts and ends ---------------------------------------------------------


def test_startingTimestamp(spark, urls, client):
    t = new_topic(client)
    fill(client, t, 10)  # timestamps T0, T0+10, ... T0+90
    df = read(spark, urls, subscribe=t, startingTimestamp=str(T0 + 45), startingOffsets="earliest")
    assert offsets(df) == {p: list(range(5, 10)) for p in range(3)}  # the timestamp wins over offsets
    line = refused(lambda: read(spark, urls, subscribe=t, startingTimestamp=str(T0 + 1_000)).count())
    assert "startingTimestamp" in line  # no offset matched: Kafka's default strategy is error
    rows = run_stream(spark, urls, "par_start_ts", f"/tmp/ck-{t}", subscribe=t, startingTimestamp=str(T0 + 75))
    assert sorted(r[2] for r in rows) == [8, 8, 8, 9, 9, 9]


def test_startingOffsetsByTimestamp(spark, urls, client):
    t = new_topic(client)
    fill(client, t, 10)
    by_ts = {t: {"0": T0, "1": T0 + 50, "2": T0 + 85}}
    df = read(spark, urls, subscribe=t, startingOffsetsByTimestamp=by_ts, startingOffsets={t: {"0": 9, "1": 9,
                                                                                              "2": 9}})
    assert offsets(df) == {0: list(range(10)), 1: list(range(5, 10)), 2: [9]}
    line = refused(lambda: read(spark, urls, subscribe=t, startingOffsetsByTimestamp={t: {"0": T0}}).count())
    assert "startingOffsetsByTimestamp" in line and "every partition" in line


def test_startingOffsets(spark, urls, client, tmp_path):
    t = new_topic(client)
    fill(client, t, 10)
    assert read(spark, urls, subscribe=t).count() == 30  # batch default: earliest
    df = read(spark, urls, subscribe=t, startingOffsets={t: {"0": 3, "1": -2, "2": 8}})
    assert offsets(df) == {0: list(range(3, 10)), 1: list(range(10)), 2: [8, 9]}
    for latest in ("latest", {t: {"0": -1, "1": 0, "2": 0}}):
        assert "startingOffsets" in refused(lambda: read(spark, urls, subscribe=t, startingOffsets=latest).count())
    line = refused(lambda: read(spark, urls, subscribe=t, startingOffsets={t: {"0": 8}}).count())
    assert "startingOffsets" in line and "every partition" in line
    # A stream starts at latest by default: only records produced after it started.
    q = stream(spark, urls, "par_start_latest", tmp_path / "ck", {"processingTime": "200 milliseconds"},
               subscribe=t)
    try:
        wait_for("the stream's first trigger", lambda: q.recentProgress, WAIT_S)
        client.produce(t, [{"value": b"new"}], partition=1)
        rows = wait_for("the new record", lambda: spark.sql("select * from par_start_latest").collect(), WAIT_S)
        assert [(r.partition, r.offset, r.v) for r in rows] == [(1, 10, "new")]
    finally:
        q.stop()


def test_endingTimestamp(spark, urls, client, tmp_path):
    t = new_topic(client)
    fill(client, t, 10)
    df = read(spark, urls, subscribe=t, endingTimestamp=str(T0 + 35), endingOffsets={t: {"0": 1, "1": 1, "2": 1}})
    assert offsets(df) == {p: list(range(4)) for p in range(3)}  # exclusive, and it wins over endingOffsets
    assert read(spark, urls, subscribe=t, endingTimestamp=str(T0 + 10_000)).count() == 30  # no match: latest
    line = refused(lambda: run_stream(spark, urls, "par_end_ts", tmp_path / "ck", subscribe=t,
                                      endingTimestamp=str(T0)))
    assert "endingTimestamp" in line


def test_endingOffsetsByTimestamp(spark, urls, client, tmp_path):
    t = new_topic(client)
    fill(client, t, 10)
    df = read(spark, urls, subscribe=t, endingOffsetsByTimestamp={t: {"0": T0 + 15, "1": T0, "2": T0 + 10_000}})
    assert offsets(df) == {0: [0, 1], 2: list(range(10))}
    line = refused(lambda: read(spark, urls, subscribe=t, endingOffsetsByTimestamp={t: {"0": T0}}).count())
    assert "endingOffsetsByTimestamp" in line and "every partition" in line
    line = refused(lambda: run_stream(spark, urls, "par_end_bts", tmp_path / "ck", subscribe=t,
                                      endingOffsetsByTimestamp={t: {"0": T0, "1": T0, "2": T0}}))
    assert "endingOffsetsByTimestamp" in line


def test_endingOffsets(spark, urls, client, tmp_path):
    t = new_topic(client)
    fill(client, t, 10)
    df = read(spark, urls, subscribe=t, endingOffsets={t: {"0": 4, "1": -1, "2": 0}})
    assert offsets(df) == {0: list(range(4)), 1: list(range(10))}
    for earliest in ("earliest", {t: {"0": -2, "1": 5, "2": 5}}):
        assert "endingOffsets" in refused(lambda: read(spark, urls, subscribe=t, endingOffsets=earliest).count())
    assert "every partition" in refused(lambda: read(spark, urls, subscribe=t, endingOffsets={t: {"0": 4}}).count())
    line = refused(lambda: run_stream(spark, urls, "par_end_off", tmp_path / "ck", subscribe=t,
                                      endingOffsets="latest"))
    assert "endingOffsets" in line  # one line, not the stream runner's UnboundLocalError


# --- data loss --------------------------------------------------------------------------------


def test_failOnDataLoss_batch_truncate_under_the_read(spark, urls, client):
    """Offsets planned, then deleted before the tasks read them (Kafka's deleteRecords)."""
    t = new_topic(client, 1)
    fill(client, t, 20, 1)
    for fail in (True, False):
        result = sparkio.read_rdd(spark.sparkContext, urls, t, fail_on_data_loss=fail)
        assert [s.end for s in result.ranges] == [20]
        client.truncate(t, 0, 8 if fail else 12)
        if fail:
            assert "failOnDataLoss" in refused(lambda: result.rdd.collect())
        else:
            assert [r.offset for r in result.rdd.collect()] == list(range(12, 20))
    # Planned after the truncation: the same two answers.
    assert "failOnDataLoss" in refused(lambda: read(spark, urls, subscribe=t, startingOffsets={t: {"0": 0}}).count())
    assert offsets(read(spark, urls, subscribe=t, failOnDataLoss="false",
                        startingOffsets={t: {"0": 0}})) == {0: list(range(12, 20))}


def test_failOnDataLoss_topic_recreated_between_runs(spark, urls, client, tmp_path):
    """The issue's case: offsets 0-9 read, the topic deleted and created again with 15 records."""
    t = new_topic(client, 1)
    fill(client, t, 10, 1)
    for fail in ("true", "false"):
        assert len(run_stream(spark, urls, tmp_path / f"out-{fail}", tmp_path / fail, subscribe=t,
                              startingOffsets="earliest", failOnDataLoss=fail)) == 10
    recreate(client, t, 1)
    client.produce(t, [{"value": b"again-%d" % i} for i in range(15)], partition=0)
    line = refused(lambda: run_stream(spark, urls, tmp_path / "out-true", tmp_path / "true", subscribe=t,
                                      failOnDataLoss="true"))
    assert "failOnDataLoss" in line and t in line
    rows = run_stream(spark, urls, tmp_path / "out-false", tmp_path / "false", subscribe=t, failOnDataLoss="false")
    again = sorted(r[2] for r in rows if r[3].startswith("again"))
    assert again == list(range(15)), "the new topic is read from its start"


def test_failOnDataLoss_topic_deleted_under_a_running_stream(spark, urls, client, tmp_path):
    found = {}
    for fail in ("true", "false"):
        t = new_topic(client, 2)
        fill(client, t, 5, 2)
        name = f"par_del_{fail}"
        q = stream(spark, urls, name, tmp_path / fail, {"processingTime": "200 milliseconds"}, subscribe=t,
                   startingOffsets="earliest", failOnDataLoss=fail)
        wait_for("the first records", lambda: spark.sql(f"select count(*) from {name}").first()[0] == 10, WAIT_S)
        if fail == "true":
            client.request("DELETE", f"/v1/topics/{t}")
            wait_for("the query to fail", lambda: not q.isActive, WAIT_S)
            found[fail] = str(q.exception())
            continue
        try:
            def triggers_see_it_gone():
                gone = time.time()
                wait_for("idle triggers", lambda: sum(_progress_time(p) > gone for p in q.recentProgress) >= 3, WAIT_S)
                assert q.isActive and q.exception() is None, q.exception()

            recreate(client, t, 2, triggers_see_it_gone)
            client.produce(t, [{"value": b"again"}] * 3, partition=1)
            wait_for("the new topic's records",
                     lambda: spark.sql(f"select count(*) from {name}").first()[0] == 13, WAIT_S)
            assert sorted(r.offset for r in spark.sql(f"select * from {name} where v = 'again'").collect()) == [0, 1, 2]
        finally:
            q.stop()
    assert "failOnDataLoss" in found["true"] and "gone" in found["true"]


# --- how a read runs ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
                                  "fetchOffset.retryIntervalMs"])
def test_fetch_timing_options(spark, urls, client, name):
    t = new_topic(client, 1)
    fill(client, t, 3, 1)
    assert read(spark, urls, subscribe=t, **{name: "5"}).count() == 3
    assert name in refused(lambda: read(spark, urls, subscribe=t, **{name: "soon"}).count())


def test_maxOffsetsPerTrigger(spark, urls, client, tmp_path):
    t = new_topic(client)
    fill(client, t, 100)
    q = stream(spark, urls, "par_max", tmp_path / "ck", subscribe=t, startingOffsets="earliest",
               maxOffsetsPerTrigger="120")
    assert q.awaitTermination(WAIT_S) and q.exception() is None
    assert sizes(q) == [120, 120, 60]
    assert read(spark, urls, subscribe=t, maxOffsetsPerTrigger="10").count() == 300  # ignored by batch queries


def test_minOffsetsPerTrigger(spark, urls, client, tmp_path):
    t = new_topic(client, 1)
    fill(client, t, 5, 1)
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "50")
    q = stream(spark, urls, "par_min", tmp_path / "ck", {"processingTime": "100 milliseconds"}, subscribe=t,
               startingOffsets="earliest", minOffsetsPerTrigger="10", maxTriggerDelay="1h")
    try:
        wait_for("the first trigger, which never waits", lambda: sizes(q) == [5], WAIT_S)
        client.produce(t, [{"value": b"x"}] * 4, partition=0)
        after = time.time()
        # Triggers that found 4 new records ran and did not start a batch.
        wait_for("idle triggers", lambda: sum(_progress_time(p) > after + 0.3 for p in q.recentProgress) >= 3, WAIT_S)
        assert sizes(q) == [5]
        client.produce(t, [{"value": b"y"}] * 6, partition=0)
        wait_for("a batch once 10 records wait", lambda: sizes(q) == [5, 10], WAIT_S)
    finally:
        q.stop()
    line = refused(lambda: read(spark, urls, subscribe=t, minOffsetsPerTrigger="10", maxOffsetsPerTrigger="5").count())
    assert "minOffsetsPerTrigger" in line


def _progress_time(p) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()


def test_maxTriggerDelay(spark, urls, client, tmp_path):
    t = new_topic(client, 1)
    q = stream(spark, urls, "par_delay", tmp_path / "ck", {"processingTime": "100 milliseconds"}, subscribe=t,
               startingOffsets="earliest", minOffsetsPerTrigger="1000", maxTriggerDelay="4s")
    try:
        wait_for("the first trigger", lambda: q.recentProgress, WAIT_S)
        first = min(_progress_time(p) for p in q.recentProgress)  # the first trigger never waits
        client.produce(t, [{"value": b"x"}] * 3, partition=0)
        wait_for("the delayed batch", lambda: sizes(q) == [3], WAIT_S)
        fired = max(_progress_time(p) for p in q.recentProgress if p["numInputRows"])
        assert fired - first >= 3.5, "3 records < minOffsetsPerTrigger started a batch before maxTriggerDelay"
    finally:
        q.stop()
    assert "maxTriggerDelay" in refused(lambda: read(spark, urls, subscribe=t, maxTriggerDelay="soon").count())


def test_minPartitions(spark, urls, client):
    t = new_topic(client)
    fill(client, t, 100)
    assert read(spark, urls, subscribe=t).rdd.getNumPartitions() == 3
    assert read(spark, urls, subscribe=t, minPartitions="10").rdd.getNumPartitions() >= 10
    assert "minPartitions" in refused(lambda: read(spark, urls, subscribe=t, minPartitions="0").count())


def test_maxRecordsPerPartition(spark, urls, client):
    t = new_topic(client)
    fill(client, t, 100)
    df = read(spark, urls, subscribe=t, maxRecordsPerPartition="25")
    assert df.rdd.getNumPartitions() == 12 and df.count() == 300


@pytest.mark.parametrize("name", ["groupIdPrefix", "kafka.group.id"])
def test_group_options_are_accepted_and_unused(spark, urls, client, name):
    """ring's source reads partitions directly, as Kafka's does; it joins no consumer group."""
    t = new_topic(client, 1)
    fill(client, t, 3, 1)
    assert read(spark, urls, subscribe=t, **{name: "my-group"}).count() == 3


def test_includeHeaders(spark, urls, client, tmp_path):
    t = new_topic(client, 1)
    client.produce(t, [{"value": b"h", "headers": [["a", b"1"], ["b", b"2"], ["a", b"3"], ["n", None]]},
                       {"value": b"none"}], partition=0)
    assert "headers" not in read(spark, urls, subscribe=t).columns
    df = read(spark, urls, subscribe=t, includeHeaders="true")
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    got = {r.offset: r.headers for r in df.collect()}
    assert [(h.key, h.value) for h in got[0]] == [("a", b"1"), ("b", b"2"), ("a", b"3"), ("n", None)]
    assert got[1] is None
    q = (spark.readStream.format("ring").option("brokers", urls).option("subscribe", t)
         .option("startingOffsets", "earliest").option("includeHeaders", "true").load()
         .selectExpr("offset", "headers").writeStream.format("memory").queryName("par_headers")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(WAIT_S) and q.exception() is None
    assert [len(r.headers or []) for r in spark.sql("select * from par_headers order by offset").collect()] == [4, 0]


def test_startingOffsetsByTimestampStrategy(spark, urls, client, tmp_path):
    t = new_topic(client)
    fill(client, t, 10)
    client.produce(t, [{"value": b"late", "timestamp": T0 + 5_000}], partition=1)
    late = str(T0 + 1_000)
    assert "startingTimestamp" in refused(
        lambda: read(spark, urls, subscribe=t, startingTimestamp=late).count())  # default: error
    df = read(spark, urls, subscribe=t, startingTimestamp=late, startingOffsetsByTimestampStrategy="LATEST")
    assert offsets(df) == {1: [10]}  # partitions without a match start at latest
    rows = run_stream(spark, urls, "par_strategy", tmp_path / "ck", subscribe=t, startingTimestamp=late,
                      startingOffsetsByTimestampStrategy="latest")
    assert [(r[1], r[2]) for r in rows] == [(1, 10)]
    assert "startingOffsetsByTimestampStrategy" in refused(
        lambda: read(spark, urls, subscribe=t, startingTimestamp=late, startingOffsetsByTimestampStrategy="soon").count())


# --- source columns ---------------------------------------------------------------------------


def test_source_columns(spark, urls, client):
    t = new_topic(client, 1)
    client.produce(t, [{"key": b"k", "value": b"v", "timestamp": T0}, {"key": b"k"}], partition=0)
    df = read(spark, urls, subscribe=t)
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int>")
    rows = df.selectExpr("key", "value", "topic", "partition", "offset", "unix_millis(timestamp)",
                         "timestampType").collect()
    assert tuple(rows[0]) == (b"k", b"v", t, 0, 0, T0, 0)
    assert rows[1].value is None  # a record without a value (a tombstone)
    custom = spark.read.format("ring").schema("value string").option("brokers", urls).option("subscribe", t)
    assert "schema" in refused(lambda: custom.load().count())


# --- the sink -----------------------------------------------------------------------------------


def test_sink_kafka_bootstrap_servers(spark, cluster, urls, client):
    t = new_topic(client, 1)
    hostports = ",".join(m.url.removeprefix("http://") for m in cluster)
    df = spark.createDataFrame([("x",), ("y",)], "value string")
    (df.write.format("ring").option("kafka.bootstrap.servers", hostports).option("kafka.acks", "all")
     .option("topic", t).mode("append").save())
    assert read(spark, urls, subscribe=t).count() == 2
    assert "brokers" in refused(lambda: df.write.format("ring").option("topic", t).mode("append").save())


def test_sink_topic(spark, urls, client):
    a, b = new_topic(client, 1), new_topic(client, 1)
    df = spark.createDataFrame([(b, "x"), (b, "y")], "topic string, value string")
    df.write.format("ring").option("brokers", urls).option("topic", a).mode("append").save()
    assert read(spark, urls, subscribe=a).count() == 2  # the option wins over the column
    assert read(spark, urls, subscribe=b).count() == 0
    no_topic = spark.createDataFrame([("x",)], "value string")
    assert "topic" in refused(lambda: no_topic.write.format("ring").option("brokers", urls).mode("append").save())


def test_sink_includeHeaders(spark, urls, client):
    """Accepted by the sink, as by Kafka's: a headers column is written whether or not it is set."""
    t = new_topic(client, 1)
    df = spark.createDataFrame([("v", [("a", b"1"), ("a", b"2")])],
                               "value string, headers array<struct<key:string,value:binary>>")
    for flag in ("true", "false"):
        df.write.format("ring").option("brokers", urls).option("topic", t).option("includeHeaders", flag) \
            .mode("append").save()
    got = read(spark, urls, subscribe=t, includeHeaders="true").collect()
    assert [[(h.key, h.value) for h in r.headers] for r in got] == [[("a", b"1"), ("a", b"2")]] * 2


def test_sink_columns(spark, urls, client):
    """key (string or binary, null allowed), value (null writes a tombstone), headers (ordered,
    repeats kept), topic column, partition column (null: placed by key, as the producer does)."""
    from ring.hashing import partition_for_key

    t = new_topic(client, 4)
    rows = [("k1", "v1", [("a", b"1"), ("b", b"2"), ("a", b"3")], t, 3),
            ("k2", None, None, t, None),
            (None, "v3", [("n", None)], t, 0)]
    df = spark.createDataFrame(rows, "key string, value string, headers array<struct<key:string,value:binary>>, "
                                     "topic string, partition int")
    df.write.format("ring").option("brokers", urls).mode("append").save()
    got = {r.key: r for r in read(spark, urls, subscribe=t, includeHeaders="true").collect()}
    assert got[b"k1"].partition == 3 and [(h.key, h.value) for h in got[b"k1"].headers] == [
        ("a", b"1"), ("b", b"2"), ("a", b"3")]
    assert got[b"k2"].value is None and got[b"k2"].partition == partition_for_key(b"k2", 4)
    assert got[None].partition == 0 and [(h.key, h.value) for h in got[None].headers] == [("n", None)]


def test_sink_stream(spark, urls, client, tmp_path):
    src, dst = new_topic(client, 2), new_topic(client, 2)
    client.produce(src, [{"key": b"k", "value": None}, {"key": b"k", "value": b"v",
                                                       "headers": [["h", b"1"], ["h", b"2"]]}], partition=0)
    q = (spark.readStream.format("ring").option("brokers", urls).option("subscribe", src)
         .option("startingOffsets", "earliest").option("includeHeaders", "true").load()
         .select("key", "value", "headers").writeStream.format("ring").option("brokers", urls)
         .option("topic", dst).option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(WAIT_S) and q.exception() is None
    got = read(spark, urls, subscribe=dst, includeHeaders="true").orderBy("offset").collect()
    assert Counter(r.value for r in got) == Counter([None, b"v"])
    (with_headers,) = [r for r in got if r.value]
    assert [(h.key, h.value) for h in with_headers.headers] == [("h", b"1"), ("h", b"2")]
