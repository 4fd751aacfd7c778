"""Idempotent Kafka producers through ring's Kafka listener (InitProducerId, ring.kafka_api.producer_ids, and
producer ids and sequences judged by ring.replication.idempotence): raw frames for a retried batch, a sequence
out of order and a transactional id, and librdkafka's idempotent producer (acks=all) on a real 3-broker ring,
through a partition leader's SIGKILL. One cluster for the module."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any, Iterator

import pytest
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from ring.kafka_api import errors, producer_ids
from ring.kafka_api.records import HEADER, KafkaProducerId, encode_batch, from_stored
from ring.log import batch as batchfmt
from tests.brokers import TestCluster
from tests.support import wait_for
from tests.test_kafka_groups import call
from tests.test_kafka_listener import _exactly, produce_answer, produce_frame

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path_factory.mktemp("kidem"), size=3, kafka=True, args=["--fsync", "interval:100"]).start()
    yield c
    c.kill()


def kafka_addr(c: TestCluster, name: str) -> tuple[str, int]:
    """The Kafka listener of the member ``name``."""
    i = next(i for i, m in enumerate(c) if m.name == name)
    host, _, port = c.kafka_bootstrap.split(",")[i].rpartition(":")
    return host, int(port)


def topic_led(c: TestCluster, topic: str, partitions: int) -> dict[int, str]:
    assert c[0].http.create_topic(topic, partitions=partitions, replication_factor=3).status == 201
    return wait_for("a leader for every partition", lambda: (
        lambda ls: ls if len(ls) == partitions and all(ls.values()) else None)(c.leaders(topic)))


def stored_batches(m: Any, topic: str, partition: int) -> list[tuple[batchfmt.BatchHeader, bytes]]:
    """Each stored batch of a partition (read over ring's HTTP API from ``m``): its header and bytes."""
    reply = m.http.get(f"/v1/topics/{topic}/partitions/{partition}/messages", query={"offset": 0},
                       headers={"Accept": "application/vnd.ring.batches"})
    assert reply.status == 200, reply.body
    return [(h, reply.body[pos:pos + h.size]) for h, pos in batchfmt.scan(reply.body)]


def stored_values(m: Any, topic: str, partition: int) -> list[bytes]:
    reply = m.http.get(f"/v1/topics/{topic}/partitions/{partition}/messages", query={"offset": 0},
                       headers={"Accept": "application/vnd.ring.batches"})
    assert reply.status == 200, reply.body
    hw = int(reply.headers["Ring-High-Watermark"])
    return [r.value for r, _ in batchfmt.records_between(reply.body, 0, hw, 10**6)]


def init_producer_id(addr: tuple[str, int], version: int = 4, transactional_id: str | None = None) -> Any:
    req = InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=60_000)
    return call(addr, req, version, InitProducerIdResponse, flexible=version >= 2)


def produce(s: socket.socket, correlation_id: int, topic: str, batch: bytes) -> tuple[int, int]:
    """(error code, base offset) of one Produce v3 (acks=all) of ``batch`` to partition 0."""
    s.sendall(produce_frame(correlation_id, topic, 0, batch))
    size = struct.unpack(">i", _exactly(s, 4))[0]
    data = _exactly(s, size)
    assert struct.unpack(">i", data[:4])[0] == correlation_id
    return produce_answer(data[4:])


def raw_batch(pid: int, seq: int, values: list[bytes], epoch: int = 0) -> bytes:
    """One idempotent batch of ``values``, timestamped now: a new leader rebuilds its producer table from the
    batches of the last ``PRODUCER_STATE_WINDOW_MS``, by their timestamps."""
    now_ms = time.time_ns() // 1_000_000
    return bytes(encode_batch(0, 0, [(now_ms, None, v, []) for v in values],
                              producer=KafkaProducerId(pid, epoch, seq)))


