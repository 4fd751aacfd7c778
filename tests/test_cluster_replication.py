"""Three real brokers on loopback (one shared cluster): topics appear everywhere, produces
are forwarded to leaders, every record is readable from every broker, and after the load
the three replicas of each partition hold the same batches in the same order."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from ring import limits
from ring.hashing import broker_token, partition_for_key
from tests.brokers import TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

NAMES = ["ring-0", "ring-1", "ring-2"]
WAIT_S = 15.0


def _replicas_identical(c: TestCluster, topic: str, partitions: int) -> dict[int, int]:
    """Wait (bounded) until every broker's replica of each partition has the same bytes; the ends."""
    deadline = time.monotonic() + WAIT_S
    while True:
        logs = {p: [m.replica_log(topic, p) for m in c] for p in range(partitions)}
        if all(len(set(copies)) == 1 for copies in logs.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for p, copies in logs.items():
        ends = [end for _, end in copies]
        assert len(set(ends)) == 1, (p, ends)
        assert len({data for data, _ in copies}) == 1, f"replicas of {topic}/{p} differ"
    return {p: copies[0][1] for p, copies in logs.items()}


def test_cluster_view_lists_every_broker_up_with_its_token(shared_cluster: TestCluster) -> None:
    for m in shared_cluster:
        doc = m.http.get("/v1/cluster").json()
        assert doc["self"] == m.name
        brokers = {b["name"]: b for b in doc["brokers"]}
        assert sorted(brokers) == NAMES
        for name, b in brokers.items():
            assert b["status"] == "up" and b["token"] == broker_token(int(name[-1]))
            assert isinstance(b["phi"], float) and b["phi"] < 5
            assert b["client_url"].startswith("http://127.0.0.1:") and b["peer_url"].startswith("http://127.0.0.1:")
            assert isinstance(b["generation"], int) and isinstance(b["load"], dict)
        assert brokers[m.name]["client_url"] == m.url
        assert m.http.get("/v1/status").json()["status"] == "ok"


def test_topic_created_on_one_broker_is_known_to_all_and_described(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    r = c[1].http.create_topic(topic, partitions=6, replication_factor=3, consistency="all")
    assert r.status == 201, r.body
    for m in c:  # the 201 came after every live broker had the topic
        doc = m.http.get(f"/v1/topics/{topic}").json()
        assert doc["consistency"] == "all" and doc["partition_count"] == 6
    assert c[2].http.create_topic(topic).status == 409
    leaders = c.leaders(topic)
    assert sorted(leaders.values()) == sorted(NAMES * 2)  # leadership spread evenly
    for m in c:
        for i, p in enumerate(m.http.get(f"/v1/topics/{topic}").json()["partitions"]):
            assert p["replicas"][0] == p["leader"] and sorted(p["replicas"]) == NAMES
            assert p["epoch"] == 1 and p["high_watermark"] == 0 and set(p["replica_end_offsets"]) == set(NAMES)
            if p["leader"] == m.name:  # the leader's view is complete once each follower's link has reported
                def reported(m=m, i=i) -> dict | None:
                    q = m.http.get(f"/v1/topics/{topic}").json()["partitions"][i]
                    return q if None not in q["replica_end_offsets"].values() else None
                view = wait_for(f"{m.name}'s view of its followers' ends", reported, 30)
                assert view["replica_end_offsets"] == {n: 0 for n in NAMES}
    assert c[0].http.delete(f"/v1/topics/{topic}").status == 200
    # The delete waits up to CLUSTER_ANNOUNCE_TIMEOUT_S for a direct exchange with each broker; a broker
    # the machine's load kept from answering in that time hears it by gossip.
    for m in c:
        wait_for(f"{m.name} forgets {topic}", lambda m=m: m.http.get(f"/v1/topics/{topic}").status == 404)


def test_load_through_every_broker_is_readable_everywhere_and_replicas_match(
        shared_cluster: TestCluster, topic: str) -> None:
    c, partitions = shared_cluster, 6
    assert c[0].http.create_topic(topic, partitions=partitions, replication_factor=3).status == 201
    leaders = c.leaders(topic)

    def one(i: int) -> list[tuple[int, int, object]]:
        m = c[i % 3]  # each broker in turn
        values = [{"req": i, "n": n} for n in range(1 + i % 4)]
        query: dict[str, object] = {"consistency": ("one", "quorum", "all")[i % 3]}
        if i % 3 == 0:
            query["key"] = f"user-{i}"
        elif i % 3 == 1:
            query["partition"] = i % partitions
        r = m.http.produce(topic, orjson.dumps(values), **query)
        assert r.status == 200, (m.name, r.body)
        doc = r.json()
        if "key" in query:
            assert doc["partition"] == partition_for_key(str(query["key"]).encode(), partitions)
        elif "partition" not in query:  # unkeyed: a partition the receiving broker leads, not forwarded
            assert leaders[doc["partition"]] == m.name
        return [(doc["partition"], doc["base_offset"] + n, v) for n, v in enumerate(values)]

    with ThreadPoolExecutor(6) as pool:
        sent = [rec for recs in pool.map(one, range(150)) for rec in recs]
    expected: dict[int, dict[int, object]] = {p: {} for p in range(partitions)}
    for p, offset, value in sent:
        assert offset not in expected[p], "an offset was given twice"
        expected[p][offset] = value
    for m in c:  # the leader and both followers serve every acknowledged record
        for p in range(partitions):
            assert m.http.read_all(topic, p, end=len(expected[p]), timeout_s=WAIT_S) == expected[p], (m.name, p)
    ends = _replicas_identical(c, topic, partitions)
    assert ends == {p: len(expected[p]) for p in range(partitions)}
    # raw batches a client reads from any broker are those bytes too
    for p in range(partitions):
        r = c[(p + 1) % 3].http.fetch(topic, p, accept="application/vnd.ring.batches", offset=0,
                                      max_bytes=16 << 20)
        assert r.status == 200 and r.body == c[0].replica_log(topic, p)[0]


def test_partitions_held_elsewhere_are_proxied(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    assert c[2].http.create_topic(topic, partitions=3, replication_factor=1).status == 201
    holders = c.leaders(topic)
    for p in range(3):  # produce through a broker that does not hold it
        via = next(m for m in c if m.name != holders[p])
        r = via.http.produce(topic, orjson.dumps([f"v{p}"]), partition=p)
        assert r.status == 200 and r.json()["base_offset"] == 0, r.body
    for m in c:
        for p in range(3):
            doc = m.http.fetch(topic, p).json()
            assert [r["value"] for r in doc["records"]] == [f"v{p}"] and doc["high_watermark"] == 1
        for p in m.http.get(f"/v1/topics/{topic}").json()["partitions"]:
            held = p["leader"] == m.name
            assert (p["end_offset"] == 1) if held else (p["end_offset"] is None), (m.name, p)
        r = m.http.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": "latest"})
        assert r.status == 200 and r.json()["offset"] == 1


def test_bad_consistency_is_400_before_anything_is_written(shared_cluster: TestCluster, topic: str) -> None:
    m = shared_cluster[0]
    assert m.http.create_topic(topic, partitions=1, consistency="most").status == 400
    assert m.http.create_topic(topic, partitions=1).status == 201
    r = m.http.produce(topic, b"1", consistency="QUORUM")
    assert r.status == 400 and r.json()["error"] == "bad_request"
    assert m.http.get(f"/v1/topics/{topic}").json()["partitions"][0]["end_offset"] == 0


@pytest.mark.slow
def test_a_leader_that_closed_its_link_to_a_broker_on_purpose_still_takes_its_produces(make_cluster) -> None:
    """A leader closes its replication link to a broker once it leads nothing that broker replicates
    (here: the only such topic is deleted). That broker still forwards produces to it: a link closed on
    purpose does not make its leader unreachable, as one lost to a crash or a cut does."""
    c: TestCluster = make_cluster(3)
    assert c[0].http.create_topic("shared", partitions=1, replication_factor=3).status == 201
    assert c[0].http.create_topic("single", partitions=6, replication_factor=1).status == 201
    leader = c[0].http.describe("shared")["partitions"][0]["leader"]
    led = [p["partition"] for p in c[0].http.describe("single")["partitions"] if p["leader"] == leader]
    other = next(m for m in c if m.name != leader)
    assert led and leader is not None
    r = other.http.produce("shared", orjson.dumps(["linked"]), partition=0, consistency="all")
    assert r.status == 200, r.body  # the leader's link to ``other`` is open
    assert c[0].http.delete("/v1/topics/shared").status in (200, 202, 204)
    # The leader retires its link to ``other``; well past the grace a lost link gets, produces go through.
    deadline = time.monotonic() + 3 * limits.LINK_LOSS_GRACE_MS / 1000
    while time.monotonic() < deadline:
        r = other.http.produce("single", orjson.dumps(["after"]), partition=led[0])
        assert r.status == 200, r.body
        time.sleep(0.1)
