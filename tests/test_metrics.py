"""``GET /metrics``: Prometheus text that parses, after real traffic, with numbers that match.

In-process tests run the broker, app and server ``ring serve`` runs, on a
loopback socket (no mocks: requests go through the client port's front, the
broker writes its logs). A last test asks a ``ring serve`` process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest

from prometheus_client import parser
from ring.http_api.web import App

from ring.groups.service import GroupLag
from ring.http_api import metrics
from ring.cluster.node import ClusterBroker
from tests.support import serve_alone

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[dict[str, Any], Samples]:
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    samples: Samples = {}
    for fam in families.values():
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def value(samples: Samples, metric: str, **labels: str) -> float:
    return samples[(metric, tuple(sorted(labels.items())))]


class Served:
    def __init__(self, broker: ClusterBroker, app: App, base: str, session: aiohttp.ClientSession) -> None:
        self.broker, self.app, self.base, self.session = broker, app, base, session

    async def request(self, method: str, path: str, **kw: Any) -> tuple[int, bytes, Any]:
        async with self.session.request(method, self.base + path, **kw) as r:
            return r.status, await r.read(), r.headers

    async def scrape(self) -> tuple[str, dict[str, Any], Samples]:
        status, body, headers = await self.request("GET", "/metrics")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = body.decode()
        return (text, *parse(text))


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    broker, server = await serve_alone(tmp_path / "ring-0", "always")
    async with aiohttp.ClientSession() as session:
        yield Served(broker, server.app, server.url, session)
    broker.begin_shutdown()
    await server.stop()
    await broker.close()


async def test_traffic_is_counted_by_route_topic_and_status(served: Served) -> None:
    s = served
    assert (await s.request("POST", "/v1/topics", json={"name": "clicks", "partitions": 2}))[0] == 201
    bodies = [b'[{"value": 1}, {"value": 2}, {"value": 3}]', b'{"value": "x"}']
    for body in bodies:
        status, _, _ = await s.request("POST", "/v1/topics/clicks/messages?partition=0", data=body,
                                       headers={"Content-Type": "application/json"})
        assert status == 200
    status, _, headers = await s.request("GET", "/v1/topics/clicks/partitions/0/messages?offset=1")
    assert status == 200 and headers["Ring-Next-Offset"] == "4"
    assert (await s.request("GET", "/v1/topics/nope-zz9/partitions/0/messages"))[0] == 404
    assert (await s.request("GET", "/junk/zz9-plural-z-alpha"))[0] == 404
    assert (await s.request("POST", "/v1/topics/clicks/messages?partition=x", data=b"{}",
                            headers={"Content-Type": "application/json"}))[0] == 400

    text, families, samples = await s.scrape()
    produce = "/v1/topics/{topic}/messages"
    assert value(samples, "ring_http_requests_total", method="POST", route=produce, status="200") == 2
    assert value(samples, "ring_http_requests_total", method="POST", route=produce, status="400") == 1
    assert value(samples, "ring_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert value(samples, "ring_http_request_duration_seconds_count", method="POST", route=produce) == 3
    assert families["ring_http_request_duration_seconds"].type == "histogram"
    assert value(samples, "ring_produce_requests_total", topic="clicks") == 2
    assert value(samples, "ring_produce_records_total", topic="clicks") == 4
    assert value(samples, "ring_produce_bytes_total", topic="clicks") == sum(map(len, bodies))
    assert value(samples, "ring_fetch_requests_total", topic="clicks") == 1
    assert value(samples, "ring_fetch_records_total", topic="clicks") == 3
    assert value(samples, "ring_fetch_bytes_total", topic="clicks") > 0
    # Junk never becomes a label: no raw path, no topic that was refused.
    assert "zz9" not in text

    assert value(samples, "ring_partition_high_watermark", topic="clicks", partition="0") == 4
    assert value(samples, "ring_partition_end_offset", topic="clicks", partition="0") == 4
    assert value(samples, "ring_partition_earliest_offset", topic="clicks", partition="1") == 0
    assert value(samples, "ring_partition_is_leader", topic="clicks", partition="1") == 1
    assert value(samples, "ring_partition_leader_epoch", topic="clicks", partition="0") == 1
    assert value(samples, "ring_under_replicated_partitions") == 0
    assert value(samples, "ring_cluster_brokers", status="up") == 1
    assert value(samples, "ring_cluster_broker_status", broker="ring-0", status="up") == 1
    assert value(samples, "ring_topics") == 1
    assert value(samples, "ring_fsyncs_total") >= 1
    assert value(samples, "ring_writebacks_started_total") == 0  # policy always: every append is synced
    assert value(samples, "ring_disk_used_bytes") > 0
    assert value(samples, "ring_broker_info", broker="ring-0", version=__import__("ring").__version__) == 1
    assert value(samples, "ring_elections_total", result="won") == 2  # one per partition of clicks
    assert value(samples, "ring_elections_total", result="lost") == 0
    served.app[metrics.METRICS_KEY].sent("ring-1", 512)
    _, _, samples = await s.scrape()
    assert value(samples, "ring_replication_sent_bytes_total", follower="ring-1") == 512
    assert "process_resident_memory_bytes" in families or "process_cpu_seconds" in families


async def test_open_long_polls_are_a_gauge(served: Served) -> None:
    s = served
    assert (await s.request("POST", "/v1/topics", json={"name": "waits", "partitions": 1}))[0] == 201
    poll = asyncio.create_task(s.request("GET", "/v1/topics/waits/partitions/0/messages?offset=0&wait_ms=5000"))
    samples: Samples = {}
    for _ in range(100):  # bounded: the long-poll registers within a loop turn or two
        _, _, samples = await s.scrape()
        if value(samples, "ring_long_polls_open") == 1:
            break
        await asyncio.sleep(0.02)
    assert value(samples, "ring_long_polls_open") == 1
    await s.request("POST", "/v1/topics/waits/messages", data=b'{"value": 1}',
                    headers={"Content-Type": "application/json"})
    status, _, _ = await asyncio.wait_for(poll, 5)
    assert status == 200
    _, _, samples = await s.scrape()
    assert value(samples, "ring_long_polls_open") == 0
    assert value(samples, "ring_fetch_records_total", topic="waits") == 1


async def test_group_lag_comes_from_the_group_source(served: Served) -> None:
    m: metrics.Metrics = served.app[metrics.METRICS_KEY]
    m.group_source = lambda: [GroupLag("billing", "orders", 0, 10, 25, 2),
                              GroupLag("billing", "orders", 1, None, 7, 2)]
    _, _, samples = await served.scrape()
    assert value(samples, "ring_group_lag_records", group="billing", topic="orders", partition="0") == 15
    assert value(samples, "ring_group_lag_records", group="billing", topic="orders", partition="1") == 7
    assert value(samples, "ring_group_members", group="billing") == 2


async def test_a_failing_collector_still_answers(served: Served) -> None:
    await served.request("POST", "/v1/topics", json={"name": "t1", "partitions": 1})

    def broken() -> list[GroupLag]:
        raise RuntimeError("group coordinator is gone")

    served.app[metrics.METRICS_KEY].group_source = broken
    _, _, samples = await served.scrape()
    assert value(samples, "ring_http_requests_total", method="POST", route="/v1/topics", status="201") == 1


def test_a_broker_process_serves_metrics(broker: Any) -> None:
    http = broker.http
    http.create_topic("metrics-proc", partitions=1)
    assert http.produce("metrics-proc", b'{"value": 1}').status == 200
    r = http.get("/metrics")
    assert r.content_type == "text/plain"
    _, samples = parse(r.body.decode())
    assert value(samples, "ring_produce_records_total", topic="metrics-proc") == 1
    assert value(samples, "ring_partition_high_watermark", topic="metrics-proc", partition="0") == 1
    assert value(samples, "ring_broker_ready") == 1


async def test_docs_list_exactly_the_metrics_served(served: Served) -> None:
    """docs/ADMIN.md's table names every ring_ metric /metrics serves, with its type."""
    import re

    from tests.brokers import REPO_ROOT

    rows = re.findall(r"^\| `(ring_[a-z_]+)` \| (\w+) \|", (REPO_ROOT / "docs" / "ADMIN.md").read_text(), re.M)
    documented = {}
    for name, kind in rows:
        family = re.sub(r"_total$", "", name) if kind == "counter" else name
        documented[family] = kind
    _, families, _ = await served.scrape()
    served_types = {name: f.type for name, f in families.items() if name.startswith("ring_")}
    assert documented == served_types


