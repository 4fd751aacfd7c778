"""The Kafka protocol listener (``ring serve --kafka-listen``, ring.kafka_api) against real broker processes
and real Kafka clients (confluent-kafka's librdkafka, kafka-python), and raw frames for what no client sends."""

from __future__ import annotations

import socket
import struct
from typing import Iterator

import pytest

from ring.kafka_api.cluster import node_id
from ring.localcluster import free_port
from tests.brokers import TestBroker

pytestmark = pytest.mark.integration

API_VERSIONS, METADATA = 18, 3


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    """One broker with a Kafka listener; ``kafka.bootstrap`` is its HOST:PORT."""
    port = free_port()
    b = TestBroker(tmp_path_factory.mktemp("kafka"), args=["--kafka-listen", f"127.0.0.1:{port}"]).start()
    b.bootstrap = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield b
    b.stop()


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
        assert ranges[API_VERSIONS] == (0, 3) and ranges[METADATA] == (1, 8)
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


def test_kafka_listen_is_refused_beside_auth_tokens(tmp_path):
    import subprocess
    import sys

    tokens = tmp_path / "tokens"
    tokens.write_text("alice s3cret-token-of-alice-0123456789 admin\n")
    proc = subprocess.run([sys.executable, "-m", "ring", "serve", "--data-dir", str(tmp_path / "d"),
                           "--listen", f"127.0.0.1:{free_port()}", "--kafka-listen", "127.0.0.1:0",
                           "--auth-tokens", str(tokens)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--kafka-listen serves neither SASL nor TLS" in proc.stderr
