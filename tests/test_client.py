"""ring.client against real broker processes: every record acknowledged and
read back where its key says, batching knobs that change the request count,
retries across a broker restart, and with a 3-broker cluster: produce requests
that go straight to leaders, a killed broker, and a 504 that is reported
rather than retried."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter

import pytest

from ring import errors
from ring.client import AsyncClient, BrokersUnavailable, BufferFull, Client, OutcomeUnknown, RecordMetadata
from ring.hashing import partition_for_key
from tests.brokers import TestBroker
from tests.support import until

pytestmark = pytest.mark.integration


async def read_all(c: AsyncClient, topic: str, partitions: int) -> dict[int, list]:
    out: dict[int, list] = {}
    for p in range(partitions):
        recs, offset = [], 0
        for _ in range(1000):  # bounded: each round returns at least one record or ends
            got = await c.fetch(topic, p, offset, max_records=5000)
            recs += got.records
            if not got.records or got.next_offset >= got.high_watermark:
                break
            offset = got.next_offset
        out[p] = recs
    return out


def check_read_back(sent: list[tuple[RecordMetadata, bytes | None, bytes]], stored: dict[int, list],
                    partitions: int, keyed_by_hash: bool = True) -> None:
    by_place = {(r.partition, r.offset): r for recs in stored.values() for r in recs}
    assert len(by_place) == len(sent)
    for md, key, value in sent:
        r = by_place[(md.partition, md.offset)]
        assert (r.key, r.value) == (key, value)
        if key is not None and keyed_by_hash:
            assert md.partition == partition_for_key(key, partitions)


async def test_async_produce_keyed_unkeyed_and_json_all_read_back(broker: TestBroker, topic: str) -> None:
    async with AsyncClient(broker.url, linger_ms=2) as c:
        await c.create_topic(topic, partitions=4)
        keys = [f"user-{i % 37}".encode() for i in range(3000)]
        futs = [c.produce(topic, f"v{i}", key=k) for i, k in enumerate(keys)]
        for i in range(2000):  # unkeyed, in bursts: each burst's batch is sticky to one partition
            futs.append(c.produce(topic, b"u%d" % i))
            if i % 200 == 199:
                await asyncio.sleep(0.01)
        json_md = await c.produce(topic, json={"page": "/", "n": 1}, key="j")
        mds = await asyncio.gather(*futs)
        sent = [(md, keys[i], f"v{i}".encode()) for i, md in enumerate(mds[:3000])]
        sent += [(md, None, b"u%d" % i) for i, md in enumerate(mds[3000:])]
        sent.append((json_md, b"j", b'{"page":"/","n":1}'))
        stored = await read_all(c, topic, 4)
        check_read_back(sent, stored, 4)
        unkeyed = Counter(md.partition for md, k, _ in sent if k is None)
        assert len(unkeyed) >= 3 and max(unkeyed.values()) <= 1000, unkeyed  # moves on batch by batch
        j = next(r for r in stored[json_md.partition] if r.offset == json_md.offset)
        assert j.value_is_json and j.json() == {"page": "/", "n": 1}
        assert c.stats["produce_requests"] < 200  # batched, not a request per record
        assert c.stats["retries"] == 0


def test_sync_client_produce_flush_and_read_back(broker: TestBroker, topic: str) -> None:
    with Client(broker.url) as c:
        c.create_topic(topic, partitions=3)
        keys = [b"k%d" % (i % 11) for i in range(2000)]
        futs = [c.produce(topic, b"v%d" % i, key=k, headers={"h": "x"}) for i, k in enumerate(keys)]
        c.flush()
        assert all(f.done() for f in futs)
        mds = [f.result() for f in futs]
        assert all(md.partition == partition_for_key(k, 3) for md, k in zip(mds, keys))
        for p in range(3):
            mine = sorted(md.offset for md in mds if md.partition == p)
            got = c.fetch(topic, p, 0, max_records=5000)
            assert [r.offset for r in got.records] == mine == list(range(len(mine)))
            assert all(r.headers == [("h", b"x")] for r in got.records)
        assert c.send_batch(topic, [b"a", {"json": [1, 2]}, {"value": "s", "key": "k0"}])[2].partition == \
            partition_for_key(b"k0", 3)
        assert c.describe(topic)["partition_count"] == 3
        assert topic in [t["name"] for t in c.topics()]
        assert c.cluster()["brokers"][0]["client_url"] == broker.url


async def test_custom_partitioner_places_every_record(broker: TestBroker, topic: str) -> None:
    def by_number(key: bytes | None, partitions: int) -> int:
        return 0 if key is None else int(key) % partitions

    async with AsyncClient(broker.url, partitioner=by_number) as c:
        await c.create_topic(topic, partitions=5)
        mds = await asyncio.gather(*(c.produce(topic, b"x", key=str(i)) for i in range(500)))
        assert [md.partition for md in mds] == [i % 5 for i in range(500)]
        assert (await c.produce(topic, b"none")).partition == 0
        stored = await read_all(c, topic, 5)
        assert {p: len(r) for p, r in stored.items()} == {0: 101, 1: 100, 2: 100, 3: 100, 4: 100}
        bad = c.produce(topic, b"x", partition=9)
        with pytest.raises(errors.UnknownPartition):
            await bad


async def _trickle(c: AsyncClient, topic: str, n: int) -> list[RecordMetadata]:
    futs = []
    for i in range(n):
        futs.append(c.produce(topic, b"r%d" % i, partition=0))
        await asyncio.sleep(0.002)
    return await asyncio.gather(*futs)


async def test_linger_and_batch_size_change_the_number_of_requests(broker: TestBroker, topic: str) -> None:
    async with AsyncClient(broker.url, linger_ms=0) as eager, \
            AsyncClient(broker.url, linger_ms=100) as patient, \
            AsyncClient(broker.url, linger_ms=100, batch_bytes=120) as small:
        await eager.create_topic(topic, partitions=1)
        mds = await _trickle(eager, topic, 60)
        await _trickle(patient, topic, 60)
        await _trickle(small, topic, 60)
        assert [md.offset for md in mds] == list(range(60))
        # records 2 ms apart: sent one by one with no linger, a few per 100 ms with it
        assert eager.stats["produce_requests"] >= 30, eager.stats
        assert patient.stats["produce_requests"] <= 10, patient.stats
        # 120-byte batches hold three records: each is sent when full, linger or not
        assert small.stats["batches"] >= 15, small.stats
        assert patient.stats["batches"] <= 10, patient.stats
        got = await eager.fetch(topic, 0, 0, max_records=500)
        assert [r.value for r in got.records] == [b"r%d" % (i % 60) for i in range(180)]


async def test_buffer_bound_and_drain(broker: TestBroker, topic: str) -> None:
    from ring import limits

    async with AsyncClient(broker.url, buffer_bytes=limits.BATCH_BYTES_MAX, linger_ms=50) as c:
        await c.create_topic(topic, partitions=1)
        value = b"x" * 100_000
        futs = []
        with pytest.raises(BufferFull):
            for _ in range(20):
                futs.append(c.produce(topic, value))
        await c.drain()
        assert c.buffered_bytes <= limits.BATCH_BYTES_MAX // 2
        futs.append(c.produce(topic, value))
        await c.flush()
        assert all(f.result().partition == 0 for f in futs)


def test_sync_produce_blocks_while_the_buffer_is_full(broker: TestBroker, topic: str) -> None:
    from ring import limits

    with Client(broker.url, buffer_bytes=limits.BATCH_BYTES_MAX, linger_ms=20) as c:
        c.create_topic(topic, partitions=2)
        value = b"y" * 200_000  # 30 of them: five times the buffer
        futs = [c.produce(topic, value, key=b"k%d" % (i % 2)) for i in range(30)]
        assert c.async_client.buffered_bytes <= limits.BATCH_BYTES_MAX
        c.flush()
        assert all(f.exception() is None for f in futs)  # waited for room, never BufferFull
        assert sorted(f.result().offset for f in futs if f.result().partition == futs[0].result().partition) == \
            list(range(15))


async def test_bad_input_and_unknown_topics(make_broker) -> None:
    b = make_broker("--no-auto-create")
    async with AsyncClient(b.url) as c:
        with pytest.raises(errors.UnknownTopic):
            await c.produce("nope", b"x")
        with pytest.raises(errors.InvalidTopicName):
            c.produce("../x", b"x")
        with pytest.raises(errors.BadRequest):
            c.produce("t", b"x", headers=[("a",)])  # a header is a (name, value) pair
        with pytest.raises(errors.BadRequest):
            c.produce("t", b"x", json=1)
        with pytest.raises(errors.PayloadTooLarge):
            c.produce("t", b"x", key=b"k" * 5000)
        await c.create_topic("t", partitions=2)
        with pytest.raises(errors.Conflict):
            await c.create_topic("t")
        assert (await c.create_topic("t", exist_ok=True))["partition_count"] == 2
        with pytest.raises(errors.OffsetOutOfRange) as e:
            await c.fetch("t", 0, 5)
        assert e.value.extra["latest"] == 0
        with pytest.raises(errors.UnknownTopic):
            await c.fetch("nope", 0, 0)


async def test_long_poll_fetch_returns_when_records_arrive(broker: TestBroker, topic: str) -> None:
    async with AsyncClient(broker.url) as c:
        await c.create_topic(topic, partitions=1)
        parked = broker.http.status()["long_polls_open"]
        started = time.monotonic()
        poll = asyncio.ensure_future(c.fetch(topic, 0, 0, wait_ms=5000))
        await until("the broker shows the fetch parked as a long poll",
                    lambda: asyncio.to_thread(lambda: broker.http.status()["long_polls_open"] > parked))
        await c.produce(topic, b"late")
        got = await poll
        assert [r.value for r in got.records] == [b"late"] and got.next_offset == 1
        assert time.monotonic() - started < 4


async def test_a_restarted_broker_is_retried_until_it_answers(make_broker) -> None:
    b = make_broker("--fsync", "always")
    async with AsyncClient(b.url, retries=20, retry_backoff_ms=50) as c:
        await c.create_topic("r", partitions=2)
        assert (await c.produce("r", b"before", key="k")).offset == 0
        b.kill()
        futs = [c.produce("r", b"during%d" % i, key="k") for i in range(50)]
        await asyncio.sleep(0.3)
        assert not any(f.done() for f in futs)
        b.local.start()  # same port, same data
        mds = await asyncio.gather(*futs)
        assert [md.offset for md in mds] == list(range(1, 51))
        assert c.stats["retries"] >= 1
        got = await c.fetch("r", mds[0].partition, 0, max_records=100)
        assert [r.value for r in got.records] == [b"before"] + [b"during%d" % i for i in range(50)]


async def test_retries_are_bounded(make_broker) -> None:
    b = make_broker()
    async with AsyncClient(b.url, retries=2, retry_backoff_ms=20) as c:
        await c.create_topic("gone", partitions=1)
        b.kill()
        started = time.monotonic()
        with pytest.raises(BrokersUnavailable):
            await c.produce("gone", b"x")
        with pytest.raises(BrokersUnavailable):
            await c.fetch("gone", 0, 0)
        assert time.monotonic() - started < 10


async def test_fetches_and_admin_calls_wait_out_a_broker_down_for_longer_than_a_retry_round(make_broker) -> None:
    """With the default settings, a fetch, a description and a listing made while the only broker is
    down for 12 s (longer than the ~7 s such calls once tried for) answer once it is back."""
    b = make_broker()
    async with AsyncClient(b.url) as c:
        await c.create_topic("back", partitions=1)
        await c.produce("back", b"before")
        b.kill()
        killed = time.monotonic()
        calls = [asyncio.ensure_future(call) for call in (c.fetch("back", 0, 0), c.describe("back"), c.topics())]
        while time.monotonic() - killed < 12:
            assert not [f.exception() for f in calls if f.done()]
            await asyncio.sleep(0.2)
        await asyncio.to_thread(b.local.start)  # same port, same data
        got, described, listed = await asyncio.gather(*calls)
        assert [r.value for r in got.records] == [b"before"]
        assert described["partitions"][0]["high_watermark"] == 1 and "back" in [t["name"] for t in listed]


# --- against a 3-broker cluster ------------------------------------------------------

@pytest.fixture
def cluster(make_cluster):
    # Debug logging turns on each broker's access log: the brokers' own record
    # of which requests reached them.
    return make_cluster(3, "--log-level", "debug")


def _urls(cluster) -> list[str]:
    return [m.url for m in cluster]


async def _leaders(c: AsyncClient, topic: str) -> dict[int, str]:
    urls = {b["name"]: b["client_url"].rstrip("/") for b in (await c.cluster())["brokers"]}
    return {p["partition"]: urls[p["leader"]] for p in (await c.describe(topic))["partitions"]}


_PRODUCE_LINE = re.compile(r'"POST /v1/topics/([^/?]+)/messages\?partition=(\d+)')
_FORWARD_LINE = re.compile(r'"POST /peer/v1/produce\?[^"]*topic=direct')


async def test_cluster_produce_goes_straight_to_each_leader(cluster) -> None:
    async with AsyncClient(cluster[0].url) as c:  # one address is enough to learn the rest
        await c.create_topic("direct", partitions=6, replication_factor=3)
        leaders = await _leaders(c, "direct")
        assert len(set(leaders.values())) == 3, leaders  # leadership spread over the brokers
        keys = [b"user-%d" % i for i in range(600)]
        mds = await asyncio.gather(*(c.produce("direct", b"v", key=k) for k in keys),
                                   *(c.produce("direct", b"u%d" % i) for i in range(300)))
        assert all(md.partition == partition_for_key(k, 6) for md, k in zip(mds, keys))
        # the client's view: every produce request went to the partition's leader
        for (url, topic, partition), n in c.produce_requests.items():
            assert url == leaders[partition], (partition, url, leaders[partition])
        assert c.stats["retries"] == 0
        stored = await read_all(c, "direct", 6)
        assert sum(map(len, stored.values())) == 900
    # the brokers' view: each one's access log shows produce requests only for partitions it leads
    seen = 0
    for b in cluster:
        for topic, partition in _PRODUCE_LINE.findall(b.log_text()):
            if topic == "direct":
                assert leaders[int(partition)] == b.url, (b.name, partition)
                seen += 1
        # and none reached a leader forwarded by another broker
        assert not _FORWARD_LINE.search(b.log_text())
    assert seen == sum(n for (_, t, _), n in c.produce_requests.items() if t == "direct")


async def test_cluster_killed_broker_moves_requests_to_live_leaders_and_replicas(cluster) -> None:
    victim = cluster[1]
    # the victim first: learning the topology must move on to another broker
    async with AsyncClient([victim.url, *_urls(cluster)], retries=3, retry_backoff_ms=50) as c:
        await c.create_topic("survive", partitions=6, replication_factor=3)
        leaders = await _leaders(c, "survive")
        before = await asyncio.gather(*(c.produce("survive", b"b%d" % i, key=b"k%d" % i) for i in range(300)))
        victim.kill()
        # committed records of every partition, those led by the victim included, from a live replica
        stored = await read_all(c, "survive", 6)
        assert sorted((r.partition, r.offset) for rs in stored.values() for r in rs) == \
            sorted((md.partition, md.offset) for md in before)
        # unkeyed records all land, on partitions whose leader lives
        unkeyed = await asyncio.gather(*(c.produce("survive", b"u%d" % i) for i in range(200)))
        assert all(leaders[md.partition] != victim.url for md in unkeyed)
        # keyed records succeed exactly where the key's leader lives
        futs = {k: c.produce("survive", b"a", key=k) for k in (b"k%d" % i for i in range(60))}
        await asyncio.wait(futs.values())
        for k, fut in futs.items():
            dead = leaders[partition_for_key(k, 6)] == victim.url
            if dead:
                assert isinstance(fut.exception(), errors.RingError)
            else:
                assert fut.exception() is None and fut.result().partition == partition_for_key(k, 6)
        assert any(leaders[partition_for_key(k, 6)] == victim.url for k in futs)
        assert c.stats["retries"] > 0


async def test_cluster_outcome_unknown_is_raised_not_retried(cluster) -> None:
    # The client names no consistency: the topic's own ("all") applies.
    async with AsyncClient(_urls(cluster), retries=3, enable_idempotence=False) as c, \
            AsyncClient(_urls(cluster), consistency="one") as hasty:
        await c.create_topic("unknown", partitions=3, replication_factor=3, consistency="all")
        p = next(p["partition"] for p in (await c.describe("unknown"))["partitions"] if p["leader"] == "ring-0")
        assert (await c.produce("unknown", b"first", partition=p)).offset == 0
        cluster[1].pause()  # a follower that accepts connections and never acks
        try:
            assert (await hasty.produce("unknown", b"one", partition=p)).offset == 1
            with pytest.raises(OutcomeUnknown) as e:
                await c.produce("unknown", b"maybe", partition=p)
        finally:
            cluster[1].resume()
        assert e.value.extra["partition"] == p and c.stats["retries"] == 1
        # It was stored after all: a retry would have written it twice.
        got = await c.fetch("unknown", p, 0, wait_ms=2000)
        assert [r.value for r in got.records] == [b"first", b"one", b"maybe"]


async def test_cluster_produce_to_a_stopped_leader_is_acknowledged_through_another_broker_within_8_s(cluster) -> None:
    """A SIGSTOPped leader keeps its connections open and answers nothing: the idempotent producer gives
    its request up (no answer within CLIENT_PRODUCE_ANSWER_TIMEOUT_S) and sends it again, exactly as it
    was, through another broker, which forwards it to the leader the followers elect."""
    async with AsyncClient(_urls(cluster)) as c:  # idempotent by default, request timeout 30 s
        await c.create_topic("stopped", partitions=1, replication_factor=3, consistency="quorum")
        leader = (await c.describe("stopped"))["partitions"][0]["leader"]
        assert (await c.produce("stopped", b"first", partition=0)).offset == 0
        zombie = next(m for m in cluster if m.name == leader)
        zombie.pause()
        try:
            began = time.monotonic()
            md = await asyncio.wait_for(c.produce("stopped", b"during", partition=0), 40)
            took = time.monotonic() - began
        finally:
            zombie.resume()
        assert md.offset == 1
        assert took <= 8.0, took
        got = await c.fetch("stopped", 0, 0, wait_ms=2000)
        assert [r.value for r in got.records] == [b"first", b"during"]


async def test_cluster_outcome_unknown_is_retried_idempotently(cluster) -> None:
    async with AsyncClient(_urls(cluster)) as c:  # idempotent by default
        await c.create_topic("unknown", partitions=3, replication_factor=3, consistency="all")
        p = next(p["partition"] for p in (await c.describe("unknown"))["partitions"] if p["leader"] == "ring-0")
        assert (await c.produce("unknown", b"first", partition=p)).offset == 0
        cluster[1].pause()  # a follower that accepts connections and never acks: 504, the outcome unknown
        try:
            maybe = c.produce("unknown", b"maybe", partition=p)
            deadline = time.monotonic() + 60
            while c.stats["retries"] == 0:  # the first answer was a 504
                assert time.monotonic() < deadline and not maybe.done()
                await asyncio.sleep(0.1)
        finally:
            cluster[1].resume()
        md = await maybe  # the retry is recognised: the offset of the first attempt, stored once
        assert md.offset == 1
        got = await c.fetch("unknown", p, 0, wait_ms=2000)
        assert [r.value for r in got.records] == [b"first", b"maybe"]