async def test_a_deleted_topic_leaves_no_series(served: Served) -> None:
    s = served
    assert (await s.request("POST", "/v1/topics", json={"name": "gone", "partitions": 1}))[0] == 201
    assert (await s.request("POST", "/v1/topics/gone/messages", data=b'{"value": 1}',
                            headers={"Content-Type": "application/json"}))[0] == 200
    text, _, _ = await s.scrape()
    assert 'topic="gone"' in text
    assert (await s.request("DELETE", "/v1/topics/gone"))[0] == 200
    text, _, samples = await s.scrape()
    assert 'topic="gone"' not in text
    # Buckets are cumulative and end with every observation.
    route = "/v1/topics/{topic}/messages"
    inf = value(samples, "ring_http_request_duration_seconds_bucket", method="POST", route=route, le="+Inf")
    assert inf == value(samples, "ring_http_request_duration_seconds_count", method="POST", route=route) == 1


def test_a_leader_counts_the_bytes_it_replicates_to_each_follower(shared_cluster: Any, topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3).status == 201
    leader = c.leaders(topic)[0]
    member = c.member(leader)
    assert member.http.produce(topic, b'{"page": "/"}', partition=0, consistency="all").status == 200
    body = member.http.get("/metrics").body.decode()
    sent = {s.labels["follower"]: s.value for f in parser.text_string_to_metric_families(body)
            for s in f.samples if s.name == "ring_replication_sent_bytes_total"}
    followers = {m.name for m in c} - {leader}
    assert set(sent) >= followers and all(sent[f] > 0 for f in followers), sent
