"""A ``Broker`` alone routes through its ``LocalRouter`` (ring/replication/local.py): everything here.

``ring serve`` runs a ``ClusterBroker`` even alone; the storage half, ``Broker``, still has a router
of its own, which serves every produce and read from its own logs. The broker here is given a host
(``BrokerHost``, what a ``ClusterBroker`` gives it as its ``ClusterPolicy``) with the least that lets
it open a topic (every partition held here, one replica each); its logs, group commit, turn writes
and long-polls are the real ones.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ring.broker import Broker
from ring.catalog import TopicConfig
from ring.clock import SystemClock
from ring.config import BrokerConfig
from ring.errors import OffsetOutOfRange, Unavailable
from ring.fetch import Fetch
from ring.offsets import LATEST, OffsetsAt, Truncate
from ring.log import batch as batchfmt
from ring.log.fsync import FsyncPolicy
from ring.produce import Batches, Produce, Records
from ring.replication.intake import is_pending, result_of, results_of
from ring.replication import local
from ring.replication.local import LocalRouter
from ring.replication.reads import StoredRead
from ring.replication.replica import Replica


class Alone:
    """The ``BrokerHost`` of a broker alone: every partition held here, one replica each."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.moved: list[tuple[str, int, int]] = []

    def held(self, cfg: TopicConfig) -> dict[int, list[str]]:
        return {p: [self.name] for p in range(cfg.partitions)}

    def initial_hw(self, topic: str, p: int, replicas: list[str]) -> int | None:
        return None

    def appended(self, part: Replica, durable: int | None = None) -> None:
        if durable is not None:
            part.set_durable(durable)

    def start_moved(self, part: Replica) -> None:
        self.moved.append((part.topic, part.index, part.log.start_offset))

    def refresh_clock(self) -> None:
        pass

    def retained_elsewhere(self, part: Replica) -> bool:
        return False

    async def add_topic(self, cfg: TopicConfig) -> dict[str, Any]:
        raise AssertionError("a broker alone here is given its topic")

    async def change_topic(self, name: str, body: object, at_least: bool) -> dict[str, Any]:
        raise AssertionError("no topic changes here")

    async def delete_topic(self, name: str) -> None:
        raise AssertionError("no topic changes here")


def _batch(value: bytes) -> bytearray:
    now = SystemClock().wall_ms()
    return bytearray(batchfmt.encode([(now, None, value, None)], now_ms=now))


def _req(level: str) -> Produce:
    """A produce to partition 1 of "t" at ``level``, as the intake hands it on (its batches given beside it)."""
    return Produce("t", Batches([], 0), 1, None, level)


@pytest.fixture
async def alone(tmp_path: Path) -> Any:
    broker = Broker(BrokerConfig(name="solo", data_dir=tmp_path, fsync=FsyncPolicy.parse("always")), SystemClock(),
                    Alone("solo"))
    broker._open_dir()
    broker._add_topic_local(TopicConfig("t", partitions=2))
    yield broker
    await broker.close()


async def test_a_broker_alone_appends_reads_and_truncates_its_own_logs(alone: Any) -> None:
    cfg = alone.catalog.get("t")
    assert isinstance(alone.router, LocalRouter)
    assert [alone.router.unkeyed_partition(cfg) for _ in range(4)] == [0, 1, 0, 1]  # round-robin over every partition
    first = await result_of("t", alone.router.produce_partition(_req("quorum"), cfg, 1, [_batch(b"a"), _batch(b"b")]))
    assert (first.partition, first.base_offset, first.count) == (1, 0, 2)
    soon = alone.router.produce_partition(_req("quorum"), cfg, 1, [_batch(b"c")])
    assert is_pending(soon)  # this turn's write: no task
    settled = asyncio.get_running_loop().create_future()
    soon.add_done_callback(lambda a: settled.set_result(None))
    await asyncio.wait_for(settled, 10)  # no other voter to wait for: answered once durable here
    assert (soon.base, soon.count) == (2, 1)
    assert alone.fetch(Fetch("t", 1, None, 1 << 20)).high_watermark == 3  # answered at once
    waiting = alone.fetch(Fetch("t", 1, 3, 1 << 20, 10_000))  # a long-poll at the end: an awaitable
    assert not isinstance(waiting, StoredRead)
    waiting = asyncio.ensure_future(waiting)
    await result_of("t", alone.router.produce_partition(_req("one"), cfg, 1, [_batch(b"d")]))
    got = await asyncio.wait_for(waiting, 10)
    assert [r.value for r in batchfmt.decode(got.data, 0)[1]] == [b"d"]
    assert (await alone.offsets(OffsetsAt("t", 1, LATEST)))["offset"] == 4
    assert (await alone.truncate(Truncate("t", 1, 2)))["earliest_offset"] == 2
    assert alone.host.moved == [("t", 1, 2)]
    with pytest.raises(OffsetOutOfRange):  # at once, before any wait
        alone.fetch(Fetch("t", 1, 1, 1 << 20, 10_000))


