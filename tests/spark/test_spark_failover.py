"""A broker killed while a Spark read job runs: tasks move to another replica
and the job still yields every record exactly once, in offset order.

The kill lands while tasks are running, and the test knows it: each task
reads the first records of its split, says so in a file and waits at a gate
(a file the test creates) before reading on; the test kills the broker a
parked task was reading from, then opens the gate. Fetches are small, so
every split needs several, and those after the gate must go elsewhere.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import sparkio
from ring.localcluster import LocalCluster
from sparkio.client import BrokerClient
from sparkio.fetch import decode_answer
from tests.spark.conftest import produce_numbered
from tests.support import wait_for

GATE_WAIT_S = 120.0  # how long a parked task waits for the test to open the gate before it gives up


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path / "cluster", 3)
    c.start()  # returns once every broker sees the others up
    yield c
    c.stop()


def _gated(gate: str):
    """Tasks that read the first record of their split, mark themselves (``read-<index>``, holding
    that record's offset) and wait for the ``go`` file before reading the rest."""

    def run(index, records):
        records = iter(records)
        first = next(records, None)
        if first is None:
            return
        Path(gate, f"read-{index}").write_text(str(first.offset))
        deadline = time.monotonic() + GATE_WAIT_S
        while not Path(gate, "go").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the test never opened the gate")
            time.sleep(0.02)
        yield first
        yield from records

    return run


def test_read_survives_a_broker_killed_while_tasks_read(spark, cluster, tmp_path):
    urls = [b.url for b in cluster.brokers]
    with BrokerClient(urls) as client:
        client.create_topic("failover", 6, replication_factor=3)
        values = produce_numbered(client, "failover", 6_000)
        assert client.cluster(), "the cluster map is what lets tasks prefer replicas"

    # 1 KiB fetches: about one stored batch (~80 records) each, so a split of 250 takes several.
    result = sparkio.read_rdd(spark.sparkContext, ",".join(urls), "failover", max_records_per_partition=250,
                              fetch_max_bytes=1024)
    assert all(len(s.urls) == 3 for s in result.ranges), "splits should list their replicas"
    gate = tmp_path / "gate"
    gate.mkdir()
    chunks: list = []
    failure: list[BaseException] = []

    def job() -> None:
        try:
            chunks.extend(result.rdd.mapPartitionsWithIndex(_gated(str(gate))).glom().collect())
        except BaseException as exc:  # the assertion below says what it was
            failure.append(exc)

    runner = threading.Thread(target=job)
    runner.start()
    parked = wait_for("a task parked at the gate after its first records", lambda: sorted(gate.glob("read-*")), 60)
    index = int(parked[0].name.split("-")[1])
    victim = next(b for b in cluster.brokers if b.url == result.ranges[index].urls[0])
    victim.kill()  # the parked task holds part of its split; the job cannot end before the gate opens
    (gate / "go").touch()
    runner.join(120)
    assert not runner.is_alive(), "the read job hung after a broker died"
    assert not failure, failure

    assert len(chunks) == len(result.ranges)
    for split, records in zip(result.ranges, chunks):
        assert [r.offset for r in records] == list(range(split.start, split.end))
    assert sorted(r.value for c in chunks for r in c) == sorted(values)
    # The parked task had its split's first fetch before the kill; the rest took fetches after it.
    split = result.ranges[index]
    assert int(parked[0].read_text()) == split.start
    with BrokerClient([b.url for b in cluster.brokers if b is not victim]) as client:
        answer = client.fetch("failover", split.partition, split.start, max_bytes=1024)
        assert len(decode_answer(answer, split.start, split.end)) < split.size

    # Planning with the dead broker first in the list still works.
    df = (spark.read.format("ring").option("brokers", ",".join([victim.url, *urls]))
          .option("subscribe", "failover").load())
    assert df.count() == 6_000
