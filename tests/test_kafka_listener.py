"""The Kafka protocol listener (``ring serve --kafka-listen``, ring.kafka_api) against real broker processes
and real Kafka clients (confluent-kafka's librdkafka, kafka-python), and raw frames for what no client sends."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pytest

from ring.kafka_api.cluster import node_id
from ring.localcluster import free_port
from tests.brokers import TestBroker
from tests.support import wait_for

pytestmark = pytest.mark.integration

API_VERSIONS, METADATA = 18, 3




# --- raw frames ------------------------------------------------------------------------------


def frame(api_key: int, version: int, correlation_id: int, body: bytes = b"", flexible: bool = False) -> bytes:
    head = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test" + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(head) + len(body)) + head + body


def connect(b: TestBroker) -> socket.socket:
    host, _, port = b.bootstrap.rpartition(":")  # type: ignore[attr-defined]
    return socket.create_connection((host, int(port)), timeout=10)


def read_answer(s: socket.socket) -> tuple[int, bytes]:
    """(correlation id, body) of the next answer (response header v0)."""
    size = struct.unpack(">i", _exactly(s, 4))[0]
    data = _exactly(s, size)
    return struct.unpack(">i", data[:4])[0], data[4:]


def _exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def closed_by_broker(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def api_ranges(body: bytes, flexible: bool) -> tuple[int, dict[int, tuple[int, int]]]:
    error = struct.unpack(">h", body[:2])[0]
    if flexible:
        count, pos, size = body[2] - 1, 3, 7  # (a one-byte compact length: fewer than 127 APIs)
    else:
        count, pos, size = struct.unpack(">i", body[2:6])[0], 6, 6
    ranges = {}
    for _ in range(count):
        key, low, high = struct.unpack(">hhh", body[pos:pos + 6])
        ranges[key] = (low, high)
        pos += size
    return error, ranges


def test_api_versions_v3_and_an_unsupported_version_answered_in_v0(kafka):
    with connect(kafka) as s:
        body = b"\x05ring\x041.0\x00"  # client software name and version (compact strings), no tagged fields
        s.sendall(frame(API_VERSIONS, 3, 7, body, flexible=True))
        corr, answer = read_answer(s)
        error, ranges = api_ranges(answer, flexible=True)
        assert (corr, error) == (7, 0)
        assert ranges[API_VERSIONS] == (0, 3) and ranges[METADATA] == (1, 9)
        s.sendall(frame(API_VERSIONS, 99, 8, b"\x00\x00\x00", flexible=True))
        corr, answer = read_answer(s)
        error, ranges = api_ranges(answer, flexible=False)
        assert (corr, error) == (8, 35)  # UNSUPPORTED_VERSION, and the versions to retry with
        assert ranges[API_VERSIONS] == (0, 3)
        s.sendall(frame(API_VERSIONS, 0, 9))  # the same connection still serves
        assert read_answer(s)[0] == 9


def test_metadata_names_this_broker_and_the_topics_partitions(kafka):
    from confluent_kafka.admin import AdminClient

    assert kafka.http.create_topic("meta", partitions=3).status == 201
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    md = admin.list_topics(timeout=10)
    me = node_id("ring-0")
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {
        me: ("127.0.0.1", int(kafka.bootstrap.rpartition(":")[2]))}
    parts = md.topics["meta"].partitions
    assert sorted(parts) == [0, 1, 2]
    assert all(p.leader == me and p.replicas == [me] and p.isrs == [me] and p.error is None for p in parts.values())


def test_metadata_of_an_unknown_topic_creates_it_when_auto_create_is_on(kafka):
    """As Kafka's auto.create.topics.enable, and as ring's own produce to an unknown topic."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.list_topics("made-by-metadata", timeout=10)
    assert kafka.http.get("/v1/topics/made-by-metadata").status == 200


def test_metadata_names_the_kafka_advertise_address(make_broker):
    port = free_port()
    b = make_broker("--kafka-listen", f"127.0.0.1:{port}", "--kafka-advertise", "kafka.example:19092")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(frame(METADATA, 1, 4, struct.pack(">i", -1)))  # every topic
        corr, body = read_answer(s)
    count, node, host_len = struct.unpack(">iih", body[:10])
    host = body[10:10 + host_len].decode()
    assert (corr, count, node, host, struct.unpack(">i", body[10 + host_len:14 + host_len])[0]) == (
        4, 1, node_id(b.local.name), "kafka.example", 19092)


