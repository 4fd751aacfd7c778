"""Ranges on real brokers: a partition's closed segments spread over the ring, its replicas keeping a tail.

Segments of 4 KiB make ranges within seconds. Four brokers and a replication
factor of 3 leave one broker that holds no replica of the partition: it
holds ranges all the same, and answers fetches in them.
"""

from __future__ import annotations

import orjson
import pytest

from tests.brokers import Member, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

ARGS = ("--fsync", "interval:100", "--range-interval-s", "0.2", "--repair-interval-s", "1")
SEGMENT = 4096


def ranges(m: Member, topic: str, partition: int = 0) -> dict:
    r = m.http.get(f"/v1/topics/{topic}/partitions/{partition}/ranges")
    assert r.status == 200, (m.name, r.status, r.body)
    return r.json()


def produce(m: Member, topic: str, start: int, n: int) -> None:
    """Records ``v<i>`` for i in [start, start + n), 20 to a request, so segments roll often."""
    for i in range(start, start + n, 20):
        body = orjson.dumps([f"v{j}-" + "x" * 150 for j in range(i, min(i + 20, start + n))])
        r = m.http.produce(topic, body, partition=0, consistency="all")
        assert r.status == 200, r.body


def read_all(m: Member, topic: str, end: int) -> list[str]:
    """Every value of partition 0 from offset 0 to ``end``, through ``m``, in order."""
    out: list[str] = []
    offset = 0
    for _ in range(10 * end):
        if offset >= end:
            break
        r = m.http.fetch(topic, 0, offset=offset, max_records=10_000)
        assert r.status == 200, (m.name, offset, r.status, r.body)
        doc = r.json()
        assert doc["records"], (m.name, offset, doc)
        assert doc["records"][0]["offset"] == offset, (m.name, offset, doc["records"][0])
        out += [rec["value"] for rec in doc["records"]]
        offset = doc["next_offset"]
    return out


def test_ranges_spread_replicas_keep_a_tail_and_every_broker_reads_from_zero(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(4, *ARGS)
    r = c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=SEGMENT,
                               local_retention_bytes=2 * SEGMENT)
    assert r.status == 201, r.body
    produce(c[0], topic, 0, 400)
    replicas = c[0].http.describe(topic)["partitions"][0]["replicas"]
    outsider = next(m for m in c if m.name not in replicas)

    def placed() -> dict | None:
        doc = ranges(c[0], topic)
        done = len(doc["ranges"]) >= 10 and all(len(x["holders"]) == 3 for x in doc["ranges"])
        return doc if done and doc["local_start_offset"] > 0 else None

    doc = wait_for("ranges cut, copied three times, and the local log trimmed", placed, timeout_s=60)
    assert doc["earliest_offset"] == 0
    bases = [x["base_offset"] for x in doc["ranges"]]
    assert bases[0] == 0 and all(a["end_offset"] == b["base_offset"] for a, b in zip(doc["ranges"], doc["ranges"][1:]))
    holders = {h for x in doc["ranges"] for h in x["holders"]}
    assert outsider.name in holders, (outsider.name, doc)  # ranges go where placement says, not to the replicas

    for m in c:  # each replica drops what is safe in ranges, down to its tail
        if m.name in replicas:
            wait_for(f"{m.name} keeps only a tail", lambda m=m: m.http.describe(topic)["partitions"][0]
                     ["local_start_offset"] > 0)
    expected = [f"v{i}-" + "x" * 150 for i in range(400)]
    for m in c:
        assert read_all(m, topic, 400) == expected, m.name
        part = m.http.describe(topic)["partitions"][0]
        if m.name in replicas:
            assert part["earliest_offset"] == 0, (m.name, part)
        earliest = m.http.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": "earliest"})
        assert earliest.status == 200 and earliest.json()["offset"] == 0, (m.name, earliest.body)
        first = m.http.fetch(topic, 0)  # no offset: from the earliest, in a range
        assert first.status == 200 and first.json()["records"][0]["offset"] == 0, (m.name, first.body)
