"""A consumer that read up to the leader's high watermark asks a lagging follower for the next offset.

On three real brokers: one follower of a one-partition topic is paused
(SIGSTOP) while tens of MiB are produced at quorum, so when it resumes its log
ends far below the leader's high watermark. A consumer reads the leader up to
that watermark and then asks the follower for the next offset. The partition
has committed everything below that offset, so it is not "out of range": the
fetch answers 200, empty at once with ``wait_ms=0``, or, long-polling, with
the record produced next. The first requests reach the follower while it is
still paused (the kernel accepts them), so it handles them before it has heard
of the offset (it asks the leader); more are asked while it catches up (it has
heard of the high watermark, not yet received the records: it answers empty
itself). An offset beyond anything the partition holds is still 416.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ring.log import batch as batchfmt
from tests.brokers import Member, Reply, TestCluster

pytestmark = pytest.mark.integration

CT_BATCH = "application/vnd.ring.batch"
CT_BATCHES = "application/vnd.ring.batches"
TOPIC = "lagging"
BATCH = bytes(batchfmt.encode([(None, None, b"v" * 1000, None)] * 900, now_ms=1_700_000_000_000))
LAG_REQUESTS = 3  # about 33 MiB the follower has to catch up on
WAIT_MS = 8_000


def _partition(m: Member) -> dict:
    r = m.http.get(f"/v1/topics/{TOPIC}")
    assert r.status == 200, (m.name, r.body)
    return r.json()["partitions"][0]


def _next(reply: Reply) -> int:
    return int(reply.headers["Ring-Next-Offset"])


def test_follower_behind_the_leader_does_not_call_committed_offsets_out_of_range(make_cluster) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "never")
    assert c[0].http.create_topic(TOPIC, partitions=1, replication_factor=3).status == 201
    leader = c.member(c.leaders(TOPIC)[0])
    follower = next(m for m in c if m is not leader)
    for m in c:  # every broker has the topic before the follower stops
        _partition(m)

    follower.pause()
    try:
        for _ in range(LAG_REQUESTS):
            r = leader.http.produce(TOPIC, BATCH * 12, content_type=CT_BATCH, partition=0, consistency="quorum")
            assert r.status == 200, r.body
        # The consumer reads the leader up to its high watermark.
        hw = _partition(leader)["high_watermark"]
        r = leader.http.fetch(TOPIC, 0, accept=CT_BATCHES, offset=hw - 1, wait_ms=0)
        assert r.status == 200 and _next(r) == hw, (r.status, r.headers)
        # Then asks the follower for the next offset; the requests wait in its socket until it resumes.
        with ThreadPoolExecutor(3) as pool:
            at_once = pool.submit(follower.http.fetch, TOPIC, 0, accept=CT_BATCHES, offset=hw, wait_ms=0)
            waiting = pool.submit(follower.http.fetch, TOPIC, 0, accept=CT_BATCHES, offset=hw, wait_ms=WAIT_MS)
            beyond = pool.submit(follower.http.fetch, TOPIC, 0, accept=CT_BATCHES, offset=hw + 10**6, wait_ms=0)
            time.sleep(0.5)
            follower.resume()
            first = at_once.result(timeout=30)
            # While it catches up (it hears of the high watermark before it holds the records
            # below it), every fetch of that offset is answered.
            during = _sample_until_caught_up(follower, hw)
            r = leader.http.produce(TOPIC, BATCH, content_type=CT_BATCH, partition=0, consistency="quorum")
            assert r.status == 200 and r.json()["base_offset"] == hw, r.body
            second = waiting.result(timeout=30)
            far = beyond.result(timeout=30)
    finally:
        follower.resume()

    assert first.status == 200, (first.status, first.body[:300])
    assert first.body == b"" and _next(first) == hw
    assert second.status == 200, (second.status, second.body[:300])
    records = [rec.offset for _, pos in batchfmt.scan(second.body, verify=False)
               for rec in batchfmt.decode(second.body, pos, verify=False)[1]]
    assert hw in records and _next(second) > hw
    assert far.status == 416, (far.status, far.body[:300])
    assert far.json()["latest"] < hw + 10**6
    assert during and all(status == 200 for status, _, _ in during), during
    # Some were answered by the follower itself while it lagged (its own high watermark, below
    # the offset asked for), not only by the leader it asks about offsets it never heard of.
    assert any(answered < hw and end < hw for _, answered, end in during), during


def _sample_until_caught_up(follower: Member, hw: int) -> list[tuple[int, int, int]]:
    """(status, high watermark answered, the follower's log end after) of fetches at ``hw``
    asked of the follower until its log reaches ``hw`` (at most 300, at most 20 s)."""
    out: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + 20
    for _ in range(300):
        r = follower.http.fetch(TOPIC, 0, accept=CT_BATCHES, offset=hw, wait_ms=0)
        end = _partition(follower)["end_offset"]
        out.append((r.status, int(r.headers.get("Ring-High-Watermark", -1)), end))
        if end >= hw or time.monotonic() > deadline:
            break
    return out