@pytest.mark.parametrize("hostile", [
    pytest.param(struct.pack(">i", 2**31 - 1), id="length-prefix-of-2GiB"),
    pytest.param(struct.pack(">i", -5), id="negative-length"),
    pytest.param(struct.pack(">i", 3) + b"abc", id="shorter-than-a-header"),
    pytest.param(frame(12345, 0, 1), id="unknown-api-key"),
    pytest.param(frame(METADATA, 99, 1), id="unserved-version"),
    pytest.param(struct.pack(">i", 10) + struct.pack(">hhih", METADATA, 1, 1, 50), id="client-id-past-the-frame"),
    pytest.param(frame(METADATA, 1, 1, struct.pack(">i", 2**30)), id="array-count-past-the-frame"),
])
def test_hostile_frames_close_the_connection_and_the_listener_serves_on(kafka, hostile):
    with connect(kafka) as s:
        s.sendall(hostile)
        assert closed_by_broker(s)
    with connect(kafka) as s:  # nothing stays broken
        s.sendall(frame(API_VERSIONS, 0, 5))
        assert read_answer(s)[0] == 5


def create_topics_body(version: int, name: str) -> bytes:
    from kafka.protocol.admin import CreateTopicsRequest

    t = CreateTopicsRequest.CreatableTopic
    return bytes(CreateTopicsRequest(topics=[
        t(name=name, num_partitions=2, replication_factor=-1, assignments=[],
          configs=[t.CreatableTopicConfig(name="retention.ms", value="60000")])],
        timeout_ms=1000, validate_only=False).encode(version=version))


