"""The client's lifecycle against real brokers: flush and close do not wait out ``linger_ms`` for
records that waited for their topic's metadata, close leaves no task behind, a closed client says so
with one error, and create_topic returns once every partition has a leader on every broker."""

from __future__ import annotations

import asyncio
import time

import pytest

from ring.client import AsyncClient, Client, ClientClosed
from tests.brokers import TestBroker, TestCluster

pytestmark = pytest.mark.integration

LINGER_MS = 60_000


async def test_flush_sends_records_that_waited_for_metadata_at_once(broker: TestBroker, topic: str) -> None:
    async with AsyncClient(broker.url, linger_ms=LINGER_MS) as c:
        futs = [c.produce(topic, b"%d" % i) for i in range(100)]  # the topic is created on the way
        started = time.monotonic()
        await c.flush()
        assert time.monotonic() - started < LINGER_MS / 1000 / 2  # not the linger: the flush sent them
        assert sorted(f.result().offset for f in futs if f.result().partition == futs[0].result().partition)[0] == 0
        assert all(f.exception() is None for f in futs)
        late = c.produce(topic, b"late")
    assert late.done() and late.exception() is None  # close flushed it without waiting out the linger


def test_sync_close_flushes_records_waiting_for_metadata_at_once(broker: TestBroker, topic: str) -> None:
    c = Client(broker.url, linger_ms=LINGER_MS)
    futs = [c.produce(topic, b"%d" % i) for i in range(100)]
    started = time.monotonic()
    c.close()
    assert time.monotonic() - started < LINGER_MS / 1000 / 2
    assert all(f.exception() is None for f in futs)


async def test_close_leaves_no_task_and_a_closed_client_says_so(broker: TestBroker, topic: str) -> None:
    before = asyncio.all_tasks()
    c = AsyncClient(broker.url)
    await c.create_topic(topic, partitions=2)
    await c.produce(topic, b"x")
    await c.close()
    assert asyncio.all_tasks() - before == set()
    with pytest.raises(ClientClosed):
        c.produce(topic, b"after")
    with pytest.raises(ClientClosed):
        await c.fetch(topic, 0, 0)


async def test_close_during_a_topology_refresh_leaves_no_task(make_broker) -> None:
    b = make_broker()
    errors_seen: list = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors_seen.append(ctx))
    before = asyncio.all_tasks()
    c = AsyncClient(b.url)
    await c.create_topic("gone", partitions=1)
    b.kill()
    fut = c.produce("gone", b"x")
    deadline = time.monotonic() + 30
    refreshing = None
    while refreshing is None or refreshing.done():  # failing: a refresh of the topology, backing off
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
        refreshing = c._meta._refresh if c._meta is not None else None
    await c.close(flush=False)
    assert asyncio.all_tasks() - before == set()
    assert isinstance(fut.exception(), ClientClosed)
    await asyncio.sleep(0.1)
    assert errors_seen == []


def test_a_closed_sync_client_raises_the_same_error(broker: TestBroker, topic: str) -> None:
    c = Client(broker.url)
    c.create_topic(topic, partitions=1)
    c.close()
    with pytest.raises(ClientClosed):
        c.produce(topic, b"after")
    with pytest.raises(ClientClosed):
        c.flush()
    with pytest.raises(ClientClosed):
        c.fetch(topic, 0, 0)


async def test_create_topic_returns_once_every_partition_has_a_leader_everywhere(shared_cluster: TestCluster,
                                                                                 topic: str) -> None:
    async with AsyncClient(shared_cluster[0].url) as c:
        await c.create_topic(topic, partitions=12, replication_factor=3)
        for m in shared_cluster:  # each broker's own view, right away
            doc = m.http.get(f"/v1/topics/{topic}").json()
            assert [p["leader"] for p in doc["partitions"] if p["leader"] is None] == [], (m.name, doc)
        started = time.monotonic()
        await c.produce(topic, b"first", partition=11)
        assert c.stats["retries"] == 0, time.monotonic() - started
