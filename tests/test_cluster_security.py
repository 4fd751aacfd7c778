"""The peer port refuses every request without the cluster secret (or with a wrong one)
with 401, and such a request changes nothing: no records, no topics, no brokers."""

from __future__ import annotations

import base64
import os
import time

import msgpack
import orjson
import pytest

from ring.auth import secret_matches
from ring.log import batch as batchfmt
from tests.brokers import TestCluster

pytestmark = pytest.mark.integration

BAD_HEADERS = [{}, {"Ring-Cluster-Secret": "wrong"}, {"Ring-Cluster-Secret": ""},
               {"Ring-Cluster-Secret-X": "x"}]


def test_secret_check_is_exact_and_nothing_matches_without_a_secret() -> None:
    assert secret_matches("s3cret", "s3cret")
    assert not secret_matches("s3cret", "s3cret ") and not secret_matches("s3cret", None)
    assert not secret_matches(None, "") and not secret_matches("", "") and not secret_matches(None, None)
    assert not secret_matches("s3cret", "s3cr\udce9")  # undecodable bytes from a header


def _batch(value: bytes) -> bytes:
    return bytes(batchfmt.encode([(None, None, value, None)], now_ms=1_700_000_000_000))


def _evil_ack2(topic: str) -> bytes:
    config = {"name": topic, "partitions": 1, "replication_factor": 1, "retention_ms": 3_600_000,
              "retention_bytes": -1, "segment_bytes": 1 << 20, "compression": "none", "consistency": "one",
              "created_ms": 1}
    evil = {"name": "evil-9", "token": 12345, "client_addr": "127.0.0.1:1", "peer_addr": "127.0.0.1:2",
            "generation": 1, "version": 1, "status": "normal", "load": {}, "extra": {}}
    delta = {"endpoints": [evil], "topics": {topic: [int(time.time() * 1000) + 60_000, "evil-9", config]}}
    return msgpack.packb({"type": "ack2", "sender": "evil-9", "delta": delta})


def test_peer_requests_without_the_secret_get_401_and_change_nothing(shared_cluster: TestCluster,
                                                                     topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=3, replication_factor=3).status == 201
    assert c[0].http.produce(topic, b'"kept"', partition=0).status == 200
    leader = c.member(c.leaders(topic)[0])
    evil_topic = topic + "-evil"
    ws_headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                  "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), "Ring-Broker": "ring-0"}
    for m in c:
        for bad in BAD_HEADERS:
            replies = [
                m.peer.post("/peer/v1/produce", body=_batch(b"sneaky"), query={"topic": topic, "partition": 0},
                            headers={**bad, "Content-Type": "application/vnd.ring.batch"}),
                m.peer.post("/peer/v1/gossip", body=_evil_ack2(evil_topic),
                            headers={**bad, "Content-Type": "application/msgpack"}),
                m.peer.get("/peer/v1/replicate", headers={**bad, **ws_headers}),
                m.peer.get("/peer/v1/status", headers=bad),
                m.peer.get(f"/peer/v1/replicas/{topic}/0", headers=bad),
            ]
            for r in replies:
                assert r.status == 401, (m.name, bad, r.status, r.body[:200])
                assert r.json()["error"] == "unauthorized"
    # the same requests with the secret are let in: the secret alone made the difference
    assert leader.peer.get("/peer/v1/status", headers=leader.auth).status == 200
    time.sleep(2.5)  # two gossip rounds: had anything got in, it would have spread by now
    for m in c:
        assert m.http.get(f"/v1/topics/{evil_topic}").status == 404
        assert "evil-9" not in m.cluster_view()
        doc = m.http.get(f"/v1/topics/{topic}").json()
        assert [p["end_offset"] for p in doc["partitions"]] == [1, 0, 0], m.name
        records = m.http.fetch(topic, 0, wait_ms=2_000).json()["records"]
        assert [r["value"] for r in records] == ["kept"]
    r = leader.peer.post("/peer/v1/produce", body=_batch(b'"with-secret"'), query={"topic": topic, "partition": 0},
                         headers={**leader.auth, "Content-Type": "application/vnd.ring.batch"})
    assert r.status == 200 and orjson.loads(r.body)["base_offset"] == 1


def test_a_broker_without_a_secret_refuses_every_peer_request(make_broker) -> None:
    b = make_broker("--peer-listen", "127.0.0.1:0")
    port = int(b.log_text().split("(peer http://127.0.0.1:")[1].split(")")[0])
    from tests.brokers import Http

    peer = Http("127.0.0.1", port)
    for path in ("/peer/v1/status", "/peer/v1/replicas/t/0"):
        for headers in ({}, {"Ring-Cluster-Secret": ""}, {"Ring-Cluster-Secret": "anything"}):
            assert peer.get(path, headers=headers).status == 401
    assert "no cluster secret is set" in b.log_text()