@pytest.mark.parametrize("version", [4, 5])  # the last classic version and the first flexible one
def test_a_truncated_or_lying_create_topics_closes_the_connection_and_creates_nothing(kafka, version):
    name = f"hostile-create-{version}"
    whole = create_topics_body(version, name)
    flexible = version >= 5
    # The topics' count: a classic int32 or a compact (unsigned varint) one; 2**31 - 1 entries claimed.
    absurd = (b"\xff\xff\xff\xff\x07" + whole[1:]) if flexible else struct.pack(">i", 2**31 - 1) + whole[4:]
    for body in [whole[:cut] for cut in (0, 3, len(whole) // 2, len(whole) - 1)] + [absurd]:
        with connect(kafka) as s:
            s.sendall(frame(19, version, 3, body, flexible=flexible))
            assert closed_by_broker(s)
        assert kafka.http.get(f"/v1/topics/{name}").status == 404
    with connect(kafka) as s:  # the whole body creates the topic those frames named: nothing else was wrong
        s.sendall(frame(19, version, 4, whole, flexible=flexible))
        corr, answer = read_answer(s)
    assert corr == 4
    assert kafka.http.describe(name)["retention_ms"] == 60000


async def test_trickled_frames_hold_no_more_than_the_body_budget(tmp_path, monkeypatch):
    """Buffered frame bytes count in the broker's request body budget as they arrive: many clients
    each sending part of a large frame are closed once it is spent, and the rest of the broker serves."""
    import asyncio

    from ring import limits
    from ring.http_api.budget import body_budget_of
    from ring.kafka_api.server import KafkaListener
    from tests.support import serve_alone

    monkeypatch.setattr(limits, "REQUEST_BODY_BYTES_IN_FLIGHT_MAX", 10_000)
    broker, server = await serve_alone(tmp_path / "data", "never")
    listener = KafkaListener(broker, "127.0.0.1", 0)
    await listener.start()
    budget = body_budget_of(broker)

    async def held(nbytes: int) -> None:
        for _ in range(500):
            if budget.used == nbytes:
                return
            await asyncio.sleep(0.01)
        assert budget.used == nbytes

    try:
        trickling = []
        for i in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(struct.pack(">i", 1_000_000) + b"\0" * 4000)  # a large frame, 4004 bytes of it so far
            trickling.append((reader, writer))
            if i < 2:
                await held(4004 * (i + 1))
        assert await asyncio.wait_for(trickling[2][0].read(), 5) == b""  # did not fit: closed
        await held(8008)
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(frame(API_VERSIONS, 0, 1))
        assert struct.unpack(">i", (await asyncio.wait_for(reader.readexactly(8), 5))[4:])[0] == 1
        for _, w in trickling + [(reader, writer)]:
            w.close()
        await held(0)  # given back as they close
    finally:
        await listener.stop()
        broker.begin_shutdown()
        await server.stop()
        await broker.close()


async def test_a_frame_not_whole_in_time_closes_its_connection(tmp_path, monkeypatch):
    import asyncio

    from ring import limits
    from ring.http_api.budget import body_budget_of
    from ring.kafka_api.server import KafkaListener
    from tests.support import serve_alone

    monkeypatch.setattr(limits, "BODY_READ_TIMEOUT_S", 0.5)
    broker, server = await serve_alone(tmp_path / "data", "never")
    listener = KafkaListener(broker, "127.0.0.1", 0)
    await listener.start()
    try:
        slow_r, slow_w = await asyncio.open_connection("127.0.0.1", listener.port)
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", listener.port)
        slow_w.write(frame(API_VERSIONS, 0, 1)[:-2])
        assert await asyncio.wait_for(slow_r.read(), 5) == b""  # closed at its deadline
        assert body_budget_of(broker).used == 0
        idle_w.write(frame(API_VERSIONS, 0, 2))  # an idle connection stays open
        assert struct.unpack(">i", (await asyncio.wait_for(idle_r.readexactly(8), 5))[4:])[0] == 2
        idle_w.close()
    finally:
        await listener.stop()
        broker.begin_shutdown()
        await server.stop()
        await broker.close()


async def test_requests_before_the_broker_opens_close_the_connection_and_are_served_after(tmp_path, caplog):
    """``ring serve`` listens before the broker opens its data directory: a client then is turned away
    (it connects again), as an expected refusal, not a failure, and not answered from a broker that
    knows no cluster yet."""
    import asyncio

    from ring.kafka_api.server import KafkaListener
    from tests.support import _cluster_broker

    async def answer(reader: asyncio.StreamReader) -> int:
        size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))[0]
        return struct.unpack(">i", (await reader.readexactly(size))[:4])[0]

    broker = _cluster_broker(tmp_path / "data", "never")
    listener = KafkaListener(broker, "127.0.0.1", 0)
    await listener.start()
    opened = False
    try:
        from ring.kafka_api.records import encode_batch

        for request in (frame(METADATA, 1, 2, struct.pack(">i", -1)), fetch_frame(2, "t", 0, 0, 0),
                        produce_frame(2, "t", 0, bytes(encode_batch(0, 0, [(5, b"k", b"v", [])])))):
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(frame(API_VERSIONS, 0, 1) + request)
            assert await answer(reader) == 1
            assert await asyncio.wait_for(reader.read(), 5) == b""  # no answer to the request: closed
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        broker.bind(1, 2, f"127.0.0.1:{listener.port}")
        broker.open()
        opened = True
        await broker.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(frame(METADATA, 1, 3, struct.pack(">i", -1)))
        assert await answer(reader) == 3
        writer.close()
    finally:
        await listener.stop()
        if opened:
            await broker.close()


def test_a_truncated_frame_holds_only_its_connection(kafka):
    with connect(kafka) as cut:
        cut.sendall(frame(API_VERSIONS, 0, 1)[:-3])
        with connect(kafka) as s:
            s.sendall(frame(API_VERSIONS, 0, 2))
            assert read_answer(s)[0] == 2
        cut.sendall(frame(API_VERSIONS, 0, 1)[-3:])  # the rest arrives: answered
        assert read_answer(cut)[0] == 1


def test_answers_keep_the_order_of_requests_on_a_connection(kafka):
    with connect(kafka) as s:
        s.sendall(b"".join(frame(API_VERSIONS, i % 4, 100 + i, b"\x01\x01\x00" if i % 4 == 3 else b"",
                                 flexible=i % 4 == 3) for i in range(50)))
        assert [read_answer(s)[0] for _ in range(50)] == list(range(100, 150))


