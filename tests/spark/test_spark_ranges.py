"""A backlog scan of a partition kept in ranges: Spark splits it by range and each task reads from the
range's holders, so the scan's tasks and bytes spread over the cluster, not over three replicas."""

from __future__ import annotations

import pytest

import sparkio
from ring.localcluster import LocalCluster
from sparkio.client import BrokerClient
from tests.spark.conftest import produce_numbered
from tests.support import wait_for

ARGS = ["--fsync", "never", "--range-interval-s", "0.2", "--repair-interval-s", "1", "--log-level", "warning"]


def served_bytes(cluster) -> dict[str, int]:
    """Per broker URL: bytes of fetch answers it read from the range copies it holds."""
    out = {}
    for u in cluster.urls:
        with BrokerClient([u]) as one:
            out[u] = one.request("GET", "/v1/status").json()["ranges"]["served_bytes"]
    return out


def settled(cluster, topic: str) -> dict | None:
    docs = []
    for u in cluster.urls:
        with BrokerClient([u]) as one:
            docs.append(one.ranges(topic, 0))
    d = docs[0]
    done = d["ranges"] and d["ranges"][-1]["end_offset"] == d["local_start_offset"] > 2000 and \
        all(len(x["holders"]) == 3 for x in d["ranges"])
    return d if done and all(x == d for x in docs) else None


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path / "cluster", 4, args=ARGS)
    c.start()
    yield c
    c.stop()


def test_a_backlog_scan_splits_by_range_and_reads_from_the_holders(spark, cluster):
    topic = "scan-by-range"
    with BrokerClient(cluster.urls) as client:
        client.create_topic(topic, 1, replication_factor=3, segment_bytes=4096, local_retention_bytes=0)
        values = produce_numbered(client, topic, 3000, keyed=False, chunk=100)
        # Done: every closed segment is a range on three holders, the replicas keep their active segment,
        # and every broker's answer agrees (a follower's catalogue reaches it a round after its leader's).
        doc = wait_for("ranges copied and the replicas trimmed", lambda: settled(cluster, topic), timeout_s=60)
        replicas = client.describe_topic(topic)["partitions"][0]["replicas"]
        names = {b["name"]: b["client_url"].rstrip("/") for b in client.cluster()}
        served_before = served_bytes(cluster)

    # The broker holding no replica first: the planner asks it first, and it describes the partition's
    # offsets as null (the planner once failed on that).
    outsider = next(n for n in names if n not in replicas)
    order = [names[outsider]] + [u for u in cluster.urls if u != names[outsider]]
    got = sparkio.read_rdd(spark.sparkContext, order, topic)
    # One split per range below the local tail, each to be read from its holders first.
    in_ranges = [s for s in got.ranges if s.end <= doc["local_start_offset"]]
    by_base = {x["base_offset"]: x for x in doc["ranges"]}
    assert len(in_ranges) == len([x for x in doc["ranges"] if x["end_offset"] <= doc["local_start_offset"]])
    for s in in_ranges:
        r = by_base[s.start]
        assert s.end == r["end_offset"]
        assert set(s.urls[:3]) == {names[h] for h in r["holders"]}
    firsts = {s.urls[0] for s in in_ranges}
    assert names[outsider] in firsts and len(firsts) == 4, firsts  # every broker serves part of the scan

    records = got.rdd.collect()
    assert [r.offset for r in records] == list(range(3000))
    assert [r.value for r in records] == values
    served = {u: n - served_before[u] for u, n in served_bytes(cluster).items()}
    assert all(v > 0 for v in served.values()), served

    # The DataFrame source plans the same splits.
    df = spark.read.format("ring").option("brokers", ",".join(cluster.urls)).option("subscribe", topic).load()
    assert df.rdd.getNumPartitions() == len(got.ranges), str([(s.start, s.end) for s in got.ranges])
    assert [r.offset for r in df.select("offset").collect()] == list(range(3000))
