"""Changing a topic's settings (PATCH /v1/topics/{topic}) and growing its partitions, by hand and ``auto``.

On one broker: every bad change is a 400/404 that changes nothing, a change survives a restart, and a
new retention reaches the open logs. On three real brokers: a change made on one broker reaches the
others by gossip; growth opens the new partitions on their replicas with elected leaders while every
existing partition keeps its replicas and records; keys move only to the new partitions (jump hash);
a broker that was down while the topic grew opens the new partitions when it comes back; and an
``auto`` topic grows when a consumer group has more members than partitions for the grace period.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import orjson
import pytest

from ring.catalog import TopicConfig
from ring.cluster.node import ClusterBroker
from ring.hashing import partition_for_key
from ring.produce import Produce, Records
from ring.replication.intake import results_of
from tests.brokers import Http, Member, TestBroker, TestCluster
from tests.support import lone_broker, wait_for


def patch(http: Http, topic: str, body: Any) -> Any:
    return http.request("PATCH", f"/v1/topics/{topic}", json_body=body)


# --- one broker ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_change_settings_and_grow_on_one_broker(make_broker: Any, topic: str) -> None:
    b: TestBroker = make_broker("--fsync", "always")
    assert b.http.create_topic(topic, partitions=2, replication_factor=1).status == 201
    assert b.http.produce(topic, b'["a", "b"]', partition=1).status == 200

    r = patch(b.http, topic, {"retention_ms": 3_600_000, "retention_bytes": 1 << 20, "consistency": "one",
                              "compression": "zstd", "partitions": 3})
    assert r.status == 200, r.body
    doc = r.json()
    assert (doc["retention_ms"], doc["retention_bytes"], doc["consistency"], doc["compression"]) == \
        (3_600_000, 1 << 20, "one", "zstd")
    assert doc["partition_count"] == 3 and doc["base_partitions"] == 2 and doc["auto_partitions"] is False
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    assert b.http.produce(topic, b'["c"]', partition=2).status == 200
    assert [r["value"] for r in b.http.fetch(topic, 1).json()["records"]] == ["a", "b"]

    before = b.http.get(f"/v1/topics/{topic}").json()
    for body, status, field in [
        ({"partitions": 1}, 400, "partitions"),  # never shrinks
        ({"partitions": 0}, 400, "partitions"),
        ({"partitions": 100_000}, 400, "partitions"),
        ({"partitions": "many"}, 400, "partitions"),
        ({"replication_factor": 2}, 400, "replication_factor"),  # fixed at creation
        ({"segment_bytes": 1 << 20}, 400, "segment_bytes"),
        ({"name": "other"}, 400, "name"),
        ({"retention_ms": 0}, 400, "retention_ms"),
        ({"consistency": "most"}, 400, "consistency"),
        ({"auto_partitions": "yes"}, 400, "auto_partitions"),
        ({"base_partitions": 1}, 400, None),  # the broker's own field
        ({}, 400, None),
        ([], 400, None),
    ]:
        r = patch(b.http, topic, body)
        assert r.status == status, (body, r.status, r.body)
        err = r.json()
        assert err["error"] == "bad_request" and err["message"], err
        if field is not None:
            assert err.get("field") == field or field in err["message"], (body, err)
    r = b.http.request("PATCH", f"/v1/topics/{topic}", body=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status == 400
    assert patch(b.http, "no-such-topic", {"retention_ms": 1000}).status == 404
    assert patch(b.http, "bad/name", {"retention_ms": 1000}).status in (400, 404)
    assert b.http.get(f"/v1/topics/{topic}").json() == before  # refused changes changed nothing

    # "auto" keeps the count and turns growth on; the same value twice is no change.
    doc = patch(b.http, topic, {"partitions": "auto"}).json()
    assert doc["partition_count"] == 3 and doc["auto_partitions"] is True
    assert patch(b.http, topic, {"partitions": 3}).json() == doc

    assert b.stop() == 0
    b.start()
    doc = b.http.get(f"/v1/topics/{topic}").json()
    assert doc["partition_count"] == 3 and doc["retention_ms"] == 3_600_000 and doc["auto_partitions"] is True
    assert [r["value"] for r in b.http.fetch(topic, 2).json()["records"]] == ["c"]


@pytest.fixture
async def local_broker(tmp_path: Path) -> AsyncIterator[ClusterBroker]:
    b = await lone_broker(tmp_path / "b", "never")
    try:
        yield b
    finally:
        await b.close()


async def test_a_new_retention_reaches_the_open_logs(local_broker: ClusterBroker) -> None:
    b = local_broker
    await b.add_topic(TopicConfig(name="t", partitions=1, segment_bytes=4096, replication_factor=1))
    value = b"x" * 1000
    for _ in range(20):
        await results_of("t", b.intake.produce(Produce("t", Records([(None, None, value, None)], [len(value)], False, False), 0)))
    part = b._parts["t"][0]
    assert part.log.enforce_retention(b.clock.wall_ms(), upto=part.hw) == 0  # unlimited by size: nothing goes
    assert part.log.start_offset == 0

    await b.change_topic("t", {"retention_bytes": 5000})
    assert part.log.config.retention_bytes == 5000
    assert part.log.enforce_retention(b.clock.wall_ms(), upto=part.hw) > 0
    assert part.log.start_offset > 0
    assert b.describe_topic("t")["partitions"][0]["earliest_offset"] == part.log.start_offset


# --- three brokers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path_factory.mktemp("growth"), 3,
                    args=["--fsync", "interval:100", "--auto-partitions-grace-s", "2"])
    c.start()
    try:
        yield c
    finally:
        c.kill()


def keyed(m: Member, topic: str, keys: list[str]) -> dict[str, int]:
    """Produce one record per key (quorum); key -> the partition it went to."""
    out = {}
    for k in keys:
        r = m.http.produce(topic, orjson.dumps([k]), key=k, consistency="quorum")
        assert r.status == 200, r.body
        out[k] = r.json()["partition"]
    return out


def fetch_all(m: Member, topic: str, p: int) -> list[Any]:
    r = m.http.fetch(topic, p, max_bytes=1 << 20)
    assert r.status == 200, r.body
    return [(rec["key"], rec["value"]) for rec in r.json()["records"]]


@pytest.mark.integration
def test_growth_keeps_partitions_and_moves_keys_only_to_new_ones(cluster: TestCluster, topic: str) -> None:
    c = cluster
    assert c[0].http.create_topic(topic, partitions=3).status == 201
    keys = [f"user-{i}" for i in range(60)]
    before = keyed(c[1], topic, keys)
    assert before == {k: partition_for_key(k.encode(), 3) for k in keys}
    old = c[0].http.describe(topic)
    stored = {p: fetch_all(c[0], topic, p) for p in range(3)}

    r = patch(c[1].http, topic, {"partitions": 5, "retention_ms": 86_400_000})
    assert r.status == 200, r.body
    doc = r.json()
    assert doc["partition_count"] == 5 and doc["base_partitions"] == 3
    assert all(p["leader"] for p in doc["partitions"]), doc["partitions"]  # answered once they have leaders
    for m in c:  # gossip brings the change to every broker
        got = wait_for(f"{m.name} to see 5 partitions",
                       lambda m=m: (d := m.http.describe(topic))["partition_count"] == 5 and d)
        assert got["retention_ms"] == 86_400_000
        assert [p["replicas"] for p in got["partitions"][:3]] == [p["replicas"] for p in old["partitions"]]
        assert all(len(p["replicas"]) == 3 for p in got["partitions"])
    for p in range(3):  # nothing moved or went missing
        assert fetch_all(c[2], topic, p) == stored[p]

    after = keyed(c[2], topic, keys)
    assert after == {k: partition_for_key(k.encode(), 5) for k in keys}
    moved = {k for k in keys if after[k] != before[k]}
    assert moved and all(after[k] in (3, 4) for k in moved)  # keys only move to the new partitions
    for p in (3, 4):
        assert sorted(fetch_all(c[0], topic, p)) == sorted((k, k) for k in keys if after[k] == p)


@pytest.mark.integration
def test_a_broker_down_while_a_topic_grows_opens_the_new_partitions_when_back(cluster: TestCluster,
                                                                              topic: str) -> None:
    c = cluster
    assert c[0].http.create_topic(topic, partitions=2).status == 201
    down = c[2]
    down.kill()
    c.wait_statuses({down.name: "down"}, observers=[c[0], c[1]])
    r = patch(c[0].http, topic, {"partitions": 4})
    assert r.status == 200, r.body
    for p in (2, 3):  # quorum holds with two of three replicas
        r = c[1].http.produce(topic, orjson.dumps([f"v{p}"]), partition=p, consistency="quorum")
        assert r.status == 200, r.body
    down.restart()
    c.wait_statuses({m.name: "up" for m in c})
    doc = wait_for(f"{down.name} to open 4 partitions",
                   lambda: (d := down.http.describe(topic))["partition_count"] == 4
                   and all(p["end_offset"] is not None for p in d["partitions"]) and d)
    assert doc["base_partitions"] == 2
    for p in (2, 3):  # it catches up on what was written meanwhile
        wait_for(f"{down.name} to hold {topic}/{p}", lambda p=p: fetch_all(down, topic, p) == [(None, f"v{p}")])


@pytest.mark.integration
def test_an_auto_topic_grows_to_one_partition_per_consumer(cluster: TestCluster, topic: str) -> None:
    c = cluster
    r = c[0].http.post("/v1/topics", json_body={"name": topic, "partitions": "auto"})
    assert r.status == 201, r.body
    assert r.json()["partition_count"] == 1 and r.json()["auto_partitions"] is True
    group = "g-" + topic

    def join(i: int) -> Any:
        # The module's earlier tests restart brokers: a coordinator may be moving back to its natural
        # leader, which answers 503 not_leader with Retry-After, as a client is told to retry.
        r = c[i].http.post(f"/v1/groups/{group}/members", json_body={"consumer": f"c{i}", "topics": [topic]})
        assert r.status in (200, 503), r.body
        return r.status == 200 and r.json()

    for i in range(3):
        wait_for(f"c{i} to join", lambda i=i: join(i))

    def spread() -> Any:
        docs = []
        for i in range(3):  # joining again is the heartbeat, and answers the current assignment
            doc = join(i)
            if not doc:
                return None
            docs.append(doc)
        owned = [sorted(a["partition"] for a in d["assignment"]) for d in docs]
        return owned if sorted(owned) == [[0], [1], [2]] else None

    owned = wait_for("the topic to grow and the group to spread over it", spread)
    assert sorted(p for o in owned for p in o) == [0, 1, 2]
    assert c[1].http.describe(topic)["partition_count"] == 3
    # Records produced to each partition reach the consumer that owns it.
    for p in range(3):
        assert c[p].http.produce(topic, orjson.dumps([f"r{p}"]), partition=p).status == 200
    for i in range(3):
        def got(i: int = i) -> Any:
            r = c[i].http.post(f"/v1/groups/{group}/members/c{i}/poll", query={"wait_ms": 500})
            return r.status == 200 and [rec["value"] for rec in r.json()["records"]]
        assert wait_for(f"c{i}'s record", got) == [f"r{owned[i][0]}"]


@pytest.mark.integration
def test_the_internal_offsets_topic_can_be_read_but_not_changed(http: Http, topic: str) -> None:
    assert http.create_topic(topic, partitions=1).status == 201
    r = http.post(f"/v1/groups/g-{topic}/members", json_body={"consumer": "c", "topics": [topic]})
    assert r.status == 200, r.body  # the first group creates __offsets
    settings = ("partition_count", "retention_ms", "created_ms")
    before = {k: http.get("/v1/topics/__offsets").json()[k] for k in settings}
    for r in (http.request("PATCH", "/v1/topics/__offsets", json_body={"partitions": 64}),
              http.request("PATCH", "/v1/topics/__offsets", json_body={"retention_ms": 1000}),
              http.delete("/v1/topics/__offsets"),
              http.produce("__offsets", b'["forged"]', partition=0),
              http.create_topic("__offsets")):
        assert r.status in (400, 409), (r.status, r.body)
        if r.status == 400:
            assert "internal" in r.json()["message"], r.body
    assert {k: http.get("/v1/topics/__offsets").json()[k] for k in settings} == before
    assert http.fetch("__offsets", 0).status == 200
