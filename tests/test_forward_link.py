"""Forwarded produces travel on one standing link per leader (``ring.cluster.forwards``), on real
brokers: every produce sent to a broker that does not lead its partition is acknowledged with the
leader's offsets, in order, over a link the forwarding broker keeps open; a leader that restarts
gets a new link and nothing acknowledged is lost; the leader's errors come back as it answered them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.brokers import TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def _status(m) -> dict:
    return m.http.get("/v1/status").json()


def _forwarder_and_partition(c: TestCluster, topic: str):
    leaders = c.leaders(topic)
    m = c[0]
    p = next(p for p, leader in leaders.items() if leader != m.name)
    return m, p, c.member(leaders[p])


def test_forwarded_produces_go_on_a_standing_link(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=3, replication_factor=3).status == 201
    m, p, leader = _forwarder_and_partition(c, topic)
    before = _status(m)["produces_forwarded"]

    def one(i: int) -> tuple[int, int]:
        r = m.http.produce(topic, [{"i": i}], partition=p, consistency="quorum")
        assert r.status == 200, r.body
        doc = r.json()
        assert doc["partition"] == p
        return doc["base_offset"], i

    with ThreadPoolExecutor(8) as pool:
        acked = list(pool.map(one, range(60)))
    assert sorted(o for o, _ in acked) == list(range(60))  # each produce its own offset, none skipped
    status = _status(m)
    assert status["produces_forwarded"] - before == 60
    assert status["forward_links"] >= 1
    by_offset = dict(acked)
    got = leader.http.read_all(topic, p, end=60, timeout_s=WAIT_S)
    assert {o: v["i"] for o, v in got.items()} == by_offset


def test_a_restarted_leader_gets_a_new_link_and_keeps_what_it_acknowledged(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(3)
    assert c[0].http.create_topic(topic, partitions=3, replication_factor=3).status == 201
    m, p, leader = _forwarder_and_partition(c, topic)
    values = []
    for i in range(10):
        r = m.http.produce(topic, [{"i": i}], partition=p)
        assert r.status == 200, r.body
        values.append(i)
    assert _status(m)["forward_links"] >= 1
    leader.kill()
    leader.restart()
    c.wait_statuses({x.name: "up" for x in c})

    def produced() -> bool:
        r = m.http.produce(topic, [{"i": len(values)}], partition=p)
        if r.status != 200:
            assert r.status in (503, 504), r.body  # no leader yet, or the link closed under a produce
            return False
        values.append(len(values))
        return True

    wait_for("a produce forwarded after the leader's restart", produced, WAIT_S)
    records = c[0].http.read_all(topic, p, want=len(values), timeout_s=WAIT_S)
    got = [v["i"] for _, v in sorted(records.items())]
    # Every acknowledged value is there, in the order acknowledged (a produce answered 504 may have
    # been written too, and then again by its retry: the acknowledged ones are a subsequence).
    rest = iter(got)
    assert all(v in rest for v in values), (values, got)
