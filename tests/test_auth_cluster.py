"""Client tokens on a real 3-broker cluster (--auth-tokens): 401 and 403 as JSON, permissions per
route and topic, identities carried between brokers for forwarded and proxied requests, and no way
for a client to claim an identity; the client library and the CLI pass the token."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import orjson
import pytest

from tests.brokers import REPO_ROOT
from tests.secure_cluster import SecureCluster, make_tokens

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureCluster, dict[str, str]]]:
    root = tmp_path_factory.mktemp("auth-cluster")
    tokens = make_tokens(root / "tokens.txt")
    c = SecureCluster(root / "cluster", 3, tokens_file=root / "tokens.txt", args=["--fsync", "interval:100"])
    c.start(admin_token=tokens["admin"])
    try:
        yield c, tokens
    finally:
        c.stop()


def _name(prefix: str = "orders-") -> str:
    return prefix + uuid.uuid4().hex[:10]


def _create(c: SecureCluster, tokens: dict[str, str], name: str, rf: int = 1, partitions: int = 3) -> None:
    r = c.client(0, tokens["admin"]).post("/v1/topics", json_body={"name": name, "partitions": partitions,
                                                                    "replication_factor": rf})
    assert r.status == 201, r.body


def test_open_routes_need_no_token_and_others_answer_401_json(cluster) -> None:
    c, tokens = cluster
    anon = c.client(0)
    for path in ("/v1/status", "/v1/openapi.json", "/", "/admin/app.js"):
        assert anon.get(path).status == 200, path
    for method, path in (("GET", "/v1/topics"), ("GET", "/v1/cluster"), ("GET", "/metrics"),
                         ("POST", "/v1/topics/orders-x/messages"), ("GET", "/v1/topics/orders-x/partitions/0/messages"),
                         ("GET", "/v1/groups"), ("DELETE", "/v1/topics/orders-x")):
        for token in (None, "not-a-token", tokens["admin"] + "x", ""):
            r = anon.with_token(token).request(method, path)
            assert r.status == 401, (method, path, token, r.body)
            assert r.content_type == "application/json" and r.json()["error"] == "unauthorized"
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert anon.request("GET", "/v1/topics", headers={"Authorization": f"Basic {tokens['admin']}"}).status == 401


def test_permissions_per_route_and_topic(cluster) -> None:
    c, tokens = cluster
    topic = _name()
    cons, prod, both = (c.client(1, tokens[n]) for n in ("consumer", "producer", "both"))
    # topic admin: admin only, and scoped admin only on its prefix
    assert cons.post("/v1/topics", json_body={"name": topic}).status == 403
    assert prod.post("/v1/topics", json_body={"name": topic}).status == 403
    scoped = c.client(0, tokens["scoped-admin"])
    r = scoped.post("/v1/topics", json_body={"name": topic})
    assert r.status == 403 and r.json()["error"] == "forbidden", r.body
    assert scoped.post("/v1/topics", json_body={"name": "orders-admin-" + topic, "replication_factor": 1}).status == 201
    r = scoped.request("PATCH", f"/v1/topics/orders-admin-{topic}", json_body={"retention_ms": 60_000})
    assert r.status == 200 and r.json()["retention_ms"] == 60_000, r.body
    _create(c, tokens, topic)
    # produce and consume
    assert prod.produce(topic, [{"n": 1}], partition=0).status == 200
    assert cons.produce(topic, [{"n": 2}], partition=0).status == 403
    assert cons.fetch(topic, 0).status == 200 and prod.fetch(topic, 0).status == 403
    assert both.produce(topic, [{"n": 3}], partition=0).status == 200 and both.fetch(topic, 0).status == 200
    assert cons.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": "latest"}).status == 200
    # outside the grants' topics
    other = _name("other-")
    assert both.produce(other, [1]).status == 403 and both.fetch(other, 0).status == 403
    assert both.get(f"/v1/topics/{other}").status == 403
    # describe needs any permission on the topic; listing needs a valid token only
    assert cons.get(f"/v1/topics/{topic}").status == 200 and prod.get(f"/v1/topics/{topic}").status == 200
    assert cons.get("/v1/topics").status == 200 and cons.get("/v1/cluster").status == 200
    # admin-only routes
    for who in (cons, prod, both):
        assert who.request("DELETE", f"/v1/topics/{topic}").status == 403
        assert who.request("PATCH", f"/v1/topics/{topic}", json_body={"retention_ms": 1000}).status == 403
        assert who.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 0}).status == 403
        assert who.get("/metrics").status == 200  # what any token may list anyway
    for who in (cons, prod, both, scoped):  # a group's delete: admin on every topic only
        r = who.request("DELETE", f"/v1/groups/g-{topic}")
        assert (r.status, r.json()["error"]) == (403, "forbidden"), r.body
    assert c.client(0, tokens["admin"]).request("DELETE", f"/v1/groups/g-{topic}").status == 404  # none such
    r = scoped.post("/v1/cluster/brokers/ring-9/decommission")
    assert r.status in (403, 404), r.body  # admin on every topic only (404: a build without the route)


def test_forwarded_and_proxied_requests_act_for_the_client(cluster) -> None:
    """RF 1: two of three brokers hold no replica of a partition and forward produces / proxy reads.
    Each acts for the client that asked, so the answers are those the client's own token gets."""
    c, tokens = cluster
    topic = _name()
    _create(c, tokens, topic, rf=1, partitions=3)
    for i in range(3):
        prod, cons = c.client(i, tokens["producer"]), c.client(i, tokens["consumer"])
        for p in range(3):
            r = prod.produce(topic, [{"from": i, "p": p}], partition=p)
            assert r.status == 200, r.body
            assert prod.fetch(topic, p).status == 403
            r = cons.fetch(topic, p)
            assert r.status == 200, r.body
            assert len(r.json()["records"]) == i + 1
            r = cons.get(f"/v1/topics/{topic}/partitions/{p}/offsets", query={"timestamp": "earliest"})
            assert r.status == 200, r.body
        # the admin page's relay of another broker's view of the topic
        r = cons.get(f"/admin/brokers/ring-{(i + 1) % 3}/topics/{topic}")
        assert r.status == 200, r.body
        assert c.client(i, tokens["producer"]).get(f"/admin/brokers/ring-{(i + 1) % 3}/topics/other").status == 403


