"""Repair against real broker processes: a bit flipped on disk in a closed segment of one replica.

The broker's own reads check every batch, so the damaged copy is never
served: a fetch that hits it is answered from another replica (or 503).
Anti-entropy (``--repair-interval-s``) finds it by comparing checksums of
committed segments, and the damaged batch is replaced in place by a whole
copy from another replica, every other batch kept; a damaged leader also
hands the partition over. In the end every replica holds the very same
bytes again.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from ring.log import batch as batchfmt
from tests.brokers import Member, TestCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "rp"
REPAIRED_WITHIN_S = 30.0


def leader_of(c: TestCluster, partition: int) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        leader = c[0].http.get(f"/v1/topics/{TOPIC}").json()["partitions"][partition]["leader"]
        if leader:
            return leader
        time.sleep(0.1)
    raise TimeoutError("no leader")


def flip_a_bit(data_dir: Path, partition: int) -> tuple[Path, int]:
    """Flip one payload bit of a batch in the middle of the first (closed) segment; its base offset."""
    seg = sorted((data_dir / "topics" / TOPIC / str(partition)).glob("*.log"))[0]
    raw = bytearray(seg.read_bytes())
    batches = list(batchfmt.scan(raw))
    h, pos = batches[len(batches) // 2]
    with open(seg, "r+b") as f:  # beside the running broker, as a failing disk would
        f.seek(pos + batchfmt.HEADER_SIZE + 3)
        f.write(bytes([raw[pos + batchfmt.HEADER_SIZE + 3] ^ 0x20]))
    return seg, h.base_offset


def values(m: Member, partition: int, offset: int, n: int) -> tuple[int, list]:
    r = m.http.fetch(TOPIC, partition, offset=offset, max_records=n)
    return r.status, ([rec["value"] for rec in r.json()["records"]] if r.status == 200 else [])


def wait_identical(c: TestCluster, partition: int, timeout_s: float = REPAIRED_WITHIN_S) -> float:
    began, copies = time.monotonic(), []
    while time.monotonic() - began < timeout_s:
        try:
            copies = [m.replica_log(TOPIC, partition) for m in c]
        except AssertionError:  # a replica's own read hit the damage (500 on the peer port): not yet
            copies = []
        if len(set(copies)) == 1:
            return time.monotonic() - began
        time.sleep(0.3)
    raise AssertionError(f"replicas of {TOPIC}/{partition} still differ after {timeout_s} s: "
                         f"{[end for _, end in copies]}")


def test_a_flipped_bit_is_never_served_and_is_repaired(make_cluster) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "always", "--repair-interval-s", "1")
    assert c[0].http.create_topic(TOPIC, partitions=2, replication_factor=3, segment_bytes=4096).status == 201
    written: dict[int, list] = {0: [], 1: []}
    for p in (0, 1):
        for n in range(0, 120, 4):
            batch = [{"p": p, "n": n + i, "pad": "x" * 150} for i in range(4)]
            r = c[0].http.produce(TOPIC, orjson.dumps(batch), partition=p, consistency="all")
            assert r.status == 200, r.body
            written[p] += batch
    for p in (0, 1):
        wait_identical(c, p, 10)
    # partition 0: a follower's copy is damaged; partition 1: the leader's
    lead0 = leader_of(c, 0)
    follower = next(m for m in c if m.name != lead0)
    leader1 = c.member(leader_of(c, 1))
    damaged = {0: (follower, *flip_a_bit(follower.local.data_dir, 0)),
               1: (leader1, *flip_a_bit(leader1.local.data_dir, 1))}
    for p, (m, _, offset) in damaged.items():
        # Read through the damaged replica at once (before anti-entropy's next round): never the damage.
        status, got = values(m, p, offset, 8)
        assert status in (200, 503), (m.name, p, status)
        if status == 200:
            assert got == written[p][offset:offset + len(got)] and got, (m.name, p)
    for p, (m, seg, _) in damaged.items():
        took = wait_identical(c, p)
        print(f"{TOPIC}/{p}: {m.name}'s copy repaired {took:.1f} s after the check")
        for reader in c:
            status, got = values(reader, p, 0, 10_000)
            assert status == 200 and got == written[p], (reader.name, p)
    assert "damaged" in damaged[0][0].log_text() and "repaired" in damaged[0][0].log_text()
    for p, (m, _, offset) in damaged.items():  # the one batch was replaced; nothing above it was cut
        text = m.log_text()
        assert f"batch {offset}-" in text and "mended in place" in text, (m.name, p)
        assert "to refetch from the leader" not in text, (m.name, p)


def leader_seen_by(m: Member, partition: int) -> str | None:
    r = m.http.get(f"/v1/topics/{TOPIC}")
    return r.json()["partitions"][partition]["leader"] if r.status == 200 else None


def test_damage_a_crashed_follower_finds_on_restart_is_mended_and_its_votes_count_it(make_cluster) -> None:
    """A write acknowledged at quorum by the leader and one follower while the third was stopped; the
    follower crashes and a bit flips in its last segment, below that write; the leader crashes too. On
    restart recovery keeps the follower's log, batches after the damage and all, and marks it damaged
    there: its vote counts what it holds, so the third broker, missing the write, is not elected with it.
    Once the leader returns, the damaged batch is mended in place from its copy (nothing is cut), and
    every acknowledged record is there on every broker."""
    c: TestCluster = make_cluster(3, "--fsync", "always")
    assert c[0].http.create_topic(TOPIC, partitions=1, replication_factor=3).status == 201
    written: list = []

    def produce(n: int, consistency: str) -> None:
        for i in range(n):
            value = {"n": len(written), "pad": "x" * 100}
            r = leader.http.produce(TOPIC, orjson.dumps([value]), partition=0, consistency=consistency)
            assert r.status == 200, r.body
            written.append(value)

    leader = c.member(leader_of(c, 0))
    follower, third = [m for m in c if m is not leader]
    produce(10, "all")
    third.pause()  # the third misses what follows
    produce(5, "quorum")
    follower.kill()
    seg = sorted((follower.local.data_dir / "topics" / TOPIC / "0").glob("*.log"))[-1]
    raw = seg.read_bytes()
    h, pos = [(h, p) for h, p in batchfmt.scan(raw)][3]  # one the third holds: the cut log is behind its
    with open(seg, "r+b") as f:
        f.seek(pos + batchfmt.HEADER_SIZE + 3)
        f.write(bytes([raw[pos + batchfmt.HEADER_SIZE + 3] ^ 0x20]))
    leader.kill()
    third.resume()
    follower.restart()
    # The follower and the third answer each other's votes, but no majority may elect the third.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert third.name not in (leader_seen_by(third, 0), leader_seen_by(follower, 0))
        time.sleep(0.2)
    leader.restart()
    wait_identical(c, 0)
    for reader in c:
        status, got = values(reader, 0, 0, 10_000)
        assert status == 200 and got == written, reader.name
    text = follower.log_text()
    assert "damaged batch at offset 3 inside the log" in text and "batch 3-3 mended in place" in text
    assert "cutting there" not in text and "to refetch from the leader" not in text
