"""Apache Kafka's Java client, unchanged, against ring's Kafka listener: Kafka's own verifiable producer
and consumer (``kafka-tools``, the tools Kafka's system tests drive; from Maven Central through
``ring.bench.kafka_tools``). The producer's acknowledged records are where it was told they are; a group
of verifiable consumers rebalances as a member joins and leaves, commits what it consumed, and a member
started again in the group resumes from the commits; Kafka's kafka-topics creates, lists and deletes a
topic. A real 3-broker ring; one cluster for the module."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
from typing import Any

import pytest

from ring.bench import kafka_tools
from tests.brokers import TestCluster
from tests.support import require, wait_for

pytestmark = pytest.mark.integration

TOPIC, GROUP, PARTITIONS = "java", "java-verifiable", 2
RUN_S = 120  # bound on a tool run that ends by itself
JVM = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]  # small, quick to start: a client


@pytest.fixture(scope="module")
def tools() -> str:
    java = shutil.which("java")
    cp = kafka_tools.classpath() if java else "cannot run Kafka's tools: java is not installed"
    require(cp if cp.startswith("cannot") else None)
    return cp


@pytest.fixture(scope="module")
def ring(tools: str, kafka_cluster: TestCluster) -> TestCluster:
    c = kafka_cluster
    r = c[0].http.post("/v1/topics", json_body={"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 3})
    assert r.status == 201, r.body
    return c


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def produce(c: TestCluster, cp: str, n: int, prefix: int) -> list[dict[str, Any]]:
    """``n`` records from Kafka's verifiable producer at acks=all, keys repeating over 8; its successes."""
    r = subprocess.run(["java", *JVM, "-cp", cp, kafka_tools.VERIFIABLE_PRODUCER, "--bootstrap-server",
                        c.kafka_bootstrap, "--topic", TOPIC, "--max-messages", str(n), "--acks", "-1",
                        "--repeating-keys", "8", "--value-prefix", str(prefix)],
                       capture_output=True, text=True, timeout=RUN_S)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    got = events(r.stdout)
    done = [e for e in got if e["name"] == "tool_data"]
    assert done and done[0]["sent"] == n and done[0]["acked"] == n, done
    return [e for e in got if e["name"] == "producer_send_success"]