async def test_a_produce_whose_broker_starts_shutting_down_before_its_turns_write_fails_unwritten(
        alone: Any) -> None:
    """The turn's write checks the partition may still be written: the broker began shutting down
    between the produce and its turn, so the produce fails with the awaited path's 503, nothing written."""
    cfg = alone.catalog.get("t")
    soon = alone.router.produce_partition(_req("one"), cfg, 1, [_batch(b"a")])
    assert is_pending(soon)
    alone.begin_shutdown()
    settled = asyncio.get_running_loop().create_future()
    soon.add_done_callback(lambda a: settled.set_result(None))
    await asyncio.wait_for(settled, 10)
    with pytest.raises(Unavailable):
        soon.result()
    assert alone.replica_of("t", 1).log.end_offset == 0


async def test_a_request_over_several_partitions_takes_each_partitions_turn_write(alone: Any, monkeypatch) -> None:
    """Records whose keys spread over both partitions: each partition's batches join that partition's
    turn write, as a one-partition produce's do; none takes the awaited append."""
    awaited = []
    append_awaited = local.append_awaited
    monkeypatch.setattr(local, "append_awaited", lambda host, part, *rest: awaited.append(part.index) or
                        append_awaited(host, part, *rest))
    keys = [b"k%d" % i for i in range(16)]
    records = [(None, k, b"v-" + k, None) for k in keys]
    got = alone.intake.produce(Produce("t", Records(records, [16] * len(records), False, True), None))
    assert not is_pending(got)  # two partitions: an awaitable of both results
    results = await asyncio.wait_for(results_of("t", got), 10)
    assert sorted(r.partition for r in results) == [0, 1] and sum(r.count for r in results) == 16
    assert awaited == []
    for r in results:
        stored = alone.fetch(Fetch("t", r.partition, 0, 1 << 20))
        assert [x.key for x in batchfmt.decode(stored.data, 0)[1]] == [k for k, p in zip(keys, _partitions(keys))
                                                                      if p == r.partition]


def _partitions(keys: list[bytes]) -> list[int]:
    from ring.hashing import partition_for_key

    return [partition_for_key(k, 2) for k in keys]


async def test_a_fetch_of_a_few_records_reads_only_the_batches_that_hold_them(alone: Any) -> None:
    """Forty one-record batches: a fetch with ``max_records`` 3 from offset 10 reads the three batches
    holding offsets 10-12 (and checks no more), one without reads all from 10 that ``max_bytes``
    holds; both see the same high watermark."""
    cfg = alone.catalog.get("t")
    for i in range(40):
        await result_of("t", alone.router.produce_partition(_req("one"), cfg, 0, [_batch(b"v%d" % i)]))
    few = alone.fetch(Fetch("t", 0, 10, 1 << 20, 0, 3))
    every = alone.fetch(Fetch("t", 0, 10, 1 << 20))
    assert [r.offset for r, _ in batchfmt.records_between(few.data, 0, 1 << 62, 1 << 62)] == [10, 11, 12]
    assert [r.offset for r, _ in batchfmt.records_between(every.data, 0, 1 << 62, 1 << 62)] == list(range(10, 40))
    assert few.high_watermark == every.high_watermark == 40
