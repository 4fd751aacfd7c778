"""A replica that lost its disk, against real broker processes: it must not vote as if it were whole.

One partition, RF 3, leader L and followers F1, F2. F1 is paused (SIGSTOP)
while records are acknowledged at quorum by L and F2; L dies for good; F2's
data directory is wiped and F2 restarts empty; F1 resumes. Only L and F2
ever held those records, and both copies are gone: the partition must stay
without a leader (writes get 503 ``no_eligible_leader`` naming the replica
that lost its state) rather than elect the stale F1 with the vote of a
replica that forgot everything. The same with the wiped F2 restarting
before F1 resumes. And a wiped follower whose leader is alive catches up and
then counts again: after it caught up, the leader is killed, and the
partition fails over with its vote, keeping every record.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import orjson
import pytest

from tests.brokers import Member, TestCluster
from tests.support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "dl"
ELECTED_WITHIN_S = 20.0  # detection (about 4-13 s) plus a round of votes, on a loaded 2-core machine
# Longer than a failover normally takes: a partition that could elect would have done so by then.
REFUSED_WITHIN_S = ELECTED_WITHIN_S  # as long as an election takes here at worst
RECORDS = 200
PER_REQUEST = 10
CLOCK_BOUND_S = 2.5  # --max-clock-offset's default (2 s) and some


def produce(m: Member, values: list[Any], consistency: str = "quorum") -> tuple[int, dict]:
    r = m.http.produce(TOPIC, orjson.dumps(values), partition=0, consistency=consistency)
    return r.status, r.json()


def leader_seen_by(observers: list[Member]) -> str | None:
    """The leader every observer agrees on (None: none, or they disagree, or one is unreachable)."""
    try:
        seen = {m.http.describe(TOPIC)["partitions"][0]["leader"] for m in observers}
    except (OSError, AssertionError):
        return None
    return seen.pop() if len(seen) == 1 else None


def in_sync_cluster(make_cluster) -> tuple[TestCluster, Member, Member, Member, dict[int, Any], float]:
    """A cluster with the partition led by L and every replica holding what was written (two writes at
    ``all``, the second after the first was held by everyone): (cluster, L, F1, F2, acked, when the
    topic was created)."""
    c: TestCluster = make_cluster(3, "--fsync", "always")
    assert c[0].http.create_topic(TOPIC, partitions=1, replication_factor=3).status == 201
    created_s = time.time()
    leader = wait_for("a leader", lambda: leader_seen_by(list(c)), ELECTED_WITHIN_S)
    lead = c.member(leader)
    f1, f2 = [m for m in c if m is not lead]
    acked: dict[int, Any] = {}
    for n in range(2):
        status, doc = produce(lead, [f"warm-{n}"], consistency="all")
        assert status == 200, doc
        acked[doc["base_offset"]] = f"warm-{n}"
    return c, lead, f1, f2, acked, created_s


def acknowledge_without(c: TestCluster, lead: Member, acked: dict[int, Any]) -> None:
    """RECORDS acknowledged at quorum, by the leader and the one follower that is not paused."""
    for n in range(RECORDS // PER_REQUEST):
        values = [f"r-{n}-{i}" for i in range(PER_REQUEST)]
        status, doc = produce(lead, values)
        assert status == 200, doc
        acked.update({doc["base_offset"] + i: v for i, v in enumerate(values)})


def wipe_and_restart(m: Member, created_s: float, wait: bool = True) -> None:
    """Kill ``m``, remove its data directory and start it again, empty (``wait``: until it has joined,
    which needs a live peer). A broker knows its new directory lost a partition's state when the topic
    is older than the directory by more than the clock offset brokers may have (``--max-clock-offset``,
    2 s by default): the scenario is a disk lost some time after the topic was made, not within it."""
    m.kill()
    wait_for("the topic is older than the clock bound", lambda: time.time() > created_s + CLOCK_BOUND_S, 10, 0.1)
    shutil.rmtree(m.local.data_dir)
    m.local.start(wait=wait)


def assert_never_elected_without_the_records(live: list[Member], wiped: Member, acked: dict[int, Any]) -> None:
    """For REFUSED_WITHIN_S and more: no write is ever taken, and writes end up refused with 503
    ``no_eligible_leader`` naming the wiped replica, through either live broker; no read that succeeds
    shows anything but the acknowledged record at an acknowledged offset."""
    deadline = time.monotonic() + REFUSED_WITHIN_S
    last: dict[str, tuple[int, dict]] = {}
    refused_since: float | None = None
    while True:
        for m in live:
            status, doc = produce(m, [f"after-{m.name}"])
            assert status != 200, f"{m.name} took a write with the acknowledged records gone: {doc}"
            last[m.name] = (status, doc)
        refused = all(s == 503 and d.get("error") == "no_eligible_leader" and wiped.name in d.get("lost_state", ())
                      for s, d in last.values())
        if refused and refused_since is None:
            refused_since = time.monotonic()
        if time.monotonic() >= deadline and refused_since is not None and time.monotonic() - refused_since > 3:
            break
        assert time.monotonic() < deadline + 15, f"writes not refused as no_eligible_leader: {last}"
        time.sleep(0.3)
    for m in live:
        assert m.http.describe(TOPIC)["partitions"][0]["leader"] is None, m.name
        # A read of an acknowledged offset this replica does not hold says why it cannot be answered.
        r = m.http.fetch(TOPIC, 0, offset=max(acked), wait_ms=0)
        assert r.status == 503 and r.json()["error"] == "no_eligible_leader", (m.name, r.status, r.body)
        assert wiped.name in r.json()["lost_state"], r.body
        got = m.http.read_all(TOPIC, 0, timeout_s=5)
        assert all(acked[o] == v for o, v in got.items() if o in acked), (m.name, got)
        assert not [v for o, v in got.items() if o not in acked], (m.name, got)
    for m in live:
        part = m.http.describe(TOPIC)["partitions"][0]
        assert part["no_eligible_leader"] is True and part["lost_state"] == [wiped.name], (m.name, part)


def stale_and_wiped(make_cluster) -> tuple[TestCluster, Member, Member, Member, dict[int, Any]]:
    """The issue's scenario: records acknowledged by the leader L and F2 while F1 is paused, then L
    killed and F2 back on an empty data directory as F1 resumes: (cluster, L, F1, F2, acked)."""
    c, lead, f1, f2, acked, created_s = in_sync_cluster(make_cluster)
    f1.pause()
    try:
        acknowledge_without(c, lead, acked)
        lead.kill()
        wipe_and_restart(f2, created_s, wait=False)
    finally:
        f1.resume()
    f2.local.wait_ready()
    return c, lead, f1, f2, acked


def test_stale_follower_and_wiped_follower_elect_nobody(make_cluster) -> None:
    c, lead, f1, f2, acked = stale_and_wiped(make_cluster)
    assert_never_elected_without_the_records([f1, f2], f2, acked)
    # The old leader comes back with its disk: it holds everything, and is elected with the stale
    # replica's vote; both others catch up from it.
    lead.local.start()
    assert wait_for("the returned leader leads", lambda: leader_seen_by(list(c)) == lead.name, 60,
                    errors=(OSError,))
    status, doc = produce(f1, ["back"])
    assert status == 200, doc
    acked[doc["base_offset"]] = "back"
    for m in c:
        got = m.http.read_all(TOPIC, 0, end=max(acked) + 1)
        assert {o: got.get(o) for o in acked} == acked, m.name


def test_wiped_follower_restarting_first_elects_nobody(make_cluster) -> None:
    c, lead, f1, f2, acked, created_s = in_sync_cluster(make_cluster)
    f1.pause()
    try:
        acknowledge_without(c, lead, acked)
        lead.kill()
        wipe_and_restart(f2, created_s, wait=False)
        # The wiped broker runs (alone with a dead leader, so it cannot join yet) before the stale one
        # comes back.
        wait_for("the wiped broker listens", lambda: f2.http.get("/v1/status").status > 0, 30, errors=(OSError,))
    finally:
        f1.resume()
    f2.local.wait_ready()
    assert_never_elected_without_the_records([f1, f2], f2, acked)


def test_wiped_follower_catches_up_then_votes(make_cluster) -> None:
    c, lead, f1, f2, acked, created_s = in_sync_cluster(make_cluster)
    acknowledge_without(c, lead, acked)  # every replica holds them (none paused)
    wipe_and_restart(f2, created_s)
    c.wait_statuses({m.name: "up" for m in c})
    end = max(acked) + 1
    wait_for("the wiped follower catches up", lambda: len(f2.http.read_all(TOPIC, 0, end=end, timeout_s=3)) == end,
             40, errors=(OSError,))
    # It counts again once caught up: the leader admits it with its new incarnation, and tells F1.
    wait_for("the wiped follower is a voter again",
             lambda: not lead.http.describe(TOPIC)["partitions"][0].get("lost_state"), 30, errors=(OSError,))
    for n in range(3):  # held by every replica (refused before any append while one is not yet reachable)
        def written(n: int = n) -> dict | None:
            status, doc = produce(lead, [f"mid-{n}"], consistency="all")
            assert status == 200 or status == 503 and doc["error"] == "not_enough_replicas", doc
            return doc if status == 200 else None
        acked[wait_for("a write at consistency=all", written, 20)["base_offset"]] = f"mid-{n}"
    lead.kill()
    leader = wait_for("a new leader", lambda: leader_seen_by([f1, f2]) in (f1.name, f2.name) and
                      leader_seen_by([f1, f2]), ELECTED_WITHIN_S + 10)
    for n in range(10):
        status, doc = produce(c.member(leader), [f"after-{n}"])
        assert status == 200, doc
        acked[doc["base_offset"]] = f"after-{n}"
    for m in (f1, f2):
        got = m.http.read_all(TOPIC, 0, end=max(acked) + 1)
        assert {o: got.get(o) for o in acked} == acked, m.name