@pytest.mark.parametrize("flags, why", [
    (["--kafka-advertise", "h:1"], "--kafka-advertise needs --kafka-listen"),
    (["--kafka-listen", "127.0.0.1:0", "--members", "2"], "--kafka-listen is for one broker a process"),
])
def test_kafka_listen_is_refused_where_it_would_not_hold(tmp_path, flags, why):
    """Without a listener to advertise, and with --members (one port for several processes)."""
    import subprocess
    import sys

    tokens = tmp_path / "tokens"
    tokens.write_text("alice s3cret-token-of-alice-0123456789 admin\n")
    argv = [sys.executable, "-m", "ring", "serve", "--data-dir", str(tmp_path / "d"), "--listen",
            f"127.0.0.1:{free_port()}", *[str(tokens) if f == "TOKENS" else f for f in flags]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr[-2000:]


# --- produce ---------------------------------------------------------------------------------


def stored_records(b: TestBroker, topic: str, partition: int) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every record of a partition, read over ring's HTTP API
    as its stored batches."""
    from ring.log import batch as batchfmt

    reply = b.http.get(f"/v1/topics/{topic}/partitions/{partition}/messages", query={"offset": 0},
                       headers={"Accept": "application/vnd.ring.batches"})
    assert reply.status == 200, reply.body
    hw = int(reply.headers["Ring-High-Watermark"])
    return [(r.offset, r.timestamp, r.key, r.value, r.headers or [])
            for r, _ in batchfmt.records_between(reply.body, 0, hw, 10**6)]


def produce_keyed(bootstrap: str, topic: str, n: int, **config: Any) -> dict[tuple[int, int], tuple]:
    """``n`` keyed records with headers (a name repeated, a null value) and timestamps through
    confluent-kafka's Producer; (partition, offset) -> (timestamp, key, value, headers) of each, as
    its delivery report says it landed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **config})
    landed: dict[tuple[int, int], tuple] = {}
    failed: list = []
    for i in range(n):
        rec = (1_700_000_000_000 + i, f"key-{i % 17}".encode(), None if i % 10 == 9 else f"value-{i}".encode(),
               [("trace", str(i).encode()), ("trace", None), ("kind", b"\x00\xff")])

        def report(err, msg, rec=rec):
            if err is not None:
                failed.append(err)
            else:
                landed[(msg.partition(), msg.offset())] = rec

        producer.produce(topic, key=rec[1], value=rec[2], headers=rec[3], timestamp=rec[0], on_delivery=report)
    assert producer.flush(30) == 0
    assert not failed and len(landed) == n
    return landed


def assert_stored(b: TestBroker, topic: str, partitions: int, landed: dict[tuple[int, int], tuple]) -> None:
    """Every record stored where its delivery report said, in order, as it was sent."""
    stored = {}
    for p in range(partitions):
        for offset, ts, key, value, headers in stored_records(b, topic, p):
            stored[(p, offset)] = (ts, key, value, [(n, v) for n, v in headers])
    assert stored == landed


def test_a_producer_with_acks_all_lands_every_record_where_its_report_says(kafka):
    assert kafka.http.create_topic("produced", partitions=4).status == 201
    landed = produce_keyed(kafka.bootstrap, "produced", 300)
    assert_stored(kafka, "produced", 4, landed)
    by_key: dict[bytes, set[int]] = {}
    for (p, _), (_, key, _, _) in landed.items():
        by_key.setdefault(key, set()).add(p)
    assert all(len(ps) == 1 for ps in by_key.values())  # the client's partitioner, kept


def test_gzip_batches_are_read(kafka):
    assert kafka.http.create_topic("gzipped", partitions=2).status == 201
    landed = produce_keyed(kafka.bootstrap, "gzipped", 100, **{"compression.type": "gzip"})
    assert_stored(kafka, "gzipped", 2, landed)


def produce_frame(correlation_id: int, topic: str, partition: int, batch: bytes, acks: int = -1) -> bytes:
    name = topic.encode()
    body = (struct.pack(">hhi", -1, acks, 10_000) + struct.pack(">ih", 1, len(name)) + name
            + struct.pack(">iii", 1, partition, len(batch)) + batch)
    return frame(0, 3, correlation_id, body)


