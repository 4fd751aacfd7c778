"""A topic deleted and created again is a new topic: a consumer group reads it from its reset policy,
never from the offsets it committed on the old one (real brokers).

Each test: a group reads topic T (10 records) and commits offset 10; T is deleted and created
again and 15 records go to the new T. The group's next member reads all 15 (its reset policy,
earliest by default) and the group's lag is the truth. Variants: the coordinator restarted between
the delete and the re-creation (no coordinator sees the delete, so only the topic id stops the stale
offset), and a member
that polls and commits across the re-creation (409 ``topic_recreated``, then it joins again).
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

import pytest

from ring import limits
from ring.hashing import partition_for_key
from tests.brokers import TestCluster
from tests.support import wait_for
from tests.test_groups_cluster import describe, join, poll, produce_to

pytestmark = pytest.mark.integration

WAIT_S = 30.0
T = TypeVar("T")


def read_all(m: Any, group: str, consumer: str, want: int) -> list[int]:
    """Poll until ``want`` records came (bounded by ``WAIT_S``); their values."""
    got: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        r = poll(m, group, consumer, wait_ms=300, max_records=50)
        if r.status == 503:  # the coordinator moving (back to the restarted broker): asked again
            continue
        assert r.status == 200, r.body
        got.extend(rec["value"] for rec in r.json()["records"])
    return got


def recreate(c: TestCluster, topic: str, creator: int = 0) -> dict[str, Any]:
    """Delete ``topic`` and create it again (its files may still be going: 503 until then)."""
    old = c[creator].http.describe(topic)
    assert c[creator].http.delete(f"/v1/topics/{topic}").status in (200, 204)
    wait_for("topic created again", lambda: c[creator].http.create_topic(topic, partitions=1).status == 201,
             WAIT_S)
    new = c[creator].http.describe(topic)
    assert len(new["id"]) == 22 and new["id"] != old["id"], (old["id"], new["id"])
    return new


def first_group(c: TestCluster, topic: str, group: str) -> None:
    """``group`` reads the 10 records of ``topic`` and commits offset 10."""
    assert c[0].http.create_topic(topic, partitions=1).status == 201
    produce_to(c[0], topic, 0, list(range(10)))
    join(c[1], group, "first", [topic])
    assert sorted(read_all(c[1], group, "first", 10)) == list(range(10))
    r = c[2].http.delete(f"/v1/groups/{group}/members/first", query={"commit": "true", "token": _token(group)})
    assert r.status == 200, r.body
    assert {(o["topic"], o["committed"]) for o in describe(c[0], group)["offsets"]} == {(topic, 10)}


def _token(group: str) -> str:
    from tests.test_groups_cluster import TOKENS

    return TOKENS[(group, "first")]


def settled(what: str, call: Callable[[], T]) -> T:
    """``call``'s answer once the group's coordinator answers (503 while it moves)."""
    return wait_for(what, call, WAIT_S, errors=(AssertionError,))


def second_member_reads_the_new_topic(c: TestCluster, topic: str, group: str) -> None:
    produce_to(c[0], topic, 0, list(range(100, 115)))
    doc = settled("the group described", lambda: describe(c[2], group))
    # Once the delete reached the coordinator the old offset is forgotten and, with no member, the group
    # names no partition of the topic; until then it holds offset 10 for the old topic's id, which
    # applies to no partition of the new one: committed none, the whole topic lagging (up to the high
    # watermark as the coordinator's replica knows it, which may not have heard of the last produce yet).
    rows = [(o["committed"], o["lag"], o["high_watermark"]) for o in doc["offsets"] if o["topic"] == topic]
    assert rows == [] or (len(rows) == 1 and rows[0][0] is None and rows[0][1] == rows[0][2] <= 15), doc
    settled("joined", lambda: join(c[2], group, "second", [topic]))
    assert sorted(read_all(c[0], group, "second", 15)) == list(range(100, 115))
    settled("committed", lambda: poll(c[0], group, "second", wait_ms=0).status == 200)  # the last poll's records
    doc = settled("the group described", lambda: describe(c[1], group))
    assert [(o["committed"], o["lag"]) for o in doc["offsets"] if o["topic"] == topic] == [(15, 0)], doc


def test_a_group_reads_a_recreated_topic_from_its_reset_policy(shared_cluster: TestCluster, topic: str) -> None:
    c, group = shared_cluster, "rt-" + topic
    first_group(c, topic, group)
    recreate(c, topic)
    second_member_reads_the_new_topic(c, topic, group)


def test_a_coordinator_restarted_between_the_delete_and_the_recreation(make_cluster, topic: str) -> None:
    """The coordinator is down while the topic is deleted, so no coordinator holding the group sees
    the delete (the broker that takes the offsets partition over loads the group only later, from
    records that hold offset 10 for the old topic); it is back before the topic is created again.
    Its saved catalogue must not bring the old topic back, and only the topic id stops the old offset."""
    c: TestCluster = make_cluster(3)
    group = "rt-" + topic
    first_group(c, topic, group)
    # A second group with the same coordinator, whose offset an operator committed (no member).
    same = partition_for_key(group.encode(), limits.OFFSETS_TOPIC_PARTITIONS)
    admin = next(g for g in (f"{group}-admin{i}" for i in range(1000))
                 if partition_for_key(g.encode(), limits.OFFSETS_TOPIC_PARTITIONS) == same)
    r = c[0].http.post(f"/v1/groups/{admin}/offsets", json_body={
        "offsets": [{"topic": topic, "partition": 0, "offset": 7}]})
    assert r.status == 200, r.body
    coordinator = c.member(describe(c[0], group)["coordinator"])
    coordinator.kill()
    up = next(m for m in c if m is not coordinator)
    old_id = up.http.describe(topic)["id"]
    assert up.http.delete(f"/v1/topics/{topic}").status in (200, 204)
    coordinator.restart()
    c.wait_statuses({m.name: "up" for m in c})
    wait_for("the delete known everywhere", lambda: all(m.http.get(f"/v1/topics/{topic}").status == 404 for m in c),
             WAIT_S)
    wait_for("topic created again", lambda: up.http.create_topic(topic, partitions=1).status == 201, WAIT_S)
    wait_for("the new topic known everywhere", lambda: all(
        m.http.get(f"/v1/topics/{topic}").status == 200 and m.http.describe(topic)["id"] != old_id for m in c),
        WAIT_S)
    second_member_reads_the_new_topic(c, topic, group)
    doc = settled("the operator's group described", lambda: describe(c[2], admin))
    assert [(o["committed"], o["lag"]) for o in doc["offsets"] if o["topic"] == topic] == [(None, 15)], doc


def test_a_recreated_topic_is_created_with_a_leader_of_its_own(shared_cluster: TestCluster, topic: str) -> None:
    """A create answers once the new topic's partitions have leaders (or its wait ran out: none named),
    and gossip may still carry the deleted topic's leader claim under the same name: the leader the
    answer names leads the new topic (asked itself), and a produce right after it is acknowledged
    without waiting for an election."""
    c = shared_cluster
    for i in range(3):
        name = f"{topic}-{i}"
        assert c[0].http.create_topic(name, partitions=1).status == 201
        produce_to(c[0], name, 0, [1, 2, 3])
        old = c[0].http.describe(name)
        creator = next(m for m in c if m.name != old["partitions"][0]["leader"])
        assert c[0].http.delete(f"/v1/topics/{name}").status in (200, 204)
        created: list[Any] = []

        def create() -> bool:
            r = creator.http.create_topic(name, partitions=1)
            created.append(r)
            return r.status == 201

        wait_for("topic created again", create, WAIT_S)
        doc = created[-1].json()
        assert doc["id"] != old["id"], doc
        if doc["partitions"][0]["leader"] is None:
            continue  # no leader within the create's wait (a loaded machine): none named, which is true
        leader = c.member(doc["partitions"][0]["leader"])
        there = leader.http.describe(name)
        assert (there["id"], there["partitions"][0]["leader"]) == (doc["id"], leader.name), (doc, there)
        r = creator.http.produce(name, [4], partition=0)
        assert r.status == 200 and r.json()["base_offset"] == 0, r.body


def test_a_member_polling_across_the_recreation_is_told_and_starts_over(shared_cluster: TestCluster,
                                                                         topic: str) -> None:
    c, group = shared_cluster, "rt-" + topic
    assert c[0].http.create_topic(topic, partitions=1).status == 201
    old_id = c[0].http.describe(topic)["id"]
    produce_to(c[0], topic, 0, list(range(10)))
    join(c[1], group, "stale", [topic])
    assert sorted(read_all(c[1], group, "stale", 10)) == list(range(10))
    assert poll(c[1], group, "stale", wait_ms=0).status == 200  # commits offset 10
    new_id = recreate(c, topic)["id"]
    produce_to(c[0], topic, 0, list(range(100, 115)))
    for request in (lambda: poll(c[2], group, "stale", wait_ms=0),
                    lambda: c[0].http.post(f"/v1/groups/{group}/offsets", json_body={
                        "consumer": "stale", "offsets": [{"topic": topic, "partition": 0, "offset": 12}]})):
        r = request()
        assert r.status == 409, r.body
        body = r.json()
        assert body["error"] == "topic_recreated" and body["rejoin"] is True, body
        assert (body["topic"], body["topic_id"], body["stale_topic_id"]) == (topic, new_id, old_id), body
        assert topic in body["message"] and new_id in body["message"] and old_id in body["message"], body
    join(c[1], group, "stale", [topic])  # joining again starts it over on the new topic
    assert sorted(read_all(c[2], group, "stale", 15)) == list(range(100, 115))


def test_the_python_consumer_starts_over_on_a_recreated_topic(shared_cluster: TestCluster, topic: str) -> None:
    """A consumer that stays in the group across the re-creation: what it received and committed of
    the old topic (offsets 0-9) hides nothing of the new one; it reads all 15 new records."""
    from ring.client import GroupConsumer

    c, group = shared_cluster, "rt-" + topic
    assert c[0].http.create_topic(topic, partitions=1).status == 201
    produce_to(c[0], topic, 0, list(range(10)))
    with GroupConsumer([m.url for m in c], group, topic, wait_ms=200) as consumer:
        got: list[int] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 10 and time.monotonic() < deadline:
            got.extend(r.json() for r in consumer.poll())
        assert sorted(got) == list(range(10))
        consumer.commit()
        recreate(c, topic)
        produce_to(c[0], topic, 0, list(range(100, 115)))
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 15 and time.monotonic() < deadline:
            got.extend(r.json() for r in consumer.poll())
        assert sorted(got) == list(range(100, 115))
        consumer.commit()
    doc = describe(c[1], group)
    assert [(o["committed"], o["lag"]) for o in doc["offsets"] if o["topic"] == topic] == [(15, 0)], doc


def test_ring_consume_following_a_group_starts_over_on_a_recreated_topic(shared_cluster: TestCluster,
                                                                         topic: str) -> None:
    """``ring consume --group --follow`` running across the re-creation prints the old topic's 10
    records and then the new one's 5, and commits 5 for the new topic: nothing it printed of the old
    one (up to offset 10) is committed for the new one."""
    import threading

    from tests.test_cli_commands import Ran, cli

    c, group = shared_cluster, "rt-" + topic
    assert c[0].http.create_topic(topic, partitions=1).status == 201
    produce_to(c[0], topic, 0, list(range(10)))
    ran: list[Ran] = []
    reader = threading.Thread(target=lambda: ran.append(cli(c[1].url, "consume", topic, "--group", group,
                                                           "--follow", "-n", "15")), daemon=True)
    reader.start()

    def committed_10() -> bool:
        r = c[2].http.get(f"/v1/groups/{group}")
        return r.status == 200 and [o["committed"] for o in r.json()["offsets"]] == [10]

    wait_for("the command read and committed the old topic", committed_10, WAIT_S)
    recreate(c, topic)
    produce_to(c[0], topic, 0, list(range(100, 105)))
    reader.join(WAIT_S)
    assert not reader.is_alive() and ran and ran[0].returncode == 0, ran
    assert [int(v) for v in ran[0].stdout.split()] == list(range(10)) + list(range(100, 105)), ran[0]
    doc = describe(c[1], group)
    assert [(o["committed"], o["lag"]) for o in doc["offsets"] if o["topic"] == topic] == [(5, 0)], doc
