"""Failover against real broker processes: a killed leader, a paused (zombie) leader, two replicas down.

* SIGKILL the leader of a partition: the next replica is elected within the
  documented time (failure detection, about 4-13 s, plus a round of votes),
  quorum writes resume, nothing acknowledged at quorum is lost. A suffix the
  old leader held alone (written to its log, never replicated: what
  ``consistency=one`` risks) is cut when it returns; it catches up, and
  leadership goes back to it once it has.
* SIGSTOP the leader longer than the failure timeout, then SIGCONT: the
  zombie never acknowledges a quorum write that only it holds (every 200 it
  gives is readable afterwards from the new leader) and steps down.
* Two of three replicas down: quorum writes get 503 at once, committed reads
  still work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from ring.log import batch as batchfmt
from tests.brokers import Member, TestCluster
from tests.support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "fo"
# Detection (phi accrual: about 4-13 s after the stop) plus the election; slack for a loaded 2-core machine.
ELECTED_WITHIN_S = 20.0


def produce(m: Member, values: list[Any], partition: int, consistency: str = "quorum") -> tuple[int, dict]:
    r = m.http.produce(TOPIC, orjson.dumps(values), partition=partition, consistency=consistency)
    return r.status, r.json()


def wait_leader(c: TestCluster, observers: list[Member], partition: int, not_: str | None = None,
                is_: str | None = None, timeout_s: float = ELECTED_WITHIN_S) -> tuple[str, int]:
    """Until every observer reports a leader for the partition (other than ``not_``, or ``is_``)."""
    deadline = time.monotonic() + timeout_s
    seen: list[tuple[Any, Any]] = []
    while time.monotonic() < deadline:
        try:
            seen = [(p["leader"], p["epoch"]) for m in observers
                    for p in [m.http.describe(TOPIC)["partitions"][partition]]]
        except (OSError, AssertionError):
            seen = []
        leaders = {lead for lead, _ in seen}
        if seen and len(leaders) == 1:
            (leader,) = leaders
            if leader is not None and leader != not_ and (is_ is None or leader == is_):
                return leader, max(e or 0 for _, e in seen)
        time.sleep(0.1)
    raise TimeoutError(f"no agreed leader (not {not_}, is {is_}) of {TOPIC}/{partition} in {timeout_s} s: {seen}")


def add_unreplicated_batch(data_dir: Path, value: str) -> None:
    """Append to a stopped broker's partition log a batch as its leader would have written it (the next
    offset, its latest epoch), which no other replica has."""
    seg = sorted((data_dir / "topics" / TOPIC / "0").glob("*.log"))[-1]
    raw = seg.read_bytes()
    headers = [h for h, _ in batchfmt.scan(raw)]
    batch = batchfmt.encode([(int(time.time() * 1000), None, orjson.dumps(value), None)],
                            now_ms=int(time.time() * 1000), values_are_json=True)
    batchfmt.stamp(batch, 0, headers[-1].next_offset, headers[-1].leader_epoch)
    with open(seg, "ab") as f:
        f.write(batch)


def test_leader_killed_then_back(make_cluster) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "always")
    assert c[0].http.create_topic(TOPIC, partitions=1, replication_factor=3).status == 201
    natural, epoch = wait_leader(c, list(c), 0)
    old = c.member(natural)
    others = [m for m in c if m is not old]
    acked: dict[int, Any] = {}
    for n in range(20):
        status, doc = produce(c[n % 3], [f"before-{n}"], 0)
        assert status == 200, doc
        acked[doc["base_offset"]] = f"before-{n}"
    old.kill()
    killed_at = time.monotonic()
    add_unreplicated_batch(old.local.data_dir, "only-on-the-old-leader")
    leader, new_epoch = wait_leader(c, others, 0, not_=natural)
    elected_s = time.monotonic() - killed_at
    print(f"{leader} elected (epoch {epoch} -> {new_epoch}) {elected_s:.1f} s after {natural} was killed")
    assert elected_s <= ELECTED_WITHIN_S and new_epoch > epoch
    for n in range(20):  # quorum writes resume, through either survivor
        status, doc = produce(others[n % 2], [f"after-{n}"], 0)
        assert status == 200, doc
        acked[doc["base_offset"]] = f"after-{n}"
    old.restart()
    c.wait_statuses({m.name: "up" for m in c})
    # leadership returns to the natural leader once it has caught up (and cut what only it held)
    wait_leader(c, list(c), 0, is_=natural, timeout_s=30)
    for n in range(5):
        status, doc = produce(c[n % 3], [f"back-{n}"], 0)
        assert status == 200, doc
        acked[doc["base_offset"]] = f"back-{n}"
    for m in c:
        got = m.http.read_all(TOPIC, 0, want=len(acked))
        assert {o: got.get(o) for o in acked} == acked, m.name
        assert "only-on-the-old-leader" not in got.values()
    deadline = time.monotonic() + 20
    while len({m.replica_log(TOPIC, 0) for m in c}) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len({m.replica_log(TOPIC, 0) for m in c}) == 1, "replicas differ"


def test_paused_leader_cannot_acknowledge_and_steps_down(make_cluster) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "always")
    assert c[0].http.create_topic(TOPIC, partitions=1, replication_factor=3).status == 201
    natural, _ = wait_leader(c, list(c), 0)
    zombie = c.member(natural)
    others = [m for m in c if m is not zombie]
    for n in range(5):
        assert produce(zombie, [f"v{n}"], 0)[0] == 200
    zombie.pause()
    try:
        leader, new_epoch = wait_leader(c, others, 0, not_=natural)
        assert produce(c.member(leader), ["new-leader"], 0)[0] == 200
    finally:
        zombie.resume()
    # The zombie, at once: whatever it answers, a 200 must be a write the cluster holds.
    answers = [produce(zombie, [f"zombie-{n}"], 0) for n in range(3)]
    assert all(status in (200, 503, 504) for status, _ in answers), answers
    wait_for("the zombie learns of the new epoch: it stepped down",
             lambda: zombie.http.describe(TOPIC)["partitions"][0]["epoch"] >= new_epoch, 10, 0.1)
    # (once caught up, the zombie, the natural leader, may well lead again: in a newer epoch)
    leader, _ = wait_leader(c, list(c), 0)
    got = c.member(leader).http.read_all(TOPIC, 0, want=7)
    for n, (status, doc) in enumerate(answers):
        if status == 200:
            assert got.get(doc["base_offset"]) == f"zombie-{n}", (doc, got)


def test_two_of_three_down_refuse_quorum_and_still_serve_committed_reads(make_cluster) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "always")
    assert c[0].http.create_topic(TOPIC, partitions=3, replication_factor=3).status == 201
    acked: dict[int, dict[int, Any]] = {p: {} for p in range(3)}
    for p in range(3):
        for n in range(5):
            status, doc = produce(c[p], [f"p{p}-{n}"], p, "all")
            assert status == 200, doc
            acked[p][doc["base_offset"]] = f"p{p}-{n}"
    survivor = c[0]
    # What the survivor serves is what it knows is committed: a follower learns a leader's high watermark
    # with the frame after the acknowledgement, so the kill waits until it has.
    wait_for("the survivor knows every acknowledged write is committed",
             lambda: all(p["high_watermark"] == len(acked[p["partition"]])
                         for p in survivor.http.describe(TOPIC)["partitions"]), 10, 0.05)
    for m in (c[1], c[2]):
        m.kill()
    c.wait_statuses({"ring-1": "down", "ring-2": "down"}, [survivor], timeout_s=ELECTED_WITHIN_S)
    for p in range(3):
        began = time.monotonic()
        status, doc = produce(survivor, ["refused"], p, "quorum")
        assert status == 503, doc
        assert time.monotonic() - began < 4.0
        got = survivor.http.read_all(TOPIC, p, want=len(acked[p]))
        assert {o: got.get(o) for o in acked[p]} == acked[p]