def produce_answer(body: bytes) -> tuple[int, int]:
    """(error code, base offset) of a Produce v3 answer for one partition."""
    name_len = struct.unpack(">h", body[4:6])[0]
    pos = 6 + name_len + 4
    _, error, base = struct.unpack(">ihq", body[pos:pos + 14])
    return error, base


def high_watermark(b: TestBroker, topic: str, partition: int) -> int:
    return b.http.describe(topic)["partitions"][partition]["high_watermark"]


def test_a_bad_crc_is_answered_corrupt_message_and_nothing_is_written(kafka):
    from ring.kafka_api.records import encode_batch

    assert kafka.http.create_topic("crc", partitions=1).status == 201
    batch = encode_batch(0, 0, [(1, b"k", b"v", [])])
    batch[-1] ^= 0x40
    with connect(kafka) as s:
        s.sendall(produce_frame(3, "crc", 0, bytes(batch)))
        corr, body = read_answer(s)
        assert (corr, produce_answer(body)[0]) == (3, 2)  # CORRUPT_MESSAGE
        s.sendall(produce_frame(4, "crc", 7, bytes(encode_batch(0, 0, [(1, b"k", b"v", [])]))))
        assert produce_answer(read_answer(s)[1])[0] == 3  # UNKNOWN_TOPIC_OR_PARTITION: no partition 7
    assert high_watermark(kafka, "crc", 0) == 0


def test_acks_0_is_answered_with_nothing_and_still_written(kafka):
    from ring.kafka_api.records import encode_batch

    assert kafka.http.create_topic("quiet", partitions=1).status == 201
    with connect(kafka) as s:
        s.sendall(produce_frame(1, "quiet", 0, bytes(encode_batch(0, 0, [(5, b"k", b"v", [])])), acks=0))
        s.sendall(frame(API_VERSIONS, 0, 2))
        assert read_answer(s)[0] == 2  # the produce's turn passed without an answer
    wait_for("the acks=0 record", lambda: high_watermark(kafka, "quiet", 0) == 1)
    assert stored_records(kafka, "quiet", 0)[0][1:] == (5, b"k", b"v", [])


# --- fetch -----------------------------------------------------------------------------------


def consume_confluent(bootstrap: str, topic: str, partitions: int, count: int) -> dict[tuple[int, int], tuple]:
    """``count`` records read from offset 0 of every partition by confluent-kafka's Consumer, assigned
    (no group); (partition, offset) -> (timestamp, key, value, headers), checking offsets rise per partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-no-commits",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 200})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[tuple[int, int], tuple] = {}
    last = {p: -1 for p in range(partitions)}
    try:
        def more() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                assert msg.offset() > last[msg.partition()]  # in order within the partition
                last[msg.partition()] = msg.offset()
                got[(msg.partition(), msg.offset())] = (msg.timestamp()[1], msg.key(), msg.value(),
                                                        list(msg.headers() or []))
            return len(got) >= count
        wait_for(f"{count} records through confluent-kafka", more, interval_s=0)
    finally:
        consumer.close()
    return got


def test_confluent_consumer_reads_every_record_as_produced(kafka):
    assert kafka.http.create_topic("consumed", partitions=3).status == 201
    landed = produce_keyed(kafka.bootstrap, "consumed", 200)
    assert consume_confluent(kafka.bootstrap, "consumed", 3, 200) == landed
    assert_stored(kafka, "consumed", 3, landed)  # and over ring's HTTP API, the same offsets


def test_records_produced_over_http_read_the_same_through_kafka(kafka):
    """The other way round: a msgpack produce over ring's HTTP API (keys, a null value, headers in
    order with a repeated name, timestamps) reads the same, at the same offsets, in a Kafka consumer."""
    import msgpack

    assert kafka.http.create_topic("from-http", partitions=1).status == 201
    sent = [{"key": f"k{i}", "value": None if i == 3 else f"v{i}".encode(), "timestamp": 1_600_000_000_000 + i,
             "headers": [["h", b"1"], ["h", None], ["z", b"\x00"]]} for i in range(20)]
    reply = kafka.http.produce("from-http", msgpack.packb(sent), "application/msgpack", partition=0)
    assert reply.status == 200, reply.body
    got = consume_confluent(kafka.bootstrap, "from-http", 1, 20)
    assert got == {(0, i): (r["timestamp"], r["key"].encode(), r["value"], [("h", b"1"), ("h", None), ("z", b"\x00")])
                   for i, r in enumerate(sent)}
    assert [rec[0] for rec in stored_records(kafka, "from-http", 0)] == list(range(20))


def test_kafka_python_consumer_reads_every_record_as_produced(kafka):
    from kafka import KafkaConsumer, TopicPartition

    assert kafka.http.create_topic("consumed-kp", partitions=2).status == 201
    landed = produce_keyed(kafka.bootstrap, "consumed-kp", 100)
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False)
    tps = [TopicPartition("consumed-kp", p) for p in range(2)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    got = {}
    try:
        def more() -> bool:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    got[(tp.partition, m.offset)] = (m.timestamp, m.key, m.value, [tuple(h) for h in m.headers])
            return len(got) >= 100
        wait_for("100 records through kafka-python", more, interval_s=0)
    finally:
        consumer.close()
    assert got == landed


def fetch_frame(correlation_id: int, topic: str, partition: int, offset: int, max_wait_ms: int) -> bytes:
    name = topic.encode()
    body = (struct.pack(">iiiib", -1, max_wait_ms, 1, 1 << 20, 0) + struct.pack(">ih", 1, len(name)) + name
            + struct.pack(">iiqi", 1, partition, offset, 1 << 20))
    return frame(1, 4, correlation_id, body)


def fetch_error(body: bytes) -> tuple[int, int]:
    """(error code, high watermark) of a Fetch v4 answer's one partition."""
    name_len = struct.unpack(">h", body[8:10])[0]
    pos = 10 + name_len + 4
    _, error, hw = struct.unpack(">ihq", body[pos:pos + 14])
    return error, hw


