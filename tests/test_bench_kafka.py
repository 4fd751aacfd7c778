"""ring bench's Apache Kafka peer, its pure parts: each node's server.properties, the pom Maven resolves,
the cluster id, the cached install a second run starts from, and the client configuration that makes one
Kafka request carry what one of ring's does."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from pathlib import Path

from ring.bench import gen_kafka, peer_kafka


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_each_node_is_broker_and_controller_on_loopback_with_rf3_and_min_isr2(tmp_path: Path) -> None:
    clients, controllers = [19092, 19093, 19094], [19095, 19096, 19097]
    nodes = [_props(peer_kafka.server_properties(i, clients, controllers, tmp_path / f"k{i}")) for i in range(3)]
    for i, p in enumerate(nodes):
        assert p["process.roles"] == "broker,controller"
        assert p["node.id"] == str(i)
        assert p["controller.quorum.voters"] == "0@127.0.0.1:19095,1@127.0.0.1:19096,2@127.0.0.1:19097"
        assert p["listeners"] == f"PLAINTEXT://127.0.0.1:{clients[i]},CONTROLLER://127.0.0.1:{controllers[i]}"
        assert p["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{clients[i]}"
        assert p["controller.listener.names"] == "CONTROLLER"
        assert p["log.dirs"] == str(tmp_path / f"k{i}")
        assert (p["default.replication.factor"], p["min.insync.replicas"]) == ("3", "2")
        assert p["offsets.topic.replication.factor"] == p["transaction.state.log.replication.factor"] == "3"
        assert p["auto.create.topics.enable"] == "false" and p["unclean.leader.election.enable"] == "false"
    # the nodes differ only in their identity, ports and log dir
    differing = {k for k in nodes[0] if len({p[k] for p in nodes}) > 1}
    assert differing == {"node.id", "listeners", "advertised.listeners", "log.dirs"}
    assert peer_kafka.TOPIC_CONFIG == {"min.insync.replicas": "2"}


def test_the_pom_names_the_broker_jar_at_the_pinned_version() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.fromstring(peer_kafka.pom())
    deps = {(d.findtext("m:groupId", namespaces=ns), d.findtext("m:artifactId", namespaces=ns)):
            d.findtext("m:version", namespaces=ns) for d in root.iterfind("m:dependencies/m:dependency", ns)}
    assert deps[("org.apache.kafka", "kafka_2.13")] == peer_kafka.VERSION
    assert peer_kafka.VERSION.startswith("4.")
    assert deps[("org.slf4j", "slf4j-api")] == deps[("org.slf4j", "slf4j-simple")]


def test_the_cluster_id_is_a_kafka_uuid() -> None:
    a, b = peer_kafka.cluster_id(), peer_kafka.cluster_id()
    assert a != b and len(a) == 22
    assert len(base64.urlsafe_b64decode(a + "==")) == 16


def test_a_cached_install_needs_neither_maven_nor_the_network(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / f"kafka-{peer_kafka.VERSION}"
    (home / "lib").mkdir(parents=True)
    (home / "lib" / f"kafka_2.13-{peer_kafka.VERSION}.jar").write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no java, no mvn, no apt-get to be found
    assert "not" in (peer_kafka.install_kafka(home) or ""), "without the marker of a finished copy: install"
    (home / "lib.complete").write_text(peer_kafka.VERSION)
    assert peer_kafka.install_kafka(home) is None
    monkeypatch.setenv("RING_BENCH_CACHE", str(tmp_path))
    assert peer_kafka.KafkaSystem(tmp_path / "run").home == home


def test_one_request_carries_one_record_or_a_batch_of_a_hundred_acked_by_all_in_sync() -> None:
    one = gen_kafka.producer_config("127.0.0.1:1", 1)
    hundred = gen_kafka.producer_config("127.0.0.1:1", 100)
    for cfg in (one, hundred):
        assert cfg["acks"] == "all" and cfg["enable.idempotence"] is False and cfg["compression.type"] == "none"
    assert (one["linger.ms"], one["batch.num.messages"]) == (0, 1)
    # a full batch leaves at once: linger only holds a request's records while they are handed over
    assert (hundred["linger.ms"], hundred["batch.num.messages"]) == (gen_kafka.BATCH_LINGER_MS, 100)
    consumer = gen_kafka.consumer_config("127.0.0.1:1", "g")
    assert consumer["enable.auto.commit"] is False and consumer["max.partition.fetch.bytes"] == 4 << 20


def test_the_report_prints_the_whole_configuration(tmp_path: Path) -> None:
    from ring.bench.run import Settings

    lines = "\n".join(peer_kafka.KafkaSystem(tmp_path).describe(Settings()))
    assert "process.roles=broker,controller" in lines and "min.insync.replicas=2" in lines
    assert f"Apache Kafka {peer_kafka.VERSION}" in lines and "-Xmx1g" in lines
    assert "producer, 1 record(s)/request; 86 producers at 256 requests in flight" in lines
    assert "'batch.num.messages': 100" in lines and "'acks': 'all'" in lines


def test_the_report_shows_the_records_per_request_the_client_counted() -> None:
    from ring.bench import render

    rows = [{"case": "produce-1-unkeyed-quorum", "system": "kafka",
             "client": {"produce_requests": 5436, "records_per_produce_request": 1.0}},
            {"case": "produce-100-unkeyed-quorum", "system": "kafka",
             "client": {"produce_requests": 874, "records_per_produce_request": 95.99}},
            {"case": "consume-fetch", "system": "kafka"}, {"case": "produce-1-unkeyed-quorum", "system": "ring"}]
    assert render._client_counts(rows, "kafka") == [
        "- records per ProduceRequest, as librdkafka counted them: produce-1-unkeyed-quorum 1.00 (5,436 requests), "
        "produce-100-unkeyed-quorum 95.99 (874 requests)"]
    assert render._client_counts(rows, "ring") == []
