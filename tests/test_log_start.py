"""A partition starts where its leader says: truncation and retention on three real brokers.

The leader alone moves a partition's log start offset (``POST .../truncate``,
retention by its clock and by size); the followers take it through
replication, as they take the high watermark, and then report it and serve
nothing below it. A follower that was down meanwhile takes it when it comes
back.
"""

from __future__ import annotations


import orjson
import pytest

from tests.brokers import Member, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

ARGS = ("--fsync", "interval:100", "--retention-interval-s", "0.5")



def earliest(m: Member, topic: str, partition: int) -> int | None:
    """The earliest offset of this broker's own replica."""
    r = m.http.get(f"/v1/topics/{topic}")
    assert r.status == 200, (m.name, r.body)
    return r.json()["partitions"][partition]["earliest_offset"]


def assert_starts_at(m: Member, topic: str, partition: int, start: int) -> None:
    """``m`` reports ``start`` as the earliest offset and serves from it, never below it."""
    assert earliest(m, topic, partition) == start, m.name
    if start > 0:
        below = m.http.fetch(topic, partition, offset=start - 1)
        assert below.status == 416, (m.name, below.status, below.body)
        assert below.json()["earliest"] == start
    first = m.http.fetch(topic, partition)  # no offset: from the earliest
    assert first.status == 200, (m.name, first.body)
    assert first.json()["records"][0]["offset"] == start, m.name
    at = m.http.get(f"/v1/topics/{topic}/partitions/{partition}/offsets", query={"timestamp": "earliest"})
    assert at.json()["offset"] == start, m.name


def produce(m: Member, topic: str, n: int, size: int = 100) -> None:
    body = orjson.dumps([{"value": "x" * size} for _ in range(n)])
    for _ in range(3):  # a few requests, so the segments roll
        r = m.http.produce(topic, body, partition=0, consistency="all")
        assert r.status == 200, r.body


def three_with_60_records(make_cluster, topic: str) -> tuple[TestCluster, Member, list[Member]]:
    """Three brokers and a partition on all three, offsets 0-59 written: the cluster, its leader, the others."""
    c: TestCluster = make_cluster(3, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=4096).status == 201
    produce(c[0], topic, 20)
    leader = c.member(c.leaders(topic)[0])
    return c, leader, [m for m in c if m is not leader]


def test_truncate_reaches_every_replica_and_a_follower_down_meanwhile_catches_up(make_cluster, topic: str) -> None:
    c, leader, (up, down) = three_with_60_records(make_cluster, topic)
    for m in c:  # every replica holds everything, and starts at 0
        wait_for(f"{m.name} holds offsets 0-59", lambda m=m: m.http.get(f"/v1/topics/{topic}").json()
                 ["partitions"][0]["high_watermark"] == 60)
        assert_starts_at(m, topic, 0, 0)
    down.kill()
    r = up.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 15})  # forwarded
    assert r.status == 200 and r.json()["earliest_offset"] == 15, r.body
    assert_starts_at(leader, topic, 0, 15)
    wait_for(f"{up.name} follows the leader's start", lambda: earliest(up, topic, 0) == 15)
    assert_starts_at(up, topic, 0, 15)
    down.restart()
    wait_for(f"{down.name}, back, follows the leader's start", lambda: earliest(down, topic, 0) == 15)
    assert_starts_at(down, topic, 0, 15)
    # Past a follower's whole log: it starts again there (the leader's log ends at 60 too).
    assert up.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 60}).status == 200
    for m in c:
        wait_for(f"{m.name} starts at 60", lambda m=m: earliest(m, topic, 0) == 60)
        assert m.http.fetch(topic, 0, offset=59).status == 416


def test_retention_by_the_leaders_clock_and_by_size_reaches_every_replica(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(3, *ARGS)
    by_age, by_size = topic + "-age", topic + "-size"
    assert c[0].http.create_topic(by_age, partitions=1, replication_factor=3, segment_bytes=4096,
                                  retention_ms=1000).status == 201
    assert c[0].http.create_topic(by_size, partitions=1, replication_factor=3, segment_bytes=4096,
                                  retention_bytes=3000).status == 201
    produce(c[1], by_age, 20)
    produce(c[1], by_size, 20)
    for t in (by_age, by_size):
        leader = c.member(c.leaders(t)[0])
        start = wait_for(f"the leader of {t} applies retention",
                         lambda t=t, leader=leader: earliest(leader, t, 0) or None)
        assert 0 < start < 60  # whole closed segments went; the active one never does
        for m in c:
            wait_for(f"{m.name} follows the leader's start of {t}", lambda m=m, t=t, s=start: earliest(m, t, 0) == s)
            assert_starts_at(m, t, 0, start)


def test_a_follower_back_from_a_restart_serves_nothing_below_the_start_before_its_leader_syncs_it(
        make_cluster, topic: str) -> None:
    c, leader, (up, down) = three_with_60_records(make_cluster, topic)
    for m in c:
        wait_for(f"{m.name} holds offsets 0-59", lambda m=m: m.http.get(f"/v1/topics/{topic}").json()
                 ["partitions"][0]["high_watermark"] == 60)
    down.kill()
    assert up.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 15}).status == 200
    wait_for(f"{up.name} follows the leader's start", lambda: earliest(up, topic, 0) == 15)
    leader.pause()  # the leader cannot sync the returning follower: it knows only its own log, starting at 0
    try:
        down.restart()
        wait_for(f"{down.name} has joined", lambda: down.http.get("/v1/status").json()["status"] == "ok")
        got = down.http.fetch(topic, 0, offset=0)
        assert got.status in (416, 503), (got.status, got.body)  # the leader's answer, or retry: never offset 0
        if got.status == 416:
            assert got.json()["earliest"] == 15, got.body
        first = down.http.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": "earliest"})
        assert first.status == 503 or first.json()["offset"] == 15, (first.status, first.body)
    finally:
        leader.resume()
    wait_for(f"{down.name} follows the leader's start", lambda: earliest(down, topic, 0) == 15)
    assert_starts_at(down, topic, 0, 15)


