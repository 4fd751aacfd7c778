"""Spark's own Kafka source (``format("kafka")``, spark-sql-kafka-0-10 from Maven
Central) reading ring through its Kafka listener: three real brokers, each with
``--kafka-listen``, and ``kafka.bootstrap.servers`` naming the three listeners.
Records are produced over ring's HTTP API; what Spark's Kafka source reads is
compared with what sparkio reads of the same query, and a checkpointed stream
stopped and restarted reads every record once.
"""

from __future__ import annotations

import pytest

from sparkio.client import BrokerClient
from tests.spark.conftest import read_df
from tests.support import wait_for
from tests.test_kafka_listener import kafka_cluster, led_topic

pytestmark = [pytest.mark.integration, pytest.mark.kafka_source]

T0 = 1_700_000_000_000
WAIT_S = 60.0
PARTITIONS = 3
COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    cluster, bootstraps = kafka_cluster(tmp_path_factory.mktemp("spark-kafka"))
    cluster.bootstrap = ",".join(bootstraps)
    cluster.urls = ",".join(m.url for m in cluster)
    yield cluster
    cluster.stop()


def records(n: int, first: int = 0) -> list[dict]:
    """Keys (some absent), values (some null), headers (names repeated, a null value, or none)
    and timestamps of their own."""
    out = []
    for i in range(first, first + n):
        rec: dict = {"value": None if i % 7 == 3 else b"v%d" % i, "timestamp": T0 + 10 * i}
        if i % 5:
            rec["key"] = b"k%d" % (i % 4)
        if i % 3 == 0:
            rec["headers"] = [["h", b"%d" % i], ["h", b"again"], ["nil", None]]
        elif i % 3 == 1:
            rec["headers"] = [["only", b"one"]]
        out.append(rec)
    return out


def fill(cluster, topic: str, per_partition: int, first: int = 0) -> None:
    """Over ring's HTTP API."""
    with BrokerClient([m.url for m in cluster]) as client:
        for p in range(PARTITIONS):
            client.produce(topic, records(per_partition, first), partition=p)


def kafka_read(spark, cluster, **options):
    r = spark.read.format("kafka").option("kafka.bootstrap.servers", cluster.bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def every_request_was_served(cluster) -> bool:
    """No broker closed a Kafka connection for a request it does not serve (an API or version
    outside KAFKA.md's table) or one it could not parse: what Spark's Kafka source asked, ring answered."""
    closed = [line for b in cluster.local.brokers for line in b.log_path.read_text(errors="replace").splitlines()
              if "closing a Kafka connection" in line]
    assert not closed, closed
    return True


def rows(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.select(*COLUMNS).collect()), key=lambda r: (r[3], r[4]))


def test_a_batch_query_reads_what_sparkio_reads(spark, ring):
    topic = "spark-kafka-batch"
    led_topic(ring, ring.bootstrap.split(","), topic, PARTITIONS)
    fill(ring, topic, 20)
    query = {"subscribe": topic, "includeHeaders": "true",
             "startingOffsets": f'{{"{topic}": {{"0": 2, "1": -2, "2": 15}}}}',
             "endingOffsets": f'{{"{topic}": {{"0": 12, "1": -1, "2": 20}}}}'}
    through_kafka = rows(kafka_read(spark, ring, **query))
    assert [(r[3], r[4]) for r in through_kafka] == (
        [(0, o) for o in range(2, 12)] + [(1, o) for o in range(20)] + [(2, o) for o in range(15, 20)])
    assert through_kafka == rows(read_df(spark, ring.urls, **query))
    by_offset = {(r[3], r[4]): r for r in through_kafka}
    assert by_offset[(1, 3)][1] is None  # a null value
    assert by_offset[(1, 0)][0] is None  # no key
    assert [tuple(h) for h in by_offset[(1, 0)][7]] == [("h", b"0"), ("h", b"again"), ("nil", None)]
    assert by_offset[(1, 2)][7] is None  # no headers
    assert every_request_was_served(ring)
    assert [(int(by_offset[(1, i)][5].timestamp() * 1000), by_offset[(1, i)][6]) for i in (0, 19)] == [
        (T0, 0), (T0 + 190, 0)]  # the producer's timestamps, CreateTime


def test_a_stream_stopped_and_restarted_from_its_checkpoint_reads_every_record_once(spark, ring, tmp_path):
    topic = "spark-kafka-stream"
    led_topic(ring, ring.bootstrap.split(","), topic, PARTITIONS)
    fill(ring, topic, 40)

    def start(trigger: dict):
        return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", ring.bootstrap)
                .option("subscribe", topic).option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "30").load()
                .selectExpr("partition", "offset", "cast(value as string) value").writeStream.format("parquet")
                .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(**trigger).start())

    first = start({"processingTime": "20 seconds"})  # one batch at once, the next long after the stop
    try:
        wait_for("a first batch", lambda: any(p["numInputRows"] for p in first.recentProgress), WAIT_S)
    finally:
        first.stop()
    assert first.exception() is None
    read_first = sum(p["numInputRows"] for p in first.recentProgress)
    assert read_first == 30, "stopped after its first batch, part way"
    fill(ring, topic, 10, first=40)
    second = start({"availableNow": True})
    assert second.awaitTermination(WAIT_S) and second.exception() is None
    got = [tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    expected = [(p, i, None if i % 7 == 3 else f"v{i}") for p in range(PARTITIONS) for i in range(50)]
    assert sorted(got, key=lambda r: r[:2]) == expected  # every record, once
    assert every_request_was_served(ring)


def test_the_connector_from_the_cache_is_only_the_jars_pyspark_does_not_ship(tmp_path, monkeypatch):
    """A cached connector needs neither mvn nor the network, and Spark keeps its own Scala, Hadoop and
    compression jars: only the connector, its token provider, kafka-clients and commons-pool2 are added."""
    from ring.bench import spark_kafka_jars

    version = spark_kafka_jars.FALLBACK
    monkeypatch.setattr(spark_kafka_jars, "pyspark_version", lambda: "0.0.0-not-on-maven-central")
    monkeypatch.setenv("RING_BENCH_CACHE", str(tmp_path))
    lib = tmp_path / f"spark-kafka-{version}" / "lib"
    lib.mkdir(parents=True)
    copied = [f"spark-sql-kafka-0-10_2.13-{version}.jar", f"spark-token-provider-kafka-0-10_2.13-{version}.jar",
              "kafka-clients-3.9.2.jar", "commons-pool2-2.13.1.jar", "scala-library-2.13.15.jar",
              "hadoop-client-runtime-3.5.0.jar", "snappy-java-1.1.10.5.jar", f"spark-tags_2.13-{version}.jar"]
    for jar in copied:
        (lib / jar).write_bytes(b"")
    (lib.parent / "lib.complete").write_text(version)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no java, no mvn, no apt-get to be found
    assert spark_kafka_jars.jars() == (version, sorted(str(lib / j) for j in copied[:4]))
    assert (f"<artifactId>{spark_kafka_jars.ARTIFACT}</artifactId><version>{version}</version>"
            in spark_kafka_jars.pom(version))
