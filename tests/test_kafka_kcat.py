"""kcat (Debian's package, librdkafka's command-line client) against ring's Kafka listener, unchanged: it
produces keyed records with repeated headers that HTTP reads back as written, consumes what HTTP wrote,
and consumes as a group that rebalances when a member joins and leaves, commits, and resumes from its
commits when it starts again. A real 3-broker ring; one cluster for the module."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
from typing import IO

import msgpack
import pytest

from tests.brokers import TestCluster
from tests.support import require, wait_for

pytestmark = pytest.mark.integration

KCAT = shutil.which("kcat")
RUN_S = 60  # bound on one kcat run that ends by itself (-e)
FORMAT = "%p|%o|%k|%s|%h\\n"  # partition, offset, key, value, headers (name=value, comma-separated)


@pytest.fixture(scope="module")
def ring(kafka_cluster: TestCluster) -> TestCluster:
    require(None if KCAT else "kcat is not installed (Debian package kcat)")
    return kafka_cluster


def topic(c: TestCluster, name: str, partitions: int = 2) -> str:
    r = c[0].http.post("/v1/topics", json_body={"name": name, "partitions": partitions, "replication_factor": 3})
    assert r.status == 201, r.body
    return name


def kcat(c: TestCluster, *args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    r = subprocess.run([KCAT, "-b", c.kafka_bootstrap, *args], input=stdin, capture_output=True, text=True,
                       timeout=RUN_S)
    assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


def lines(out: str) -> list[tuple[int, int, str, str, str]]:
    rows = []
    for line in out.splitlines():
        p, o, k, v, h = line.split("|")
        rows.append((int(p), int(o), k, v, h))
    return sorted(rows)


def http_records(c: TestCluster, name: str, partitions: int) -> list[tuple[int, int, str, str, list]]:
    out = []
    for p in range(partitions):
        r = c[1].http.fetch(name, p, offset=0)  # another broker than the one kcat's records went through first
        assert r.status == 200, r.body
        out += [(p, rec["offset"], rec["key"], rec["value"], rec["headers"]) for rec in r.json()["records"]]
    return sorted(out)


def test_what_kcat_produces_http_reads_as_written(ring: TestCluster) -> None:
    name = topic(ring, "kcat-in")
    records = "".join(f"user-{i % 3}:view {i}\n" for i in range(9))
    kcat(ring, "-P", "-t", name, "-K:", "-H", "trace=a", "-H", "trace=b", "-H", "origin=kcat", "-X", "acks=all",
         stdin=records)
    got = http_records(ring, name, 2)
    assert sorted(v for _, _, _, v, _ in got) == sorted(f"view {i}" for i in range(9))
    for p, _, key, value, headers in got:
        assert key == f"user-{int(value.split()[1]) % 3}", (p, key, value)
        assert headers == [["trace", "a"], ["trace", "b"], ["origin", "kcat"]]  # in order, the repeat kept
    by_key = {}
    for p, offset, key, value, _ in got:
        by_key.setdefault(key, set()).add(p)
    assert all(len(ps) == 1 for ps in by_key.values()), by_key  # one key, one partition
    # kcat reads back the same, at the same offsets
    assert lines(kcat(ring, "-C", "-t", name, "-o", "beginning", "-e", "-q", "-f", FORMAT)) == [
        (p, o, k, v, ",".join("=".join(h) for h in hs)) for p, o, k, v, hs in got]


def test_kcat_reads_what_http_wrote(ring: TestCluster) -> None:
    name = topic(ring, "kcat-out", partitions=1)
    body = msgpack.packb([{"key": "k", "value": b"a", "headers": [["h", b"1"], ["h", b"2"]]},
                          {"key": "k", "value": None}, {"value": b"c"}], use_bin_type=True)
    r = ring[2].http.produce(name, body, "application/msgpack", partition="0")
    assert r.status == 200, r.body
    # -Z: a record without a value (a tombstone) or without a key reads as NULL
    assert lines(kcat(ring, "-C", "-t", name, "-o", "beginning", "-e", "-q", "-Z", "-f", FORMAT)) == [
        (0, 0, "k", "a", "h=1,h=2"), (0, 1, "k", "NULL", ""), (0, 2, "NULL", "c", "")]


class Member:
    """A kcat group member running until stopped (SIGTERM: it leaves the group and commits), its stdout
    (records) and stderr (rebalances) read as they come."""

    def __init__(self, c: TestCluster, group: str, name: str) -> None:
        assert KCAT is not None
        self.proc = subprocess.Popen([KCAT, "-b", c.kafka_bootstrap, "-u", "-G", group, name, "-f", FORMAT,
                                      "-X", "auto.offset.reset=earliest", "-X", "session.timeout.ms=6000",
                                      "-X", "auto.commit.interval.ms=200"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.records: list[str] = []
        self.events: list[str] = []
        for stream, into in ((self.proc.stdout, self.records), (self.proc.stderr, self.events)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line.rstrip("\n"))

    def assigned(self) -> str | None:
        """The partitions of this member's last assignment ("kc [0], kc [1]"), None before one."""
        got = [e.split("assigned: ", 1)[1] for e in self.events if "assigned: " in e]
        return got[-1] if got else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(RUN_S)


def test_a_kcat_group_rebalances_as_members_join_and_leave_and_resumes_from_its_commits(ring: TestCluster) -> None:
    name, group = topic(ring, "kcat-group"), "kcat-members"
    produce = lambda first, n: kcat(ring, "-P", "-t", name, "-K:", "-X", "acks=all",  # noqa: E731
                                    stdin="".join(f"k{i}:{i}\n" for i in range(first, first + n)))
    produce(0, 20)
    a = Member(ring, group, name)
    try:
        wait_for("the first member holding both partitions", lambda: a.assigned() == f"{name} [0], {name} [1]",
                 timeout_s=40)
        wait_for("the first member reading all 20 records", lambda: len(a.records) >= 20, timeout_s=40)
        b = Member(ring, group, name)
        try:
            wait_for("a rebalance giving each member one partition",
                     lambda: {a.assigned(), b.assigned()} == {f"{name} [0]", f"{name} [1]"}, timeout_s=40)
        finally:
            b.stop()  # it leaves: the first takes both partitions again
        wait_for("the first member holding both partitions after the second left",
                 lambda: a.assigned() == f"{name} [0], {name} [1]" and len(a.events) > 2, timeout_s=40)
        produce(20, 10)
        wait_for("the first member reading the 10 new records", lambda: len(a.records) + len(b.records) >= 30,
                 timeout_s=40)
    finally:
        a.stop()
    read = sorted(int(line.split("|")[3]) for line in a.records + b.records)
    assert sorted(set(read)) == list(range(30)), read
    offsets = {o["partition"]: o["committed"] for o in ring[1].http.get(f"/v1/groups/{group}").json()["offsets"]}
    ends = {p: ring[0].http.end_offsets(name)[p] for p in (0, 1)}
    assert offsets == ends, (offsets, ends)  # every record read is committed, as the members left
    # Started again in the same group: it resumes from the commits, reading only what came since.
    produce(30, 6)
    out = kcat(ring, "-G", group, name, "-e", "-q", "-f", FORMAT, "-X", "auto.offset.reset=earliest")
    assert sorted(int(v) for _, _, _, v, _ in lines(out)) == list(range(30, 36))
