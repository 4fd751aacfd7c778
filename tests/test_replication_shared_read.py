"""The leader's followers of one partition share a log read (``Links.read``): the second link gets
the first one's bytes, only from the same offset in the same epoch, and they are what the log holds."""

from __future__ import annotations

from pathlib import Path

from ring.clock import ManualClock
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.node.links import Links
from ring.replication.replica import Replica

T0 = 1_700_000_000_000


def test_followers_share_a_read_from_the_same_offset_in_the_same_epoch(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
    rep = Replica("t", 0, log, "a", ["a", "b", "c"])
    rep.lead()
    for i in range(20):
        log.append(B.encode([(T0, None, b"v%d" % i, None)], now_ms=T0), rep.epoch)
    links = Links("a", lambda topic, p: rep)
    try:
        links.assign({"b": {("t", 0)}, "c": {("t", 0)}}, 0.0)
        whole = log.read(0, 1 << 20)
        assert links.read(rep, 0) == (whole, False)
        assert links.read(rep, 0) == (whole, True)  # the other follower's link: no second read
        assert links.read(rep, 0) == (whole, False)  # both took it: read again
        assert links.read(rep, 5)[1] is False and links.read(rep, 5) == (log.read(5, 1 << 20), True)
        links.read(rep, 10)
        rep.epoch += 1  # a new epoch: what was read in the last one is not reused
        log.begin_epoch(rep.epoch)
        assert links.read(rep, 10) == (log.read(10, 1 << 20), False)
    finally:
        log.close()