def test_a_follower_whose_log_ends_below_a_start_inside_a_batch_catches_up(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(3, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3).status == 201
    leader = c.member(c.leaders(topic)[0])
    behind = next(m for m in c if m is not leader)
    batch = orjson.dumps([{"value": "x" * 100} for _ in range(20)])  # one request, one batch of 20
    assert leader.http.produce(topic, batch, partition=0, consistency="all").status == 200  # offsets 0-19
    behind.kill()
    for _ in range(2):  # offsets 20-39 and 40-59, without it
        assert leader.http.produce(topic, batch, partition=0, consistency="quorum").status == 200
    r = leader.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 45})
    assert r.status == 200 and r.json()["earliest_offset"] == 45, r.body  # inside the batch of 40-59
    behind.restart()  # its log ends at 20, below the leader's start: it starts again at 45
    wait_for(f"{behind.name} holds up to the leader's end",
             lambda: behind.http.get(f"/v1/topics/{topic}").json()["partitions"][0]["end_offset"] == 60)
    assert_starts_at(behind, topic, 0, 45)
    got = behind.http.fetch(topic, 0, offset=45)
    assert [rec["offset"] for rec in got.json()["records"]] == list(range(45, 60))


def test_a_read_from_the_start_through_a_broker_without_the_partition_starts_where_the_partition_does(
        make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(3, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=1).status == 201
    holder = c.member(c.leaders(topic)[0])
    others = [m for m in c if m is not holder]
    batch = orjson.dumps([{"value": "x" * 100} for _ in range(20)])  # one batch, offsets 0-19
    assert holder.http.produce(topic, batch, partition=0).status == 200
    assert holder.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 15}).status == 200
    for m in c:  # no offset: from the earliest, which is inside the batch
        got = m.http.fetch(topic, 0)
        assert got.status == 200, (m.name, got.body)
        assert [rec["offset"] for rec in got.json()["records"]] == list(range(15, 20)), m.name
    assert holder.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 20}).status == 200
    for m in others + [holder]:  # nothing left: the next offset is the start, not 0 (416)
        got = m.http.fetch(topic, 0)
        assert got.status == 200 and got.json()["records"] == [], (m.name, got.body)
        assert got.json()["next_offset"] == 20 and got.headers["Ring-Next-Offset"] == "20", (m.name, got.body)



def _leader_seen_by(m: Member, topic: str, among: set[str]) -> str | None:
    leader = m.http.get(f"/v1/topics/{topic}").json()["partitions"][0]["leader"]
    return leader if leader in among else None


def _links_down(leader: Member, followers: list[Member]) -> bool:
    links = leader.http.get("/v1/status").json()["replication"]
    return all(not links.get(m.name, {}).get("connected", False) for m in followers)


def test_a_failover_cannot_undo_an_acknowledged_truncate(make_cluster, topic: str) -> None:
    """The leader moves its start at once, its followers only as replication tells them. Both
    followers are stopped and their links closed, so no frame of the truncate reaches them; the
    leader dies, and one of them leads. A truncate answered 200 meanwhile would be undone."""
    c, leader, followers = three_with_60_records(make_cluster, topic)  # on every replica (consistency=all)
    for m in followers:
        m.pause()
    try:
        wait_for("the leader's links to its stopped followers close", lambda: _links_down(leader, followers))
        r = leader.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 30})
        leader.kill()
    finally:
        for m in followers:
            m.resume()
    names = {m.name for m in followers}
    new = c.member(wait_for("a follower leads", lambda: _leader_seen_by(followers[0], topic, names),
                            errors=(OSError,)))
    if r.status == 200:  # acknowledged: the next leader must start there too
        assert_starts_at(new, topic, 0, r.json()["earliest_offset"])
    # Not acknowledged: refused before anything changed once the closed links count (503), or
    # applied on the leader alone and answered so (504).
    assert (r.status, r.json()["error"]) in ((503, "not_enough_replicas"), (504, "timeout")), (r.status, r.body)
    assert_starts_at(new, topic, 0, 0)


def test_a_truncate_no_follower_took_in_time_is_answered_504_and_holds_when_sent_again(
        make_cluster, topic: str) -> None:
    c, leader, followers = three_with_60_records(make_cluster, topic)
    for m in followers:  # their links stay up a while: the truncate is applied, no follower answers
        m.pause()
    try:
        r = leader.http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 30})
    finally:
        for m in followers:
            m.resume()
    assert r.status == 504, (r.status, r.body)
    doc = r.json()
    assert doc["error"] == "timeout" and doc["applied_on_leader"] is True and doc["before_offset"] == 30, doc
    assert doc["confirmed"] == 1 and doc["needed"] == 2, doc
    # Sent again as a client would: a 503 (the leader does not see the resumed followers alive yet) says retry.
    def send_again():
        r = followers[0].http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 30})
        return r if r.status != 503 else None
    again = wait_for("the truncate, sent again, answered other than 503", send_again)
    assert again.status == 200 and again.json()["earliest_offset"] == 30, (again.status, again.body)
    assert_starts_at(leader, topic, 0, 30)
    for m in followers:
        wait_for(f"{m.name} starts at 30", lambda m=m: earliest(m, topic, 0) == 30)