class Consumer:
    """Kafka's verifiable consumer in ``GROUP``, running until stopped (SIGTERM: it leaves the group),
    its events read as they come."""

    def __init__(self, c: TestCluster, cp: str, *more: str) -> None:
        self.proc = subprocess.Popen(["java", *JVM, "-cp", cp, kafka_tools.VERIFIABLE_CONSUMER,
                                      "--bootstrap-server", c.kafka_bootstrap, "--topic", TOPIC,
                                      "--group-id", GROUP, "--reset-policy", "earliest", "--session-timeout",
                                      "10000", *more], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def held(self) -> set[int] | None:
        """The partitions of its last assignment (None before one, or while revoked)."""
        last = None
        for e in self.events:
            if e["name"] == "partitions_assigned":
                last = {p["partition"] for p in e["partitions"]}
            elif e["name"] == "partitions_revoked":
                last = None
        return last

    def consumed(self) -> set[tuple[int, int]]:
        return {(p["partition"], o) for e in self.events if e["name"] == "records_consumed"
                for p in e["partitions"] for o in range(p["minOffset"], p["maxOffset"] + 1)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(RUN_S)


def test_what_the_java_producer_had_acknowledged_is_where_it_was_told(ring: TestCluster, tools: str) -> None:
    acked = produce(ring, tools, 300, 1)
    assert len(acked) == 300
    stored = {}
    for p in range(PARTITIONS):
        r = ring[1].http.fetch(TOPIC, p, offset=0, max_records=1000)
        assert r.status == 200, r.body
        stored.update({(p, rec["offset"]): (rec["key"], rec["value"]) for rec in r.json()["records"]})
    assert {(e["partition"], e["offset"]): (e["key"], e["value"]) for e in acked} == stored
    assert {e["partition"] for e in acked} == set(range(PARTITIONS))  # the keys spread over both


def test_a_java_group_rebalances_commits_and_resumes_from_its_commits(ring: TestCluster, tools: str) -> None:
    ends = lambda: ring[0].http.end_offsets(TOPIC)  # noqa: E731
    a = Consumer(ring, tools)
    b: Consumer | None = None
    try:
        wait_for("the first member holding both partitions", lambda: a.held() == {0, 1}, timeout_s=60)
        b = Consumer(ring, tools)
        wait_for("a rebalance giving each member one partition",
                 lambda: a.held() is not None and b.held() is not None and a.held() | b.held() == {0, 1}
                 and not a.held() & b.held(), timeout_s=60)
        b.stop()  # it leaves the group: the first takes both partitions again
        wait_for("the first member holding both partitions after the second left", lambda: a.held() == {0, 1},
                 timeout_s=60)
        produce(ring, tools, 100, 2)
        everything = {(p, o) for p, end in enumerate(ends()) for o in range(end)}
        wait_for("every record consumed by one member or the other",
                 lambda: everything <= a.consumed() | b.consumed(), timeout_s=60)
        # what was consumed is committed: the group's offsets reach the end of each partition
        wait_for("the group's commits at the end of each partition", lambda: [
            o["committed"] for o in sorted(ring[2].http.get(f"/v1/groups/{GROUP}").json()["offsets"],
                                           key=lambda o: o["partition"])] == ends(), timeout_s=30)
    finally:
        a.stop()
        if b is not None:
            b.stop()
    committed = ends()
    produce(ring, tools, 40, 3)
    again = Consumer(ring, tools, "--max-messages", "40")
    try:
        assert again.proc.wait(RUN_S) == 0
    finally:
        again.stop()
    # started again in the group, it reads from the commits on: only what came since
    assert again.consumed() == {(p, o) for p, end in enumerate(ends()) for o in range(committed[p], end)}


TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"  # what kafka-topics.sh runs


def kafka_topics(c: TestCluster, cp: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["java", *JVM, "-cp", cp, TOPIC_COMMAND, "--bootstrap-server", c.kafka_bootstrap, *args],
                          capture_output=True, text=True, timeout=RUN_S)


def test_kafka_topics_creates_lists_and_deletes_a_topic(ring: TestCluster, tools: str) -> None:
    """Kafka's own kafka-topics (the Java admin client's CreateTopics and DeleteTopics, at their highest versions)."""
    made = kafka_topics(ring, tools, "--create", "--topic", "by-kafka-topics", "--partitions", "2",
                        "--replication-factor", "3", "--config", "retention.ms=60000")
    assert made.returncode == 0 and "Created topic by-kafka-topics." in made.stdout, made.stdout + made.stderr
    doc = ring[2].http.describe("by-kafka-topics")
    assert (len(doc["partitions"]), doc["replication_factor"], doc["retention_ms"]) == (2, 3, 60000)
    again = kafka_topics(ring, tools, "--create", "--topic", "by-kafka-topics", "--partitions", "2")
    assert again.returncode != 0 and "already exists" in again.stdout + again.stderr
    listed = kafka_topics(ring, tools, "--list")
    assert listed.returncode == 0 and "by-kafka-topics" in listed.stdout.split()
    gone = kafka_topics(ring, tools, "--delete", "--topic", "by-kafka-topics")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert all(b.http.get("/v1/topics/by-kafka-topics").status == 404 for b in ring)


def test_kafka_topics_grows_a_topic_and_describes_its_partitions_and_configs(ring: TestCluster, tools: str) -> None:
    """kafka-topics --alter --partitions (the Java admin client's CreatePartitions) and --describe (Metadata,
    and DescribeConfigs for the configs set on the topic)."""
    made = ring[0].http.create_topic("grown-by-kafka-topics", partitions=2, retention_ms=60000)
    assert made.status == 201, made.body
    grown = kafka_topics(ring, tools, "--alter", "--topic", "grown-by-kafka-topics", "--partitions", "4")
    assert grown.returncode == 0, grown.stdout + grown.stderr
    wait_for("four partitions on every broker", lambda: all(
        len(b.http.describe("grown-by-kafka-topics")["partitions"]) == 4 for b in ring))
    shown = kafka_topics(ring, tools, "--describe", "--topic", "grown-by-kafka-topics")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    head = shown.stdout.splitlines()[0]
    assert "PartitionCount: 4" in head and "ReplicationFactor: 3" in head, shown.stdout
    assert "Configs: retention.ms=60000" in head, shown.stdout  # only what was set for the topic
    leaders = [line for line in shown.stdout.splitlines()[1:] if "Partition:" in line]
    assert len(leaders) == 4, shown.stdout