def test_a_long_poll_fetch_is_answered_before_the_request_after_it(kafka):
    """Kafka's clients need answers in request order: an ApiVersions sent after a fetch waiting for
    records is ready first, and leaves after the fetch's answer, which the next record ends."""
    from ring.kafka_api.records import encode_batch

    assert kafka.http.create_topic("polled", partitions=1).status == 201
    with connect(kafka) as s, connect(kafka) as producer:
        s.sendall(fetch_frame(1, "polled", 0, 0, 20_000) + frame(API_VERSIONS, 0, 2))
        wait_for("the fetch to wait", lambda: kafka.http.get("/v1/status").json()["long_polls_open"] >= 1)
        producer.sendall(produce_frame(9, "polled", 0, bytes(encode_batch(0, 0, [(5, b"k", b"late", [])]))))
        assert produce_answer(read_answer(producer)[1]) == (0, 0)
        corr, body = read_answer(s)
        assert corr == 1 and fetch_error(body) == (0, 1)
        assert b"late" in body  # (uncompressed)
        assert read_answer(s)[0] == 2


def test_a_fetch_stops_reading_at_its_max_bytes_after_one_batch(kafka):
    """Kafka's rule: the first partition gets a batch however small max_bytes is; the ones after it
    answer their high watermark and no records."""
    from ring.kafka_api.records import encode_batch

    assert kafka.http.create_topic("capped", partitions=2).status == 201
    with connect(kafka) as s:
        for p in (0, 1):
            s.sendall(produce_frame(p, "capped", p, bytes(encode_batch(0, 0, [(5, b"k", b"x" * 100, [])]))))
            assert produce_answer(read_answer(s)[1]) == (0, 0)
        name = b"capped"
        body = (struct.pack(">iiiib", -1, 0, 1, 1, 0) + struct.pack(">ih", 1, len(name)) + name
                + struct.pack(">i", 2) + struct.pack(">iqi", 0, 0, 1 << 20) + struct.pack(">iqi", 1, 0, 1 << 20))
        s.sendall(frame(1, 4, 7, body))
        corr, answer = read_answer(s)
    pos = 4 + 4 + 2 + len(name) + 4
    sizes = []
    for p in (0, 1):
        part, error, hw, _lso, aborted = struct.unpack(">ihqqi", answer[pos:pos + 26])
        size = struct.unpack(">i", answer[pos + 26:pos + 30])[0]
        assert (part, error, hw, aborted) == (p, 0, 1, 0)
        sizes.append(size)
        pos += 30 + size
    assert corr == 7 and sizes[0] > 100 and sizes[1] == 0


