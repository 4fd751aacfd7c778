"""Admission control and per-token quotas on real broker processes: past a bound a new produce or
fetch is refused 429 with Retry-After at once, status and metrics still answer, service returns
when the work drains; a token over its quota is refused with the time to wait, another token is
not, and a quota changed in the tokens file applies after SIGHUP, without a restart."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import orjson

from ring.auth import file_line
from tests.brokers import TestBroker, TestCluster
from tests.support import wait_for


def _send_produce(member, topic: str, consistency: str) -> socket.socket:
    """A produce sent on a raw connection whose answer is read later."""
    body = b'{"value": 1}'
    sock = socket.create_connection((member.local.host, member.local.port), timeout=30)
    sock.sendall(f"POST /v1/topics/{topic}/messages?consistency={consistency} HTTP/1.1\r\nHost: x\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def _status_line(sock: socket.socket) -> bytes:
    got = b""
    while b"\r\n" not in got:
        piece = sock.recv(4096)
        assert piece, got
        got += piece
    return got.split(b"\r\n", 1)[0]


def _metric(member, line_start: str) -> float:
    text = member.http.get("/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def test_past_the_running_bound_new_work_is_refused_at_once_and_served_again_once_it_drains(
        make_cluster, topic: str) -> None:
    cluster: TestCluster = make_cluster(3, "--requests-running-max", "2", "--fsync", "interval:100")
    first = cluster[0].http
    assert first.create_topic(topic, partitions=1, replication_factor=3).status == 201
    leader_name = wait_for("a leader", lambda: first.describe(topic)["partitions"][0].get("leader"))
    leader = next(m for m in cluster.members if m.name == leader_name)
    assert leader.http.produce(topic, [1], consistency="all").status == 200
    followers = [m for m in cluster.members if m is not leader]
    for m in followers:
        m.pause()  # produces at consistency=all now wait for their acks: queued work on the leader
    try:
        held = [_send_produce(leader, topic, "all") for _ in range(2)]
        wait_for("two produces running", lambda: leader.http.status()["admission"]["requests_running"] >= 2,
                 timeout_s=10, interval_s=0.02)
        refused = leader.http.produce(topic, [2])
        assert refused.status == 429, refused.body
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"] == "overloaded" and refused.json()["reason"] == "requests_running"
        fetch = leader.http.fetch(topic, 0, offset=0)
        assert fetch.status == 429 and fetch.json()["reason"] == "requests_running", fetch.body
        status = leader.http.get("/v1/status")  # the control plane still answers, and shows the overload
        assert status.status == 200 and status.json()["admission"]["refused"]["requests_running"] == 2
        assert _metric(leader, 'ring_admission_refused_total{reason="requests_running"}') == 2
        assert _metric(leader, "ring_requests_running ") >= 2
    finally:
        for m in followers:
            m.resume()
    assert [_status_line(s) for s in held] == [b"HTTP/1.1 200 OK"] * 2  # acked once the followers came back
    for s in held:
        s.close()
    assert leader.http.produce(topic, [3], consistency="all").status == 200  # service is back
    assert leader.http.status()["admission"]["requests_running"] == 0


def _tokens(path: Path, alice_quota: list[str], bob_quota: list[str]) -> None:
    path.write_text("\n".join([file_line("t-admin", "ops", "admin", "*"),
                               file_line("t-alice", "alice", "produce,consume", "*", *alice_quota),
                               file_line("t-bob", "bob", "produce,consume", "*", *bob_quota)]) + "\n")


def _produce(b: TestBroker, token: str, topic: str, nbytes: int):
    body = orjson.dumps({"value": "x" * nbytes})
    return b.http.with_token(token).produce(topic, body)


def test_a_token_over_its_quota_waits_another_does_not_and_a_new_quota_applies_on_sighup(
        make_broker, tmp_path: Path, topic: str) -> None:
    tokens = tmp_path / "tokens"
    _tokens(tokens, ["produce_bytes_per_s=100"], [])
    b = make_broker("--auth-tokens", str(tokens))
    assert b.http.with_token("t-admin").create_topic(topic, partitions=1).status == 201
    assert _produce(b, "t-alice", topic, 2500).status == 200  # the burst is 100 bytes: ~24 s of debt now
    refused = _produce(b, "t-alice", topic, 10)
    assert refused.status == 429, refused.body
    doc = refused.json()
    assert doc["error"] == "quota_exceeded" and doc["quota"] == "produce"
    assert 20_000 < doc["retry_after_ms"] <= 25_000, doc  # the debt at 100 bytes a second
    assert refused.headers["Retry-After"] == str(-(-doc["retry_after_ms"] // 1000))
    fetch = b.http.with_token("t-alice").fetch(topic, 0, offset=0)
    assert fetch.status == 200, fetch.body  # no fetch quota: reading goes on
    for _ in range(5):
        assert _produce(b, "t-bob", topic, 5000).status == 200  # bob has no quota
    text = b.http.with_token("t-admin").get("/metrics").body.decode()
    assert 'ring_quota_throttled_total{principal="alice",quota="produce"} 1.0' in text, text[-3000:]
    status = b.http.get("/v1/status").json()["admission"]
    assert status["throttled"] == {"alice": {"produce": 1}}

    # Raise alice's quota and give bob one, in the file; SIGHUP; no restart.
    _tokens(tokens, ["produce_bytes_per_s=100000000"], ["produce_bytes_per_s=100"])
    before = b.log_text().count("client tokens reloaded")
    b.signal(signal.SIGHUP)
    wait_for("the tokens file read again", lambda: b.log_text().count("client tokens reloaded") > before,
             timeout_s=10, interval_s=0.05)
    assert _produce(b, "t-alice", topic, 5000).status == 200  # its debt is paid at the new rate at once
    assert _produce(b, "t-bob", topic, 5000).status == 200
    assert _produce(b, "t-bob", topic, 10).status == 429

    # A file that does not parse keeps the tokens there are.
    tokens.write_text(tokens.read_text() + "sha256:nothex bad produce *\n")
    b.signal(signal.SIGHUP)
    wait_for("the unusable file refused", lambda: "kept the client tokens" in b.log_text(),
             timeout_s=10, interval_s=0.05)
    assert _produce(b, "t-alice", topic, 10).status == 200
    assert b.pid and b.http.get("/v1/status").status == 200


def test_the_client_waits_the_retry_after_a_quota_gives_and_stores_each_record_once(
        make_broker, tmp_path: Path, topic: str) -> None:
    """Through ``ring.client``, each produce and fetch past alice's quota is refused once (429 with
    Retry-After), waits what it was told, and goes in at its next try; every record is stored once."""
    from ring.client import Client

    rate, size, n = 1000, 1500, 3  # a record is over the burst (a second's worth): each one leaves a debt
    tokens = tmp_path / "tokens"
    _tokens(tokens, [f"produce_bytes_per_s={rate}", f"fetch_bytes_per_s={rate}"], [])
    b = make_broker("--auth-tokens", str(tokens))
    admin = b.http.with_token("t-admin")
    assert admin.create_topic(topic, partitions=1).status == 201
    values = [f"{i}:" + "x" * size for i in range(n)]
    with Client(b.url, token="t-alice", linger_ms=0, delivery_timeout_s=60, retry_timeout_s=60) as client:
        began = time.monotonic()
        offsets = [client.produce(topic, v, partition=0).result(timeout=90).offset for v in values]
        produced_s = time.monotonic() - began
        began = time.monotonic()
        fetched = [client.fetch(topic, 0, o, max_records=1, max_bytes=size).records[0].value.decode() for o in offsets]
        fetched_s = time.monotonic() - began
    assert fetched == values
    stored = admin.fetch(topic, 0, offset=0, max_records=100).json()["records"]
    assert [r["value"] for r in stored] == values, stored  # each once, in order
    throttled = b.http.get("/v1/status").json()["admission"]["throttled"]["alice"]
    # Every record after the first found the quota in debt; told to wait, it went in at the next try.
    assert throttled == {"produce": n - 1, "fetch": n - 1}, throttled
    # Each of those waited at least the Retry-After it was given, which is at least 1 s.
    assert produced_s >= n - 1 and fetched_s >= n - 1, (produced_s, fetched_s)


def test_a_call_whose_last_attempt_was_refused_for_quota_fails_as_that_refusal(
        make_broker, tmp_path: Path, topic: str) -> None:
    """When the wait a quota asks for runs past a call's deadline, the client's produce and fetch fail
    with ``QuotaExceeded`` carrying the wait (the broker is up and asked for less), never with
    ``BrokersUnavailable``, which says no broker did it; the refused record is not stored."""
    from ring.client import BrokersUnavailable, Client
    from ring.errors import QuotaExceeded

    rate, size = 1000, 20_000  # one record leaves a debt of about 19 s, past every deadline below
    tokens = tmp_path / "tokens"
    _tokens(tokens, [f"produce_bytes_per_s={rate}", f"fetch_bytes_per_s={rate}"], [])
    b = make_broker("--auth-tokens", str(tokens))
    admin = b.http.with_token("t-admin")
    assert admin.create_topic(topic, partitions=1).status == 201
    with Client(b.url, token="t-alice", linger_ms=0, delivery_timeout_s=3, retry_timeout_s=3) as client:
        assert client.produce(topic, "a" * size, partition=0).result(timeout=30).offset == 0
        refused = client.produce(topic, "b" * size, partition=0).exception(timeout=30)
        assert isinstance(refused, QuotaExceeded) and not isinstance(refused, BrokersUnavailable), repr(refused)
        assert refused.retry_after_s > 3 and refused.extra["partition"] == 0, (refused, refused.extra)
        assert ": 429 alice is over its produce quota" in refused.message, refused.message
        client.fetch(topic, 0, 0, max_records=1, max_bytes=size * 2)  # the first fetch goes in, and leaves a debt
        try:
            client.fetch(topic, 0, 0, max_records=1, max_bytes=size * 2)
        except QuotaExceeded as exc:
            assert exc.retry_after_s > 3 and "no replica answered" in exc.message, exc.message
        else:
            raise AssertionError("a fetch past alice's quota and its retry_timeout_s was answered")
    stored = admin.fetch(topic, 0, offset=0, max_records=100).json()["records"]
    assert [r["value"][0] for r in stored] == ["a"], "the refused record is not stored"


def test_the_kafka_listeners_produces_count_toward_the_bound_and_a_new_frame_waits_for_room(
        tmp_path: Path, topic: str) -> None:
    """The same bound on the Kafka listener: its produces count as running (an HTTP produce past the bound
    is refused), and while the broker is past the bound a Kafka Produce frame is held, its connection not
    read, counted as a refusal; it is taken, written and answered once the running work drains."""
    from ring.kafka_api.records import encode_batch
    from tests.test_kafka_listener import produce_answer, produce_frame, read_answer

    cluster = TestCluster(tmp_path / "cluster", 3, args=["--requests-running-max", "2", "--fsync", "interval:100"],
                          kafka=True).start()
    try:
        first = cluster[0].http
        assert first.create_topic(topic, partitions=1, replication_factor=3).status == 201
        leader_name = wait_for("a leader", lambda: first.describe(topic)["partitions"][0].get("leader"))
        i = next(i for i, m in enumerate(cluster.members) if m.name == leader_name)
        leader, kafka_port = cluster[i], int(cluster.kafka_bootstrap.split(",")[i].rpartition(":")[2])
        assert leader.http.produce(topic, [0], consistency="all").status == 200
        followers = [m for m in cluster.members if m is not leader]

        def kafka_produce(correlation_id: int, value: bytes, acks: int) -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", kafka_port), timeout=30)
            sock.sendall(produce_frame(correlation_id, topic, 0, bytes(encode_batch(0, 0, [(1, None, value, [])])),
                                       acks=acks))
            return sock

        for m in followers:
            m.pause()  # acks=all (the topic's quorum) now waits for a follower: running work on the leader
        try:
            held = [kafka_produce(n, b"held-%d" % n, -1) for n in (1, 2)]
            wait_for("two Kafka produces running",
                     lambda: leader.http.status()["admission"]["requests_running"] >= 2, timeout_s=10, interval_s=0.02)
            refused = leader.http.produce(topic, [2])  # the Kafka listener's produces count
            assert refused.status == 429 and refused.json()["reason"] == "requests_running", refused.body
            waiting = kafka_produce(3, b"waiting", 1)  # acks=1: answered at once, once taken
            wait_for("the Kafka frame held and counted", lambda: leader.http.status()["admission"]["refused"]
                     ["requests_running"] == 2, timeout_s=10, interval_s=0.02)
            # the leader's log holds the first record and the two running produces, not the held one
            assert leader.http.describe(topic)["partitions"][0]["end_offset"] == 3
        finally:
            for m in followers:
                m.resume()
        for n, sock in [(1, held[0]), (2, held[1]), (3, waiting)]:
            correlation_id, body = read_answer(sock)
            assert (correlation_id, produce_answer(body)[0]) == (n, 0)
            sock.close()
        values = {r["value"] for r in leader.http.fetch(topic, 0, offset=0, max_records=10).json()["records"]}
        assert {"held-1", "held-2", "waiting"} <= values, values
        assert leader.http.status()["admission"]["requests_running"] == 0
    finally:
        cluster.kill()
