"""What a Kafka (aiokafka) user reaches for, against real brokers: delivery callbacks, RecordMetadata
with the timestamp, a bounded wait for a full buffer (max_block_ms), and on group consumers:
subscribing by pattern, seek / seek_to_beginning / seek_to_end / position / committed, pause and
resume, rebalance listeners, lag in the stats, and a commit that survives another member's join."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ring import errors, limits
from ring.client import AsyncClient, AsyncGroupConsumer, BufferFull, Client, GroupConsumer
from tests.brokers import TestBroker, TestCluster

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def urls(c: TestCluster) -> list[str]:
    return [m.url for m in c]


# --- producing ---------------------------------------------------------------------------------


async def test_on_delivery_and_record_metadata_timestamps(broker: TestBroker, topic: str) -> None:
    calls: list[tuple] = []
    async with AsyncClient(broker.url) as c:
        await c.create_topic(topic, partitions=1)
        futs = [c.produce(topic, b"%d" % i, timestamp=1_700_000_000_000 + i,
                          on_delivery=lambda err, md: calls.append((err, md))) for i in range(5)]
        failed: list[tuple] = []
        bad = c.produce(topic, b"x", partition=7, on_delivery=lambda err, md: failed.append((err, md)))
        now = await c.produce(topic, b"now")
        await asyncio.wait([*futs, bad])
    assert [md.timestamp for md in (f.result() for f in futs)] == [1_700_000_000_000 + i for i in range(5)]
    assert [(err, md.offset, md.timestamp) for err, md in calls] == [(None, i, 1_700_000_000_000 + i) for i in range(5)]
    assert [(type(err), md) for err, md in failed] == [(errors.UnknownPartition, None)]
    assert abs(now.timestamp - time.time() * 1000) < 60_000


def test_sync_on_delivery(broker: TestBroker, topic: str) -> None:
    done = threading.Event()
    got: list = []

    def report(err, md) -> None:
        got.append((err, md))
        if len(got) == 3:
            done.set()

    with Client(broker.url) as c:
        c.create_topic(topic, partitions=1)
        for i in range(3):
            c.produce(topic, b"%d" % i, on_delivery=report)
        c.flush()
        assert done.wait(WAIT_S)
    assert [(err, md.offset) for err, md in got] == [(None, 0), (None, 1), (None, 2)]


async def test_max_block_bounds_the_wait_for_room(make_broker) -> None:
    b = make_broker()
    value = b"v" * 200_000
    async with AsyncClient(b.url, buffer_bytes=limits.BATCH_BYTES_MAX, max_block_ms=500) as c:
        await c.create_topic("full", partitions=1)
        await c.produce("full", b"first")
        b.kill()  # nothing will be acknowledged: the buffer fills and stays full
        sent = [await c.send("full", value) for _ in range(5)]
        started = time.monotonic()
        with pytest.raises(BufferFull):
            await c.send("full", value)
        assert 0.5 <= time.monotonic() - started < 5
        b.local.start()
        assert (await c.send_and_wait("full", value)).offset == 6
        assert [(await f).offset for f in sent] == [1, 2, 3, 4, 5]


def test_sync_produce_gives_up_after_max_block_ms(make_broker) -> None:
    b = make_broker()
    value = b"v" * 200_000
    with Client(b.url, buffer_bytes=limits.BATCH_BYTES_MAX, max_block_ms=300) as c:
        c.create_topic("full", partitions=1)
        c.produce("full", b"first").result(WAIT_S)
        b.kill()
        futs = [c.produce("full", value) for _ in range(5)]
        started = time.monotonic()
        with pytest.raises(BufferFull):
            c.produce("full", value)
        assert 0.3 <= time.monotonic() - started < 5
        b.local.start()
        c.flush()
        assert [f.result().offset for f in futs] == [1, 2, 3, 4, 5]


# --- group consumers --------------------------------------------------------------------------


def fill(c: TestCluster, topic: str, n: int, partitions: int = 2) -> None:
    with Client(urls(c)) as client:
        client.create_topic(topic, partitions=partitions, exist_ok=True)
        for i in range(n):
            client.produce(topic, b"%d" % i, partition=i % partitions)
        client.flush()


async def test_subscribe_by_pattern_follows_new_topics(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    fill(c, f"{topic}-a", 4)
    fill(c, f"{topic}-other", 4)  # does not match
    consumer = await AsyncGroupConsumer(urls(c), f"g-{topic}", pattern=rf"{topic}-(a|b)", wait_ms=100,
                                        metadata_max_age_ms=200).start()
    try:
        assert consumer.topics == [f"{topic}-a"]
        fill(c, f"{topic}-b", 6)
        got: set = set()
        deadline = time.monotonic() + WAIT_S
        while len(got) < 10 and time.monotonic() < deadline:
            got |= {(r.topic, r.value) for r in await consumer.poll()}
        assert got == {(f"{topic}-a", b"%d" % i) for i in range(4)} | {(f"{topic}-b", b"%d" % i) for i in range(6)}
        assert consumer.topics == [f"{topic}-a", f"{topic}-b"]
    finally:
        await consumer.close()


class Listener:
    def __init__(self) -> None:
        self.events: list[tuple[str, set]] = []

    def on_partitions_revoked(self, partitions: set) -> None:
        self.events.append(("revoked", partitions))

    async def on_partitions_assigned(self, partitions: set) -> None:
        self.events.append(("assigned", partitions))


async def test_rebalance_listener_and_a_commit_across_another_members_join(shared_cluster: TestCluster,
                                                                           topic: str) -> None:
    c = shared_cluster
    fill(c, topic, 20)
    heard = Listener()
    a = await AsyncGroupConsumer(urls(c), f"g-{topic}", topic, listener=heard, auto_commit=False, wait_ms=100).start()
    assert heard.events == [("assigned", {(topic, 0), (topic, 1)})]
    assert len(await a.poll()) == 20
    b = await AsyncGroupConsumer(urls(c)[::-1], f"g-{topic}", topic, wait_ms=100).start()
    try:
        [moved] = b.assignment
        [kept] = {(topic, 0), (topic, 1)} - {moved}
        await a.commit({kept: 10})  # a's generation is stale, but it held this partition all along
        assert a.rejoins == 0 and await a.committed(*kept) == 10
        with pytest.raises(errors.Conflict) as refused:  # the other one went to b: its records are b's now
            await a.commit({moved: 10})
        assert refused.value.extra["reason"] == "not_assigned" and await a.committed(*moved) is None
        assert a.rejoins == 1 and a.assignment == [kept]
        assert heard.events[1:] == [("revoked", {moved})]
        assert a.stats["commits"] == 1
    finally:
        await b.close()
        await a.close()


async def test_seek_position_committed_pause_resume_and_lag(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    fill(c, topic, 20)  # ten records per partition
    consumer = await AsyncGroupConsumer(urls(c), f"g-{topic}", topic, wait_ms=100).start()
    try:
        assert await consumer.position(topic, 0) == 0 and await consumer.committed(topic, 0) is None
        got = await consumer.poll(max_records=20)
        assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in (0, 1) for o in range(10)]
        assert await consumer.position(topic, 1) == 10
        assert await consumer.lag() == {(topic, 0): 0, (topic, 1): 0} and consumer.stats["lag_records"] == 0

        consumer.seek(topic, 0, 4)  # back: read again from 4, committing nothing by itself
        again = await consumer.poll()
        assert [(r.partition, r.offset) for r in again] == [(0, o) for o in range(4, 10)]
        await consumer.commit()
        assert await consumer.committed(topic, 0) == 10

        await consumer.seek_to_beginning((topic, 1))
        assert await consumer.position(topic, 1) == 0
        consumer.pause((topic, 1))
        assert consumer.paused() == {(topic, 1)}
        assert await consumer.poll() == []  # partition 1 is paused, partition 0 has nothing new
        fill(c, topic, 2)  # one more record on each partition
        deadline = time.monotonic() + WAIT_S
        fresh: list = []
        while not fresh and time.monotonic() < deadline:
            fresh = await consumer.poll()
        assert [(r.partition, r.offset) for r in fresh] == [(0, 10)]
        assert await consumer.lag() == {(topic, 0): 0, (topic, 1): 11}
        consumer.resume((topic, 1))
        resumed: list = []
        while len(resumed) < 11 and time.monotonic() < deadline:
            resumed += await consumer.poll()
        assert [(r.partition, r.offset) for r in resumed] == [(1, o) for o in range(11)]
        await consumer.seek_to_end()
        assert await consumer.position(topic, 0) == 11 and await consumer.position(topic, 1) == 11
        with pytest.raises(errors.BadRequest):
            consumer.seek("elsewhere", 0, 1)
    finally:
        await consumer.close()


def test_sync_group_consumer_has_the_same_positions(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    fill(c, topic, 6, partitions=1)
    with GroupConsumer(urls(c), f"g-{topic}", topic, wait_ms=100) as consumer:
        seen = [next(consumer).offset for _ in range(3)]
        assert seen == [0, 1, 2] and consumer.position(topic, 0) == 3
        consumer.seek(topic, 0, 1)
        assert [next(consumer).offset for _ in range(5)] == [1, 2, 3, 4, 5]
        consumer.commit()
        assert consumer.committed(topic, 0) == 6
        assert consumer.lag() == {(topic, 0): 0} and consumer.stats["lag_records"] == 0