def test_a_fetch_past_the_end_is_offset_out_of_range_and_of_no_topic_unknown(kafka):
    assert kafka.http.create_topic("ranged", partitions=1).status == 201
    with connect(kafka) as s:
        s.sendall(fetch_frame(1, "ranged", 0, 1000, 0))
        assert fetch_error(read_answer(s)[1])[0] == 1  # OFFSET_OUT_OF_RANGE
        s.sendall(fetch_frame(2, "no-such-ranged", 0, 0, 0))
        assert fetch_error(read_answer(s)[1])[0] == 3  # UNKNOWN_TOPIC_OR_PARTITION


# --- a cluster -------------------------------------------------------------------------------


def kafka_cluster(tmp_path) -> tuple[Any, list[str]]:
    """Three brokers, each with a Kafka listener: the started ``TestCluster`` and their bootstraps."""
    from tests.brokers import TestCluster

    cluster = TestCluster(tmp_path, 3, args=["--fsync", "interval:100"])
    bootstraps = []
    for b in cluster.local.brokers:
        port = free_port()
        b.args += ["--kafka-listen", f"127.0.0.1:{port}"]
        bootstraps.append(f"127.0.0.1:{port}")
    return cluster.start(), bootstraps


def led_topic(cluster: Any, bootstraps: list[str], topic: str, partitions: int) -> dict[int, str]:
    """Create ``topic`` (replication factor 3) and wait until every broker's Metadata names the
    same three brokers (ids, addresses) and ring's leader of each partition; partition -> leader."""
    from confluent_kafka.admin import AdminClient

    assert cluster[0].http.create_topic(topic, partitions=partitions, replication_factor=3).status == 201
    leaders = wait_for("a leader for every partition", lambda: (
        lambda ls: ls if len(ls) == partitions and all(ls.values()) else None)(cluster.leaders(topic)))
    ids = {node_id(m.name): m.name for m in cluster}
    assert len(ids) == 3  # distinct node ids

    def agree(bootstrap: str) -> bool:
        md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
        assert {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()} == {
            node_id(m.name): bs for m, bs in zip(cluster, bootstraps)}
        parts = md.topics[topic].partitions
        return all(sorted(p.replicas) == sorted(ids) and ids.get(p.leader) == leaders[p.id]
                   for p in parts.values()) and len(parts) == partitions
    for bootstrap in bootstraps:
        wait_for(f"metadata of {bootstrap} naming ring's leaders", lambda: agree(bootstrap))
    return leaders


def test_on_three_brokers_metadata_steers_produces_through_any_broker_to_the_leaders(tmp_path):
    cluster, bootstraps = kafka_cluster(tmp_path)
    try:
        led_topic(cluster, bootstraps, "spread", 6)  # every broker answers the same metadata
        landed = {}
        for bootstrap in bootstraps:  # each client knows one broker only
            landed.update(produce_keyed(bootstrap, "spread", 60))
        assert len(landed) == 180
        assert_stored(cluster[1], "spread", 6, landed)
        assert consume_confluent(bootstraps[2], "spread", 6, 180) == landed
    finally:
        cluster.stop()


# --- list offsets ----------------------------------------------------------------------------


def test_list_offsets_earliest_latest_and_by_timestamp(kafka):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    assert kafka.http.create_topic("listed", partitions=1).status == 201
    landed = produce_keyed(kafka.bootstrap, "listed", 50)
    offset_of = {ts: offset for (_, offset), (ts, _, _, _) in landed.items()}
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "unused-no-commits",
                         "enable.auto.commit": False})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("listed", 0), timeout=10, cached=False) == (0, 50)
        assert kafka.http.post("/v1/topics/listed/partitions/0/truncate", json_body={"before_offset": 10}).status == 200
        assert consumer.get_watermark_offsets(TopicPartition("listed", 0), timeout=10, cached=False) == (10, 50)
        first = 1_700_000_000_000
        found = [consumer.offsets_for_times([TopicPartition("listed", 0, ts)], timeout=10)[0].offset
                 for ts in (first + 20, first + 49, first + 1000)]  # (one request each: a partition once a request)
        assert found == [offset_of[first + 20], offset_of[first + 49], 50]  # past every record: the end
        consumer.assign([TopicPartition("listed", 0, OFFSET_BEGINNING)])  # resolved by ListOffsets
        msg = wait_for("the first record kept", lambda: consumer.poll(0.5))
        assert msg.error() is None and msg.offset() == 10
    finally:
        consumer.close()