def test_a_client_cannot_claim_an_identity(cluster) -> None:
    c, tokens = cluster
    topic = _name()
    _create(c, tokens, topic, rf=3)
    claimed = orjson.dumps({"name": "admin", "all": True, "grants": []}).decode()
    anon, cons = c.client(0), c.client(0, tokens["consumer"])
    # Ring-Principal without the secret counts for nothing: no token is still 401, a token is still itself
    assert anon.get("/v1/topics", headers={"Ring-Principal": claimed}).status == 401
    assert cons.produce(topic, [1], **{}).status == 403
    r = cons.post(f"/v1/topics/{topic}/messages", body=b"1", headers={"Ring-Principal": claimed,
                                                                       "Content-Type": "application/x-ndjson"})
    assert r.status == 403, r.body
    # a wrong or empty cluster secret is refused outright, whatever else the request carries
    for secret in ("wrong", "", c.secret + "x"):
        r = cons.post(f"/v1/topics/{topic}/messages", body=b"1",
                      headers={"Ring-Cluster-Secret": secret, "Ring-Principal": claimed,
                               "Content-Type": "application/x-ndjson"})
        assert r.status == 401, (secret, r.body)
    # group routing headers do not skip anything either
    r = anon.post("/v1/groups/g/members", json_body={"consumer": "c1", "topics": [topic]},
                  headers={"Ring-Group-Forwarded": "ring-1"})
    assert r.status == 401
    described = c.client(0, tokens["admin"]).get(f"/v1/topics/{topic}").json()
    assert [p["end_offset"] for p in described["partitions"]] == [0, 0, 0]


def test_groups_need_consume_on_their_topics(cluster) -> None:
    c, tokens = cluster
    topic, other = _name(), _name("other-")
    _create(c, tokens, topic)
    assert c.client(0, tokens["admin"]).post("/v1/topics", json_body={"name": other}).status == 201
    assert c.client(0, tokens["both"]).produce(topic, [{"k": 1}], partition=0).status == 200
    assert c.client(0, tokens["admin"]).produce(other, [{"secret": 1}], partition=0).status == 200
    group = "g-" + uuid.uuid4().hex[:8]
    cons = [c.client(i, tokens["consumer"]) for i in range(3)]
    prod = c.client(0, tokens["producer"])
    join = {"consumer": "m1", "topics": [topic]}
    assert prod.post(f"/v1/groups/{group}/members", json_body=join).status == 403
    r = cons[0].post(f"/v1/groups/{group}/members", json_body={"consumer": "m1", "topics": [topic, other]})
    assert r.status == 403, r.body
    # joined and polled through every broker: the coordinator is one of them, the others forward
    r = cons[1].post(f"/v1/groups/{group}/members", json_body=join)
    assert r.status == 200, r.body
    seen, token = [], {}
    for i in range(3):  # each poll names the last answer's token: it acknowledges that answer
        r = cons[i].post(f"/v1/groups/{group}/members/m1/poll", query={"wait_ms": 500, **token})
        assert r.status == 200, r.body
        seen += r.json()["records"]
        token = {"token": r.json()["token"]}
    assert [rec["value"] for rec in seen] == [{"k": 1}]
    # the admin's member of another group, on the other topic: the consumer token may not poll it
    g2 = group + "-2"
    assert c.client(0, tokens["admin"]).post(f"/v1/groups/{g2}/members",
                                             json_body={"consumer": "m2", "topics": [other]}).status == 200
    r = cons[2].post(f"/v1/groups/{g2}/members/m2/poll")
    assert r.status == 403, r.body
    r = cons[0].post(f"/v1/groups/{group}/offsets",
                     json_body={"consumer": "m1", "offsets": [{"topic": other, "partition": 0, "offset": 0}]})
    assert r.status == 403, r.body
    assert cons[0].get("/v1/groups").status == 200


def test_client_library_and_cli_send_the_token(cluster, tmp_path: Path) -> None:
    from ring.client import AsyncClient

    c, tokens = cluster
    topic = _name()
    _create(c, tokens, topic, rf=3)

    async def run() -> int:
        async with AsyncClient(c.url(0), token=tokens["both"]) as client:
            md = await client.produce(topic, json={"via": "client"}, partition=1)
            got = await client.fetch(topic, md.partition, md.offset)
            return len(got.records)

    assert asyncio.run(run()) == 1
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("RING_CLIENT_TOKEN", None)
    cmd = [sys.executable, "-m", "ring", "topics", "describe", topic, "--brokers", c.url(1)]
    ok = subprocess.run([*cmd, "--token", tokens["consumer"]], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "token" in refused.stderr, refused.stderr
