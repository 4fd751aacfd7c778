"""Failure domains on real brokers: ``ring serve --host NAME --zone NAME`` is gossiped, shown in
/v1/cluster, and placement keeps a partition's replicas on distinct hosts (tests/test_placement_domains.py
holds the property tests of the placement itself)."""

from __future__ import annotations

import socket
from pathlib import Path

from ring.catalog import TopicConfig
from ring.gossip.state import EndpointState
from ring.hashing import broker_token
from ring.node import placement
from tests.brokers import TestCluster

# ring-0 and ring-1 share host "a": no partition may hold both while hosts a, b and c have members.
HOSTS = {"ring-0": ("a", "z1"), "ring-1": ("a", "z1"), "ring-2": ("b", "z2"), "ring-3": ("c", None)}


def test_brokers_gossip_their_host_and_zone_and_no_partition_has_two_replicas_on_one_host(
        tmp_path: Path, topic: str) -> None:
    c = TestCluster(tmp_path / "cluster", 4)
    for b in c.local.brokers:
        host, zone = HOSTS[b.name]
        b.args += ["--host", host] + (["--zone", zone] if zone else [])
    try:
        c.start()
        for m in c:
            brokers = {b["name"]: b for b in m.http.get("/v1/cluster").json()["brokers"]}
            assert {n: (b["host"], b["zone"]) for n, b in brokers.items()} == HOSTS
        assert c[3].http.create_topic(topic, partitions=12, replication_factor=3).status == 201
        eps = [EndpointState(n, broker_token(int(n[-1])), "x:1", "x:2", 1, status="normal",
                             extra={"host": h, **({"zone": z} if z else {})}) for n, (h, z) in HOSTS.items()]
        expected = placement.preference_lists(placement.placement_ring(eps), _cfg(c, topic))
        for m in c:
            parts = m.http.get(f"/v1/topics/{topic}").json()["partitions"]
            for p in parts:
                hosts = [HOSTS[r][0] for r in p["replicas"]]
                assert len(set(hosts)) == 3, (p["partition"], p["replicas"])
                assert p["replicas"] == expected[p["partition"]]
        # Leadership stays the ring's: each partition's natural leader is the one it has without hosts.
        plain = [EndpointState(e.name, e.token, "x:1", "x:2", 1, status="normal") for e in eps]
        leaders = [p["replicas"][0] for p in c[0].http.get(f"/v1/topics/{topic}").json()["partitions"]]
        assert leaders == [r[0] for r in placement.preference_lists(placement.placement_ring(plain), _cfg(c, topic))]
    finally:
        c.kill()


def test_a_broker_without_host_flag_gossips_the_machine_hostname(tmp_path: Path) -> None:
    c = TestCluster(tmp_path / "cluster", 1)
    try:
        c.start()
        (b,) = c[0].http.get("/v1/cluster").json()["brokers"]
        assert b["host"] == socket.gethostname() and b["zone"] is None
    finally:
        c.kill()


def _cfg(c: TestCluster, topic: str) -> TopicConfig:
    doc = c[0].http.get(f"/v1/topics/{topic}").json()
    return TopicConfig(name=topic, partitions=doc["partition_count"], replication_factor=3)
