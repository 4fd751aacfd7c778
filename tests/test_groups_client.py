"""Consumer groups through the Python client, on the shared 3-broker cluster: auto commit
(at-least-once), manual commit before processing (at-most-once) and after it (at-least-once), two
consumers splitting a topic, offset resets. PolarStreams' consumers: tests/test_polarstreams.py."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from ring.client import AsyncGroupConsumer, Client, GroupConsumer
from tests.brokers import TestCluster

pytestmark = pytest.mark.integration

WAIT_S = 20.0


def urls(c: TestCluster) -> list[str]:
    return [m.url for m in c]


def fill(c: TestCluster, topic: str, n: int, partitions: int = 4) -> None:
    assert c[0].http.create_topic(topic, partitions=partitions).status == 201
    with Client(urls(c)) as client:
        for i in range(n):
            client.produce(topic, json={"i": i}, key=f"k{i}")
        client.flush()


def committed(c: TestCluster, group: str) -> dict[int, int]:
    doc = c[2].http.get(f"/v1/groups/{group}").json()
    return {o["partition"]: o["committed"] for o in doc["offsets"] if o["committed"] is not None}


def test_auto_commit_reads_everything_and_close_commits_what_was_handed_out(shared_cluster: TestCluster,
                                                                             topic: str) -> None:
    c = shared_cluster
    fill(c, topic, 100)
    seen = []
    with GroupConsumer(urls(c), "auto", topic, wait_ms=300) as consumer:
        for record in consumer:
            seen.append(record.json()["i"])
            if len(seen) == 60:
                break
    assert len(set(seen)) == 60
    # The next consumer of the group starts exactly after what the first one was handed.
    rest = []
    with GroupConsumer([c[1].url], "auto", topic, wait_ms=300) as consumer:
        deadline = time.monotonic() + WAIT_S
        while len(rest) < 40 and time.monotonic() < deadline:
            rest.extend(r.json()["i"] for r in consumer.poll())
    assert sorted(seen + rest) == list(range(100))
    doc = c[0].http.get("/v1/groups/auto").json()
    assert doc["members"] == [] and all(o["lag"] == 0 for o in doc["offsets"])


def test_manual_commit_before_or_after_processing(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    fill(c, topic, 20, partitions=1)

    async def crash_after(group: str, commit_first: bool, processed: int) -> list[int]:
        """Handle ``processed`` records, committing before (at-most-once) or after (at-least-once) each,
        then die without a clean close; a second consumer reads what the group still owes."""
        consumer = await AsyncGroupConsumer(urls(c), group, [topic], auto_commit=False, wait_ms=300).start()
        done = []
        async for record in consumer:
            if commit_first:
                await consumer.commit()
            if len(done) == processed:  # dies while handling this one
                break
            done.append(record.json()["i"])
            if not commit_first:
                await consumer.commit()
        await consumer.close(commit=False)
        after = await AsyncGroupConsumer(urls(c), group, [topic], auto_commit=False, wait_ms=300).start()
        again = [r.json()["i"] for r in await after.poll()]
        await after.close()
        return again

    at_most_once = asyncio.run(crash_after("amo", True, 5))
    assert at_most_once == list(range(6, 20))  # record 5 was committed, never handled: lost, not repeated
    at_least_once = asyncio.run(crash_after("alo", False, 5))
    assert at_least_once == list(range(5, 20))  # record 5 was handled by nobody yet: read again


def test_closing_a_consumer_without_auto_commit_commits_only_what_it_was_told_to(shared_cluster: TestCluster,
                                                                                   topic: str) -> None:
    """At-least-once by hand: the application commits after processing each record, and leaves its loop
    (normally, no exception) holding one it did not process. Closing commits nothing more: the next
    consumer of the group gets that record."""
    c = shared_cluster
    fill(c, topic, 10, partitions=1)

    async def run() -> list[int]:
        group = f"by-hand-{topic}"
        async with AsyncGroupConsumer(urls(c), group, [topic], auto_commit=False, wait_ms=300) as consumer:
            async for record in consumer:
                if record.offset == 3:
                    break  # stopping: this one is not processed
                await consumer.commit()
        async with AsyncGroupConsumer(urls(c), group, [topic], auto_commit=False, wait_ms=300) as after:
            return [r.offset for r in await after.poll()]

    assert asyncio.run(run()) == list(range(3, 10))
    assert committed(c, f"by-hand-{topic}") == {0: 3}


def test_two_consumers_split_a_topic(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    fill(c, topic, 200)

    async def run() -> tuple[list[int], list[int], int]:
        a = await AsyncGroupConsumer(urls(c), "split", topic, wait_ms=200).start()
        b = await AsyncGroupConsumer(urls(c)[::-1], "split", topic, wait_ms=200).start()
        got_a: list[int] = []
        got_b: list[int] = []
        deadline = time.monotonic() + WAIT_S
        while len(set(got_a + got_b)) < 200 and time.monotonic() < deadline:
            got_a += [r.json()["i"] for r in await a.poll()]
            got_b += [r.json()["i"] for r in await b.poll()]
        rejoins = a.rejoins + b.rejoins
        assert set(a.assignment).isdisjoint(b.assignment) and len(a.assignment) == len(b.assignment) == 2
        await a.close()
        await b.close()
        return got_a, got_b, rejoins

    got_a, got_b, rejoins = asyncio.run(run())
    assert sorted(set(got_a + got_b)) == list(range(200))
    assert got_a and got_b
    assert rejoins >= 1  # a joined alone first, then learnt of b's join from a 409


def test_offset_resets(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=2).status == 201
    for p in range(2):
        assert c[p].http.produce(topic, orjson.dumps([{"n": n} for n in range(10)]), partition=p).status == 200
    path = f"/v1/groups/resets/offsets/{topic}"
    r = c[1].http.request("PUT", path, json_body={"to": "latest"})
    assert r.status == 200 and [o["offset"] for o in r.json()["offsets"]] == [10, 10]
    r = c[2].http.request("PUT", path, json_body={"to": "offset", "value": 3, "partition": 1})
    assert r.status == 200 and committed(c, "resets") == {0: 10, 1: 3}
    r = c[0].http.request("PUT", path, json_body={"to": "earliest"})
    assert r.status == 200 and committed(c, "resets") == {0: 0, 1: 0}
    r = c[0].http.request("PUT", path, json_body={"to": "timestamp", "value": 2**42})
    assert r.status == 200 and committed(c, "resets") == {0: 10, 1: 10}  # every record is older: the end
    bad = c[0].http.request("PUT", path, json_body={"to": "offset"})
    assert bad.status == 400
    assert c[0].http.request("PUT", "/v1/groups/resets/offsets/no-such-topic", json_body={"to": "earliest"}).status == 404


def test_group_lag_is_in_the_coordinators_metrics(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    fill(c, topic, 10, partitions=2)
    with GroupConsumer(urls(c), "metered", topic, wait_ms=200) as consumer:
        assert len(consumer.poll(max_records=4)) == 4
        lines = [ln for m in c for ln in m.http.get("/metrics").body.decode().splitlines()
                 if ln.startswith("ring_group_") and 'group="metered"' in ln]
    members = [ln for ln in lines if ln.startswith("ring_group_members")]
    lags = {ln.split('partition="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])
            for ln in lines if ln.startswith("ring_group_lag_records")}
    assert members and members[0].endswith(" 1.0")  # one coordinator reports it
    assert sorted(lags) == ["0", "1"] and sum(lags.values()) == 10  # nothing committed yet: all of it