def test_a_retried_batch_is_stored_once_and_a_sequence_out_of_order_is_refused(ring):
    leader = topic_led(ring, "raw-idem", 1)[0]
    addr = kafka_addr(ring, leader)
    got = init_producer_id(addr)
    assert (got.error_code, got.producer_epoch) == (0, 0) and got.producer_id >= 0
    pid = got.producer_id

    def batch(seq: int, n: int, epoch: int = 0) -> bytes:
        return raw_batch(pid, seq, [b"v%d" % (seq + i) for i in range(n)], epoch)

    with socket.create_connection(addr, timeout=30) as s:
        assert produce(s, 1, "raw-idem", batch(0, 3)) == (errors.NONE, 0)
        assert produce(s, 2, "raw-idem", batch(0, 3)) == (errors.NONE, 0)  # the retry: its first offset
        assert produce(s, 3, "raw-idem", batch(3, 2)) == (errors.NONE, 3)
        assert produce(s, 4, "raw-idem", batch(3, 2)) == (errors.NONE, 3)
        assert produce(s, 5, "raw-idem", batch(1, 2)) == (errors.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        assert produce(s, 6, "raw-idem", batch(6, 1)) == (errors.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)  # 5 skipped
        assert produce(s, 7, "raw-idem", batch(0, 1, epoch=1)) == (errors.NONE, 5)  # a bumped epoch starts anew
    assert stored_values(ring.member(leader), "raw-idem", 0) == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v0"]
    stored = stored_batches(ring.member(leader), "raw-idem", 0)
    assert [(h.producer_id, h.base_sequence) for h, _ in stored] == [
        (producer_ids.fold(pid, 0), 0), (producer_ids.fold(pid, 0), 3), (producer_ids.fold(pid, 1), 0)]
    assert all(h.sequences_contiguous for h, _ in stored)  # a gap after any of them is refused, by any leader
    fetched = from_stored(b"".join(data for _, data in stored))  # what a Fetch answers
    heads, pos = [], 0
    while pos < len(fetched):
        h = HEADER.unpack_from(fetched, pos)
        heads.append((h[0], *h[9:13]))  # base offset, producer id, epoch, base sequence, count
        pos += 12 + h[1]
    assert heads == [(0, pid, 0, 0, 3), (3, pid, 0, 3, 2), (5, pid, 1, 0, 1)]


def test_a_transactional_init_producer_id_is_refused(ring):
    addr = kafka_addr(ring, ring[0].name)
    for version in (0, 2, 4, 5):
        got = init_producer_id(addr, version, transactional_id="tx-1")
        assert (got.error_code, got.producer_id, got.producer_epoch) == (
            errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)


def idempotent_producer(c: TestCluster, **config: Any) -> Any:
    from confluent_kafka import Producer as KafkaProducer

    return KafkaProducer({"bootstrap.servers": c.kafka_bootstrap, "enable.idempotence": True, "acks": "all",
                          "linger.ms": 5, **config})


def test_an_idempotent_producer_lands_every_record_once_in_order(ring):
    topic_led(ring, "idem", 3)
    producer = idempotent_producer(ring)
    acked: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    failed: list = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            acked[msg.partition()].append(msg.value())

    for i in range(600):
        producer.produce("idem", value=b"%d" % i, partition=i % 3, on_delivery=report)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not failed
    for p in range(3):
        sent = [b"%d" % i for i in range(p, 600, 3)]
        assert acked[p] == sent
        assert stored_values(ring[1], "idem", p) == sent
        heads = [h for h, _ in stored_batches(ring[1], "idem", p)]
        assert len({h.producer_id for h in heads}) == 1 and heads[0].producer_id >= 0  # idempotent, one producer
        assert [h.base_sequence for h in heads] == [h.base_offset for h in heads]  # sequences as offsets here


def test_a_kafka_python_idempotent_producer_lands_every_record_once_in_order(ring):
    from kafka import KafkaProducer

    topic_led(ring, "idem-kp", 1)
    producer = KafkaProducer(bootstrap_servers=ring.kafka_bootstrap, enable_idempotence=True, acks="all")
    try:
        futures = [producer.send("idem-kp", b"%d" % i, partition=0) for i in range(200)]
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close()
    assert offsets == list(range(200))
    assert stored_values(ring[0], "idem-kp", 0) == [b"%d" % i for i in range(200)]
    heads = [h for h, _ in stored_batches(ring[0], "idem-kp", 0)]
    assert heads[0].producer_id >= 0 and all(h.sequences_contiguous for h in heads)


def test_an_idempotent_producer_rides_through_a_leaders_sigkill_losing_and_doubling_nothing(ring):
    """Last in the module: it kills and restarts a broker. The leader of partition 0 is SIGKILLed while the
    producer has batches in flight to it and restarted while the producer goes on: every record is
    acknowledged, and each partition holds each of its values once, in the order produced. A batch sent
    before the kill, sent again to the partition's leader after it, is answered with its first offset."""
    leaders = topic_led(ring, "idem-kill", 3)
    victim = ring.member(leaders[0])
    raw = raw_batch(init_producer_id(kafka_addr(ring, victim.name)).producer_id, 0, [b"raw"])
    with socket.create_connection(kafka_addr(ring, victim.name), timeout=30) as s:
        assert produce(s, 1, "idem-kill", raw) == (errors.NONE, 0)
    producer = idempotent_producer(ring, **{"message.timeout.ms": 120_000, "topic.metadata.refresh.interval.ms": 500})
    acked: dict[int, set[bytes]] = {0: set(), 1: set(), 2: set()}
    failed: list = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            acked[msg.partition()].add(msg.value())

    total, killed_at, in_flight = 1500, None, 0
    for i in range(total):
        producer.produce("idem-kill", value=b"%d" % i, partition=i % 3, on_delivery=report)
        producer.poll(0.002)  # a stream, not a burst: the kill falls among batches sent and answered
        unacked = len(range(0, i + 1, 3)) - len(acked[0])  # produced to partition 0, not yet acknowledged
        if killed_at is None and len(acked[0]) >= 100 and unacked > 0:
            in_flight = unacked
            victim.kill()
            killed_at = i
        elif killed_at is not None and i == killed_at + 450:
            victim.restart()
    assert killed_at is not None and killed_at + 450 < total and in_flight > 0
    assert producer.flush(150) == 0
    assert not failed
    survivor = next(m for m in ring if m is not victim)
    leader = wait_for("a leader of partition 0", lambda: ring.leaders("idem-kill")[0])
    with socket.create_connection(kafka_addr(ring, leader), timeout=30) as s:  # the killed one's or its successor
        assert produce(s, 2, "idem-kill", raw) == (errors.NONE, 0)  # a retry of the first batch, recognised
    for p in range(3):
        sent = [b"raw"] * (p == 0) + [b"%d" % i for i in range(p, total, 3)]
        assert acked[p] == set(sent) - {b"raw"}  # every record acknowledged
        stored = wait_for(f"partition {p} whole", lambda: (
            lambda vs: vs if len(vs) >= len(sent) else None)(stored_values(survivor, "idem-kill", p)))
        assert stored == sent  # none lost, none twice, in the order produced
