"""``timeout_ms`` on produce, on real brokers: how long the leader waits for the acknowledgements the
consistency level needs before its 504. With a follower of the partition paused (SIGSTOP: not marked
down yet, so the leader tries), a produce at ``all`` asking for 300 ms is answered 504 after its own
wait and long before the default one would have ended, whether it reaches the leader itself or is
forwarded to it; with the follower running again the same produce is 200; a malformed, zero, negative
or too long a wait is 400 and writes nothing.
"""

from __future__ import annotations

import time

import pytest

from ring import limits
from tests.brokers import Member, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

TIMEOUT_MS = 300
DEFAULT_WAIT_S = limits.REPLICATION_ACK_TIMEOUT_MS / 1000


def _produce(via: Member, topic: str, p: int, n: int, **query: object) -> tuple[int, dict, float]:
    started = time.monotonic()
    r = via.http.produce(topic, [{"n": n}], partition=p, consistency="all", **query)
    return r.status, r.json(), time.monotonic() - started


def test_a_produce_waits_for_its_acknowledgements_as_long_as_it_asks(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(3)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3).status == 201
    leader = c.member(c.leaders(topic)[0])
    forwarder, paused = [m for m in c if m is not leader]
    status, doc, _ = _produce(leader, topic, 0, 0, timeout_ms=TIMEOUT_MS)
    assert status == 200, doc

    paused.pause()
    try:
        for via in (leader, forwarder):  # asked of the leader itself, then forwarded to it
            status, doc, elapsed = _produce(via, topic, 0, 1, timeout_ms=TIMEOUT_MS)
            assert status == 504 and doc["error"] == "timeout", (via.name, doc)
            assert f"within {TIMEOUT_MS} ms" in doc["message"] and doc["acknowledged"] == 2, doc
            # It waited its own 300 ms, and answered before the default wait would have ended.
            assert TIMEOUT_MS / 1000 <= elapsed < DEFAULT_WAIT_S, (via.name, elapsed)
            print(f"504 via {via.name} after {elapsed * 1000:.0f} ms (timeout_ms={TIMEOUT_MS})")
    finally:
        paused.resume()

    end = leader.http.end_offsets(topic)[0]
    wait_for("the follower holds the leader's log again", lambda: paused.replica_log(topic, 0)[1] == end, 30.0)
    for via in (leader, forwarder):
        status, doc, elapsed = _produce(via, topic, 0, 2, timeout_ms=TIMEOUT_MS)
        assert status == 200, (via.name, doc)
        print(f"200 via {via.name} after {elapsed * 1000:.0f} ms")


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "1e3", str(limits.PRODUCE_TIMEOUT_MS_MAX + 1),
                                   "9" * 30])
def test_a_bad_timeout_is_400_and_writes_nothing(shared_cluster: TestCluster, topic: str, value: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3).status == 201
    leader = c.member(c.leaders(topic)[0])
    forwarder = next(m for m in c if m is not leader)
    for via in (leader, forwarder):
        r = via.http.produce(topic, [{"n": 0}], partition=0, timeout_ms=value)
        assert r.status == 400, r.body
        doc = r.json()
        assert doc["error"] == "bad_request" and doc["parameter"] == "timeout_ms", doc
        assert "timeout_ms" in doc["message"], doc
    assert leader.http.end_offsets(topic) == [0]  # the partition's log, where a write would have gone