# --- docs/KAFKA.md ---------------------------------------------------------------------------


def test_the_kafka_example_runs_as_written(tmp_path):
    import subprocess
    import sys

    from tests.docs import Shell, code, commands
    from tests.support import Http

    shell = Shell(tmp_path)
    kafka_port = free_port()
    (serve,) = commands(code("kafka-example", "sh"))
    try:
        shell.run(serve.replace("localhost:9092", f"127.0.0.1:{kafka_port}"))
        script = code("kafka-example").replace("localhost:9092", f"127.0.0.1:{kafka_port}")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        broker = type("HttpOnly", (), {"http": Http("127.0.0.1", shell.port(9250))})()
        partitions = broker.http.describe("clicks")["partition_count"]
        got = [rec for p in range(partitions) for rec in stored_records(broker, "clicks", p)]
        assert [(key, value, headers) for _, _, key, value, headers in got] == [
            (b"user-7", b'{"page": "/"}', [("source", b"web")])]
    finally:
        assert shell.stop_servers() == [0]


def test_a_producer_with_acks_all_rides_through_a_leaders_sigkill_losing_no_acknowledged_record(tmp_path):
    """The leader of a partition is killed mid-stream: the client's produces to it fail over (its metadata
    leads it to the new leader once one is elected) and every record acknowledged is stored where its
    report said, read from the brokers that remain."""
    from confluent_kafka import Producer

    cluster, bootstraps = kafka_cluster(tmp_path)
    try:
        leaders = led_topic(cluster, bootstraps, "failover", 3)
        victim = cluster.member(leaders[0])
        producer = Producer({"bootstrap.servers": ",".join(bootstraps), "acks": "all", "linger.ms": 5,
                             "message.timeout.ms": 120_000, "topic.metadata.refresh.interval.ms": 1000})
        landed: dict[tuple[int, int], tuple] = {}
        failed: list = []

        def report(err, msg, rec):
            if err is not None:
                failed.append(err)
            else:
                landed[(msg.partition(), msg.offset())] = rec

        for i in range(300):
            rec = (1_700_000_000_000 + i, f"key-{i}".encode(), f"value-{i}".encode(), [("i", str(i).encode())])
            producer.produce("failover", key=rec[1], value=rec[2], headers=rec[3], timestamp=rec[0],
                             on_delivery=lambda err, msg, rec=rec: report(err, msg, rec))
            producer.poll(0)
            if i == 100:
                assert producer.flush(30) == 0
                victim.kill()
        assert producer.flush(150) == 0
        assert not failed and len(landed) == 300  # every record acknowledged, none given up
        assert {p for p, _ in landed} == {0, 1, 2}
        survivor = next(m for m in cluster if m is not victim)
        stored = {}
        for p in range(3):
            for offset, ts, key, value, headers in stored_records(survivor, "failover", p):
                stored[(p, offset)] = (ts, key, value, list(headers))
        assert {k: stored.get(k) for k in landed} == landed  # (a retry may have stored a record twice)
    finally:
        cluster.kill()


def test_the_served_table_of_kafka_md_is_what_the_listener_serves():
    import re
    from pathlib import Path

    from ring.kafka_api import apis

    text = Path(__file__).resolve().parent.parent.joinpath("docs", "KAFKA.md").read_text()
    table = text.split("## What is served", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| [A-Za-z]+ \| (\d+) \| (\d+)-(\d+) \|", table, re.M)
    assert {int(key): (int(low), int(high)) for key, low, high in rows} == {
        key: (low, high) for key, (low, high, _) in apis.SERVED.items()}
