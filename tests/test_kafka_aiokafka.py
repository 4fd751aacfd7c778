"""aiokafka (asyncio's Kafka client, from PyPI), unchanged, against ring's Kafka listener: its producer's
acknowledged records are where it was told they are, and its group consumers rebalance as a member joins
and leaves, commit, and a member started again in the group resumes from the commits. A real 3-broker
ring; one cluster for the module."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.brokers import TestCluster

pytestmark = pytest.mark.integration

TOPIC, GROUP, PARTITIONS = "aio", "aio-group", 2
WAIT_S = 40.0


@pytest.fixture(scope="module")
def ring(kafka_cluster: TestCluster) -> TestCluster:
    c = kafka_cluster
    r = c[0].http.post("/v1/topics", json_body={"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 3})
    assert r.status == 201, r.body
    return c


async def produce(c: TestCluster, first: int, n: int) -> dict[tuple[int, int], bytes]:
    """``n`` keyed records at acks=all; (partition, offset) -> value, as each send was answered."""
    producer = AIOKafkaProducer(bootstrap_servers=c.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        sent = [await producer.send(TOPIC, key=f"k{i % 5}".encode(), value=f"v{i}".encode(),
                                    headers=[("n", str(i).encode()), ("n", b"again")]) for i in range(first, first + n)]
        metas = await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return {(m.partition, m.offset): f"v{i}".encode() for i, m in zip(range(first, first + n), metas)}


def consumer(c: TestCluster) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(TOPIC, bootstrap_servers=c.kafka_bootstrap, group_id=GROUP, auto_offset_reset="earliest",
                            enable_auto_commit=False, session_timeout_ms=10_000, heartbeat_interval_ms=300)


async def until(what: str, check, within_s: float = WAIT_S) -> None:
    async def wait() -> None:
        while not check():
            await asyncio.sleep(0.05)
    try:
        await asyncio.wait_for(wait(), within_s)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what}: not within {within_s:g} s") from None


async def pump(members: list[AIOKafkaConsumer], seen: dict[tuple[int, int], bytes], check, what: str) -> None:
    """Poll every member in turn, committing what each was handed, until ``check()``."""
    async def step() -> None:
        while not check():
            for m in members:
                got = await m.getmany(timeout_ms=50)
                for batch in got.values():
                    seen.update({(r.partition, r.offset): r.value for r in batch})
                if got:
                    await m.commit()
    try:
        await asyncio.wait_for(step(), WAIT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what}: not within {WAIT_S:g} s") from None


async def test_what_aiokafka_had_acknowledged_is_where_it_was_told(ring: TestCluster) -> None:
    acked = await produce(ring, 0, 50)
    stored = {}
    for p in range(PARTITIONS):
        r = ring[1].http.fetch(TOPIC, p, offset=0)
        assert r.status == 200, r.body
        for rec in r.json()["records"]:
            stored[(p, rec["offset"])] = rec["value"].encode()
            assert rec["headers"] == [["n", rec["value"][1:]], ["n", "again"]]  # in order, the repeat kept
    assert stored == acked
    assert {p for p, _ in acked} == set(range(PARTITIONS))


async def test_an_aiokafka_group_rebalances_commits_and_resumes_from_its_commits(ring: TestCluster) -> None:
    seen: dict[tuple[int, int], bytes] = {}
    a = consumer(ring)
    await a.start()
    b = consumer(ring)
    try:
        await pump([a], seen, lambda: a.assignment() == {TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)},
                   "the first member holding both partitions")
        await b.start()
        await pump([a, b], seen, lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1
                   and a.assignment() | b.assignment() == {TopicPartition(TOPIC, p) for p in range(PARTITIONS)},
                   "a rebalance giving each member one partition")
        await b.stop()  # it leaves the group: the first takes both partitions again
        await pump([a], seen, lambda: len(a.assignment()) == PARTITIONS, "the first member holding both again")
        acked = await produce(ring, 1000, 20)
        ends = ring[0].http.end_offsets(TOPIC)
        everything = {(p, o) for p in range(PARTITIONS) for o in range(ends[p])}
        await pump([a], seen, lambda: everything <= set(seen), "every record handed to a member")
        assert all(seen[k] == v for k, v in acked.items())
        committed = {p: await a.committed(TopicPartition(TOPIC, p)) for p in range(PARTITIONS)}
        assert committed == dict(enumerate(ends)), committed  # what it was handed, it committed
    finally:
        await a.stop()
        await b.stop()
    later = await produce(ring, 2000, 10)
    again = consumer(ring)
    await again.start()
    read: dict[tuple[int, int], bytes] = {}
    try:
        await pump([again], read, lambda: set(later) <= set(read), "the member started again reading what came since")
    finally:
        await again.stop()
    assert read == later  # from the commits on: nothing read before them again
