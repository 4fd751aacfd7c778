"""spark.readStream.format("ring"): rate-limited Trigger.AvailableNow, and a
query stopped mid-stream and restarted from its checkpoint reading every
record exactly once, including a topic that appeared in between and a
partition added to a topic it was reading.

The sink is Spark's parquet file sink, whose commit log makes replays of a
planned batch idempotent; with it, exactly-once end to end rests on the
source replaying exactly the offsets it logged.
"""

from __future__ import annotations

import time
from collections import Counter

from tests.brokers import Http
from tests.spark.conftest import produce_numbered

WAIT_S = 60


def start(spark, broker, out, checkpoint, trigger, **options):
    reader = spark.readStream.format("ring").option("brokers", broker.url).option("startingOffsets", "earliest")
    for k, v in options.items():
        reader = reader.option(k, v)
    return (reader.load().selectExpr("topic", "partition", "offset", "cast(value as string) value")
            .writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())


def rows(spark, out) -> Counter:
    df = spark.read.parquet(str(out))
    return Counter((r.topic, r.partition, r.offset) for r in df.collect())


def test_available_now_with_rate_limit(spark, broker, client, topic, tmp_path):
    t = topic(3)
    produce_numbered(client, t, 500)
    q = start(spark, broker, tmp_path / "out", tmp_path / "ck", {"availableNow": True},
              subscribe=t, maxOffsetsPerTrigger="120")
    assert q.awaitTermination(WAIT_S), "availableNow query did not finish"
    assert q.exception() is None
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 500 and max(sizes) <= 120 and len(sizes) == 5, sizes
    got = rows(spark, tmp_path / "out")
    assert len(got) == 500 and set(got.values()) == {1}


def test_stop_produce_restart_reads_each_record_once(spark, broker, client, topic, tmp_path):
    first = topic(2, prefix="restart-a")
    produce_numbered(client, first, 600)
    out, ck = tmp_path / "out", tmp_path / "ck"
    opts = dict(subscribePattern="restart-.*", maxOffsetsPerTrigger="50")
    q = start(spark, broker, out, ck, {"processingTime": "0 seconds"}, **opts)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and len([p for p in q.recentProgress if p["numInputRows"]]) < 2:
        time.sleep(0.2)
    q.stop()  # mid-stream: the last planned batch may not have committed
    assert q.exception() is None
    done = sum(p["numInputRows"] for p in q.recentProgress)
    assert 100 <= done < 600, "the query was meant to stop half way"

    grown = Http(broker.host, broker.port).request("PATCH", f"/v1/topics/{first}", json_body={"partitions": 3})
    assert grown.status == 200, grown.body
    produce_numbered(client, first, 200, first=600)  # keyed: some keys now go to the new partition 2
    second = topic(1, prefix="restart-b")  # a topic born while the query was down
    produce_numbered(client, second, 50)
    # The rate limit is a query option, not checkpoint state: drain in one batch.
    q = start(spark, broker, out, ck, {"availableNow": True}, subscribePattern="restart-.*")
    assert q.awaitTermination(WAIT_S), "restarted query did not finish"
    assert q.exception() is None
    got = rows(spark, out)
    assert set(got.values()) == {1}, "some record was read twice"
    assert Counter(t for t, _, _ in got) == {first: 800, second: 50}
    assert {p for t, p, _ in got if t == first} == {0, 1, 2}
