"""SASL PLAIN and TLS on the Kafka listener (``ring.kafka_api.sasl``): a broker with client tokens lets a
Kafka connection in only once it has authenticated, user name the token's name and password the token;
with ``--tls-cert`` the listener speaks TLS. Real confluent-kafka clients produce and consume through
both, and the raw protocol shows each step: what a connection may send first, a mechanism not offered,
a wrong password (answered, then closed), and a handshake to a listener without tokens."""

from __future__ import annotations

import socket
import struct
import uuid
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import pytest

from ring.kafka_api import sasl
from ring.localcluster import free_port
from tests.secure_cluster import Pki, SecureCluster, make_pki, make_tokens
from tests.support import wait_for
from tests.test_kafka_listener import API_VERSIONS, METADATA, closed_by_broker, connect, frame, read_answer

pytestmark = pytest.mark.integration

HANDSHAKE, AUTHENTICATE = sasl.SASL_HANDSHAKE, sasl.SASL_AUTHENTICATE


class Secured(NamedTuple):
    cluster: SecureCluster
    tokens: dict[str, str]  # token name -> token
    bootstrap: str  # the Kafka listener's HOST:PORT
    pki: Pki | None


def _start(root: Path, tls: bool) -> Secured:
    pki = make_pki(root / "pki") if tls else None
    tokens = make_tokens(root / "tokens")
    port = free_port()
    cluster = SecureCluster(root / "cluster", 1, pki=pki, tokens_file=root / "tokens",
                            args=["--kafka-listen", f"127.0.0.1:{port}"]).start(admin_token=tokens["admin"])
    return Secured(cluster, tokens, f"127.0.0.1:{port}", pki)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    s = _start(tmp_path_factory.mktemp("kafka-sasl"), tls=False)
    yield s
    s.cluster.stop()


@pytest.fixture(scope="module")
def secured_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    s = _start(tmp_path_factory.mktemp("kafka-sasl-tls"), tls=True)
    yield s
    s.cluster.stop()


def _topic(s: Secured) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    r = s.cluster.client(0, s.tokens["admin"]).create_topic(name, partitions=1)
    assert r.status == 201, r.body
    return name


def _config(s: Secured, user: str, password: str) -> dict[str, Any]:
    config = {"bootstrap.servers": s.bootstrap, "sasl.mechanism": "PLAIN", "sasl.username": user,
              "sasl.password": password, "security.protocol": "SASL_PLAINTEXT"}
    if s.pki is not None:
        config.update({"security.protocol": "SASL_SSL", "ssl.ca.location": str(s.pki.ca)})
    return config


