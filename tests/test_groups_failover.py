"""A consumer group's coordinator is SIGKILLed and restarted while two members consume (real brokers,
the Python client with its default settings): no record is lost, committed offsets never move back,
and records are delivered again only when a rebalance moved a partition (at most what its last owner
had not committed), not because the coordinator changed: the consumers put their own positions back
on the new coordinator. The consumers keep trying for as long as the group cannot be served, well
beyond a retry round of a few seconds: with another broker killed too (no stand-in can be elected)
both stay down 15 s, and consumers given only the coordinator's address find the stand-in through
the brokers they learned from it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from ring import limits
from ring.client import AsyncClient, AsyncGroupConsumer
from ring.hashing import partition_for_key
from tests.brokers import Http, TestCluster

pytestmark = pytest.mark.integration

RECORDS = 3000
PARTITIONS = 4
DOWN_S = 5.0  # the first case: restarted after 5 s, about when the others convict it
LONG_DOWN_S = 15.0  # twice the ~7 s a group consumer once retried for before giving up
DEADLINE_S = 120.0
HW_CATCH_UP_S = 10.0  # a follower learns its leader's high watermark with the next frame


def _coordinator(c: TestCluster, group: str) -> str:
    doc = c[0].http.get("/v1/topics/__offsets").json()
    return doc["partitions"][partition_for_key(group.encode(), doc["partition_count"])]["leader"]


async def _coordinator_before_use(c: TestCluster, group: str) -> str:
    """``group``'s coordinator before any member joined it (another group's use creates the offsets topic)."""
    await (await AsyncGroupConsumer([m.url for m in c], f"{group}-elsewhere", "orders").start()).close()
    deadline = time.monotonic() + DEADLINE_S
    while not (leader := await asyncio.to_thread(_coordinator, c, group)):
        assert time.monotonic() < deadline, "the offsets partition has no leader"
        await asyncio.sleep(0.1)
    return leader


def _committed(http: Http, group: str) -> dict[int, int] | None:
    try:
        r = http.get(f"/v1/groups/{group}")
    except OSError:
        return None
    if r.status != 200:
        return None
    return {o["partition"]: o["committed"] for o in r.json()["offsets"] if o["committed"] is not None}


# case -> (down for s, down until a stand-in took commits, other brokers killed with it, members given only its URL)
CASES = {
    "restarted-after-5s": (DOWN_S, False, 0, False),
    "restarted-after-a-stand-in": (None, True, 0, False),
    "two-down-15s": (LONG_DOWN_S, False, 1, False),
    "only-its-url-down-15s": (LONG_DOWN_S, False, 0, True),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_coordinator_killed_and_restarted_rewinds_nothing(make_cluster, case: str) -> None:
    down_s, stand_in, others_killed, only_its_url = CASES[case]
    c: TestCluster = make_cluster(3)
    urls = [m.url for m in c]
    topic, group = "orders", "billing"
    async with AsyncClient(urls) as producer:
        await producer.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
        await asyncio.gather(*(producer.produce(topic, b"%d" % i, key=b"k%d" % i) for i in range(RECORDS)))
        deadline = time.monotonic() + HW_CATCH_UP_S
        while True:  # (a broker answers with its own replicas' high watermarks: a follower's comes a frame later)
            ends = {p["partition"]: p["high_watermark"] for p in (await producer.describe(topic))["partitions"]}
            if sum(ends.values()) == RECORDS or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    assert sum(ends.values()) == RECORDS
    everything = {(p, o) for p in ends for o in range(ends[p])}
    coordinator = c.member(await _coordinator_before_use(c, group))
    victims = [coordinator, *[m for m in c if m is not coordinator][:others_killed]]
    if only_its_url:
        urls = [coordinator.url]

    deliveries: list[tuple[int, int]] = []
    a = await AsyncGroupConsumer(urls, group, topic, wait_ms=200).start()
    b = await AsyncGroupConsumer(urls[::-1], group, topic, wait_ms=200).start()
    for _ in range(2):  # a learns of b's join: both hold their share from here on
        deliveries.extend((r.partition, r.offset) for r in await a.poll(max_records=1, wait_ms=0))
    shares = (sorted(a.assignment), sorted(b.assignment))
    observers = [m for m in c if m not in victims]
    seen: dict[int, int] = {}

    def check_commits() -> dict[int, int]:
        for p, o in (_committed(observers[len(deliveries) % len(observers)].http, group) or {}).items():
            assert o >= seen.get(p, 0), f"the committed offset of partition {p} went back from {seen[p]} to {o}"
            seen[p] = o
        return dict(seen)

    async def consume(consumer: AsyncGroupConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            deliveries.extend((r.partition, r.offset) for r in await consumer.poll())
            await asyncio.sleep(0.05)  # the application's work on a poll

    def failed() -> list:
        return [t.exception() for t in tasks if t.done()]

    stop = asyncio.Event()
    tasks = [asyncio.create_task(consume(x, stop)) for x in (a, b)]
    started = time.monotonic()
    try:
        while len(deliveries) < RECORDS // 3:
            assert time.monotonic() - started < DEADLINE_S and not failed()
            await asyncio.sleep(0.05)
        at_kill = await asyncio.to_thread(check_commits)
        for m in victims:
            m.kill()
        killed_at = time.monotonic()
        while True:
            assert time.monotonic() - killed_at < DEADLINE_S and not failed(), failed()
            now = await asyncio.to_thread(check_commits)
            if stand_in and any(o > at_kill.get(p, 0) for p, o in now.items()):
                break  # the others convicted it and a stand-in took commits
            if not stand_in and time.monotonic() - killed_at >= down_s:
                break
            await asyncio.sleep(0.2)
        await asyncio.gather(*(asyncio.to_thread(m.local.start) for m in victims))
        observers = list(c)
        while not (set(deliveries) >= everything and await asyncio.to_thread(check_commits) == ends):
            assert time.monotonic() - started < DEADLINE_S, (len(set(deliveries)), seen, ends)
            assert not failed(), failed()
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        closed = await asyncio.gather(a.close(), b.close(), return_exceptions=True)  # never hiding why it failed
    assert not [e for e in failed() if e is not None]
    assert closed == [None, None]

    counts = Counter(deliveries)
    assert set(counts) == everything  # nothing lost
    again = sum(n - 1 for n in counts.values())
    if (sorted(a.assignment), sorted(b.assignment)) == shares and a.rejoins + b.rejoins == 1:
        assert again == 0, f"{again} records delivered again with no partition moving; {Counter(counts.values())}"
    else:  # a rebalance moved partitions: at most each member's last poll, not yet committed
        assert again <= 2 * limits.FETCH_RECORDS_DEFAULT, again


async def test_a_commit_answered_outcome_unknown_is_tried_again(make_cluster) -> None:
    """The other replicas of the group's offsets partition SIGKILLed: before they are convicted the
    coordinator appends a commit, waits for a quorum that is gone and answers 504 (outcome
    unknown). Committing the same offsets again is harmless, so the consumer tries it again, as
    it does after a dropped connection, until they are back 8 s later; then the offset is there."""
    c: TestCluster = make_cluster(3)
    async with AsyncClient([m.url for m in c]) as producer:
        await producer.create_topic("orders", partitions=1, replication_factor=1)
        await producer.produce("orders", b"x")
    coordinator = c.member(await _coordinator_before_use(c, "billing"))
    consumer = await AsyncGroupConsumer([m.url for m in c], "billing", "orders", auto_commit=False,
                                        session_timeout_ms=60_000).start()
    try:
        assert [r.value for r in await consumer.poll(wait_ms=5_000)] == [b"x"]
        victims = [m for m in c if m is not coordinator]
        for m in victims:
            m.kill()
        killed_at = time.monotonic()
        commit = asyncio.ensure_future(consumer.commit())
        while time.monotonic() - killed_at < 8:
            assert not commit.done() or commit.exception() is None, commit.exception()
            await asyncio.sleep(0.1)
        await asyncio.gather(*(asyncio.to_thread(m.local.start) for m in victims))
        await asyncio.wait_for(commit, DEADLINE_S)
        assert await consumer.committed("orders", 0) == 1
    finally:
        await consumer.close()