def _round_trip(s: Secured, user: str) -> None:
    """Ten records produced with ``user``'s token at acks=all and read back with it by a consumer."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = _topic(s)
    producer = Producer({**_config(s, user, s.tokens[user]), "acks": "all", "linger.ms": 0})
    delivered: list[Any] = []
    for i in range(10):
        producer.produce(topic, value=f"v{i}".encode(), on_delivery=lambda err, msg: delivered.append((err, msg)))
    assert producer.flush(30) == 0
    assert [err for err, _ in delivered] == [None] * 10 and [m.offset() for _, m in delivered] == list(range(10))
    consumer = Consumer({**_config(s, user, s.tokens[user]), "group.id": f"g-{topic}",
                         "enable.auto.commit": False})
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])

        def read() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            return len(got) >= 10

        wait_for("the ten records", read, timeout_s=30, interval_s=0)
    finally:
        consumer.close()
    assert got == [f"v{i}".encode() for i in range(10)]


def test_a_client_with_its_token_produces_and_consumes(secured: Secured) -> None:
    _round_trip(secured, "both")


def test_a_client_with_a_wrong_password_or_another_tokens_name_is_refused(secured: Secured) -> None:
    """librdkafka reports the refusal as an authentication error and delivers nothing."""
    from confluent_kafka import KafkaError, Producer

    for user, password in (("both", "not-the-token"), ("admin", secured.tokens["both"])):
        errors: list[KafkaError] = []
        producer = Producer({**_config(secured, user, password), "error_cb": errors.append,
                             "message.timeout.ms": 3000})
        producer.produce("orders-never", b"x")
        wait_for("an authentication error", lambda: producer.poll(0.2) >= 0 and any(
            e.code() == KafkaError._AUTHENTICATION for e in errors), timeout_s=30)
        assert producer.flush(10) == 0  # the record failed (timed out), it was not delivered
        assert any("Authentication failed" in e.str() for e in errors), [e.str() for e in errors]


def test_a_token_produces_and_consumes_over_kafka_what_its_grants_allow_and_nothing_else(secured: Secured) -> None:
    """The grants of the HTTP port (tests/secure_cluster.py's GRANTS): "consumer" may consume orders* but
    not produce to it, and nothing of its produce is stored; "both" may not produce outside orders*;
    "producer" may not read orders* (kafka-python's consumer). Each refusal is TOPIC_AUTHORIZATION_FAILED."""
    from confluent_kafka import KafkaError, Producer

    topic = _topic(secured)
    admin = secured.cluster.client(0, secured.tokens["admin"])
    assert admin.create_topic("elsewhere-" + topic, partitions=1).status == 201
    for user, to in (("consumer", topic), ("both", "elsewhere-" + topic)):
        delivered: list[Any] = []
        producer = Producer({**_config(secured, user, secured.tokens[user]), "acks": "all",
                             "message.timeout.ms": 10_000, "retries": 0})
        producer.produce(to, b"x", on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(30) == 0
        assert [e.code() for e in delivered] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], (user, delivered)
        described = admin.describe(to)["partitions"][0]
        assert described["high_watermark"] == 0, (user, described)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as Assigned
    from kafka.errors import TopicAuthorizationFailedError

    consumer = KafkaConsumer(bootstrap_servers=secured.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username="producer",
                             sasl_plain_password=secured.tokens["producer"], enable_auto_commit=False)
    try:
        consumer.assign([Assigned(topic, 0)])
        consumer.seek(Assigned(topic, 0), 0)
        with pytest.raises(TopicAuthorizationFailedError):
            for _ in range(20):  # the first fetch's answer raises
                consumer.poll(timeout_ms=500)
    finally:
        consumer.close()


def test_a_token_creates_over_kafka_only_the_topics_it_administers(secured: Secured) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    scoped = AdminClient(_config(secured, "scoped-admin", secured.tokens["scoped-admin"]))
    mine, other = f"orders-admin-{uuid.uuid4().hex[:8]}", f"orders-{uuid.uuid4().hex[:8]}"
    futures = scoped.create_topics([NewTopic(mine, 1, 1), NewTopic(other, 1, 1)], operation_timeout=30)
    assert futures[mine].result(30) is None
    with pytest.raises(KafkaException) as refused:
        futures[other].result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin = secured.cluster.client(0, secured.tokens["admin"])
    assert admin.get(f"/v1/topics/{mine}").status == 200 and admin.get(f"/v1/topics/{other}").status == 404


def test_over_tls_a_client_with_its_token_produces_and_consumes(secured_tls: Secured) -> None:
    _round_trip(secured_tls, "both")


def test_the_tls_listener_answers_no_plaintext_request(secured_tls: Secured) -> None:
    with connect(secured_tls) as s:
        s.sendall(frame(API_VERSIONS, 0, 1))
        assert closed_by_broker(s) or not _answers_kafka(s)


def _answers_kafka(s: socket.socket) -> bool:
    try:
        corr, _ = read_answer(s)
    except (OSError, struct.error):
        return False
    return corr == 1


# --- the protocol, step by step ----------------------------------------------------------------------


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _handshake(s: socket.socket, mechanism: str, corr: int = 2) -> tuple[int, list[str]]:
    s.sendall(frame(HANDSHAKE, 1, corr, _string(mechanism)))
    got, body = read_answer(s)
    assert got == corr
    error, n = struct.unpack_from(">hi", body)
    names, pos = [], 6
    for _ in range(n):
        (length,) = struct.unpack_from(">h", body, pos)
        names.append(body[pos + 2:pos + 2 + length].decode())
        pos += 2 + length
    return error, names


def _authenticate(s: socket.socket, message: bytes, version: int = 0, corr: int = 3) -> tuple[int, str | None]:
    """(error, error message) of a SaslAuthenticate of ``message``."""
    if version >= 2:
        body = _uvarint(len(message) + 1) + message + b"\x00"
    else:
        body = struct.pack(">i", len(message)) + message
    s.sendall(frame(AUTHENTICATE, version, corr, body, flexible=version >= 2))
    got, answer = read_answer(s)
    assert got == corr
    if version >= 2:
        answer = answer[1:]  # the response header's tagged fields
        (error,) = struct.unpack_from(">h", answer)
        n = answer[2] - 1  # (a short message: a one-byte length)
        return error, answer[3:3 + n].decode() if n >= 0 else None
    error, n = struct.unpack_from(">hh", answer)
    return error, answer[4:4 + n].decode() if n >= 0 else None


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _plain(user: str, password: str, authzid: str = "") -> bytes:
    return f"{authzid}\0{user}\0{password}".encode()


def test_a_connection_may_ask_for_versions_but_nothing_else_before_it_authenticates(secured: Secured) -> None:
    with connect(secured) as s:
        s.sendall(frame(API_VERSIONS, 0, 1))
        assert read_answer(s)[0] == 1
        s.sendall(frame(METADATA, 1, 2, struct.pack(">i", 0)))
        assert closed_by_broker(s)
    with connect(secured) as s:  # nor after a handshake alone
        assert _handshake(s, "PLAIN") == (0, ["PLAIN"])
        s.sendall(frame(METADATA, 1, 3, struct.pack(">i", 0)))
        assert closed_by_broker(s)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_plain_with_the_tokens_name_and_the_token_authenticates_and_the_connection_is_served(
        secured: Secured, version: int) -> None:
    with connect(secured) as s:
        assert _handshake(s, "PLAIN") == (0, ["PLAIN"])
        assert _authenticate(s, _plain("producer", secured.tokens["producer"], "producer"), version) == (0, None)
        s.sendall(frame(METADATA, 1, 4, struct.pack(">i", 0)))
        assert read_answer(s)[0] == 4
        assert _handshake(s, "PLAIN", 5)[0] == sasl.ILLEGAL_SASL_STATE  # once a connection


@pytest.mark.parametrize("message", [
    _plain("both", "not-the-token"),
    _plain("admin", "TOKEN-OF-BOTH"),  # another token's name
    _plain("both", "TOKEN-OF-BOTH", authzid="admin"),  # acting as another
    b"\0only-two-fields",
    b"\xff\0both\0TOKEN-OF-BOTH",  # not UTF-8
])
def test_a_failed_authentication_is_answered_then_the_connection_closed(secured: Secured, message: bytes) -> None:
    message = message.replace(b"TOKEN-OF-BOTH", secured.tokens["both"].encode())
    with connect(secured) as s:
        assert _handshake(s, "PLAIN") == (0, ["PLAIN"])
        assert _authenticate(s, message) == (sasl.SASL_AUTHENTICATION_FAILED, sasl.FAILED)
        assert closed_by_broker(s)


def test_a_mechanism_not_offered_is_refused_naming_plain(secured: Secured) -> None:
    with connect(secured) as s:
        assert _handshake(s, "SCRAM-SHA-256") == (sasl.UNSUPPORTED_SASL_MECHANISM, ["PLAIN"])
        assert _authenticate(s, _plain("both", secured.tokens["both"]))[0] == sasl.ILLEGAL_SASL_STATE


def test_a_listener_without_tokens_offers_no_mechanism(kafka) -> None:
    with connect(kafka) as s:
        assert _handshake(s, "PLAIN") == (sasl.UNSUPPORTED_SASL_MECHANISM, [])
        s.sendall(frame(METADATA, 1, 6, struct.pack(">i", 0)))  # and serves on, as before
        assert read_answer(s)[0] == 6


# --- quotas and a token taken out, on a broker of its own ------------------------------------------------


def test_a_kafka_client_waits_out_its_tokens_quota_and_a_token_taken_out_closes_its_connection(
        make_broker, tmp_path: Path) -> None:
    """alice's produce quota (2,000 bytes a second, the HTTP port's buckets) holds her Kafka producer's
    frames until their wait has passed: every record is stored, and the broker counts her throttled.
    carol's connection, authenticated, is closed at its next request once the tokens file no longer has
    her token (SIGHUP), and a new one is refused."""
    import signal

    from confluent_kafka import Producer

    from ring.auth import file_line

    tokens_file = tmp_path / "tokens"
    grants = {"admin": ("t-admin", "admin", "*"),
              "alice": ("t-alice", "produce,consume", "*", "produce_bytes_per_s=2000"),
              "carol": ("t-carol", "produce,consume", "*")}

    def write(names: list[str]) -> None:
        tokens_file.write_text("".join(file_line(grants[n][0], n, *grants[n][1:]) + "\n" for n in names))

    write(["admin", "alice", "carol"])
    port = free_port()
    b = make_broker("--auth-tokens", str(tokens_file), "--kafka-listen", f"127.0.0.1:{port}")
    b.bootstrap = f"127.0.0.1:{port}"
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    assert b.http.with_token("t-admin").create_topic(topic, partitions=1).status == 201

    producer = Producer({"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "t-alice",
                         "linger.ms": 0, "acks": "all", "message.timeout.ms": 60_000})
    delivered: list[Any] = []
    for i in range(8):  # a request each, 8 KB against a 2,000-byte burst: waits of seconds, not a refusal
        producer.produce(topic, b"%d" % i + b"x" * 1000, on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(60) == 0
    assert delivered == [None] * 8
    assert b.http.with_token("t-admin").describe(topic)["partitions"][0]["high_watermark"] == 8
    throttled = b.http.get("/v1/status").json()["admission"]["throttled"]
    assert throttled.get("alice", {}).get("produce", 0) >= 1, throttled

    with connect(b) as s:
        assert _handshake(s, "PLAIN") == (0, ["PLAIN"])
        assert _authenticate(s, _plain("carol", "t-carol")) == (0, None)
        s.sendall(frame(METADATA, 1, 4, struct.pack(">i", 0)))
        assert read_answer(s)[0] == 4
        write(["admin", "alice"])
        before = b.log_text().count("client tokens reloaded")
        b.signal(signal.SIGHUP)
        wait_for("the tokens file read again", lambda: b.log_text().count("client tokens reloaded") > before,
                 timeout_s=10, interval_s=0.05)
        s.sendall(frame(METADATA, 1, 5, struct.pack(">i", 0)))
        assert closed_by_broker(s)
    with connect(b) as s:
        assert _handshake(s, "PLAIN") == (0, ["PLAIN"])
        assert _authenticate(s, _plain("carol", "t-carol"))[0] == sasl.SASL_AUTHENTICATION_FAILED
