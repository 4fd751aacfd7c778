"""The coordinator driver over a real broker alone (in-process, its own data directory): a checkpoint
is written to the offsets log, later records point at it, and a broker reopened on the same directory
replays only from the checkpoint and ends in the same state; a failed append drops the loaded shard."""

from __future__ import annotations

from pathlib import Path

from ring.catalog import TopicConfig
from ring.group_requests import CommitOffsets
from ring.groups.driver import OFFSETS_TOPIC
from ring.groups.service import Groups
from tests.support import lone_broker, until


async def test_replay_starts_at_the_latest_checkpoint(tmp_path: Path) -> None:
    b = await lone_broker(tmp_path, "never")
    try:
        await b.add_topic(TopicConfig(name="t", partitions=3, replication_factor=1, created_ms=1))
        groups = Groups(b)
        await groups.join("g", "m-1", ["t"], 10_000, None, "earliest")
        await groups.join("g", "m-2", ["t"], 10_000, None, "earliest")
        for i in range(1, 6):
            g = await groups.coord.existing("g")
            held = g.members["m-1"].spec.assignment
            await groups.commit(CommitOffsets("g", "m-1", None, tuple((t, p, i) for t, p in held)))
        p = groups.coord.partition_of("g", b.catalog.get(OFFSETS_TOPIC))
        await groups.coord.checkpoint(p)
        shard = await groups.coord.shard(p)
        checkpoint = shard.checkpoint
        assert checkpoint is not None and checkpoint == b.replica(OFFSETS_TOPIC, p).log.end_offset - 1
        await groups.commit(CommitOffsets("g", "m-1", None, tuple((t, p_, 9) for t, p_ in held)))
        await groups.leave("g", "m-2", commit=False)
        before = await groups.describe("g")
        end = b.replica(OFFSETS_TOPIC, p).log.end_offset
        await groups.coord.close()
    finally:
        await b.close()

    b = await lone_broker(tmp_path, "never")
    try:
        groups = Groups(b)
        await until(f"the reopened {OFFSETS_TOPIC}/{p} leading (it won its election)",
                    lambda: (rep := b.replica(OFFSETS_TOPIC, p)) is not None and rep.is_leader, 10)
        after = await groups.describe("g")
        shard = await groups.coord.shard(p)
        assert shard.checkpoint == checkpoint
        assert shard.since_checkpoint == end - checkpoint  # the checkpoint and what follows, not the rest
        for doc in (before, after):
            for m in doc["members"]:
                m.pop("idle_ms")
        assert after == before
        assert after["generation"] == 3 and [m["member"] for m in after["members"]] == ["m-1"]
        assert {(o["partition"], o["committed"]) for o in after["offsets"]} >= {(p_, 9) for _, p_ in held}
        await groups.coord.close()
    finally:
        await b.close()


async def test_a_failed_append_drops_the_shard_and_the_log_decides(tmp_path: Path) -> None:
    b = await lone_broker(tmp_path, "never")
    try:
        await b.add_topic(TopicConfig(name="t", partitions=1, replication_factor=1, created_ms=1))
        groups = Groups(b)
        await groups.join("g", "m", ["t"], 10_000, None, "earliest")
        p = groups.coord.partition_of("g", b.catalog.get(OFFSETS_TOPIC))
        b.begin_shutdown()  # appends now fail (503): nothing reaches the log
        try:
            await groups.commit(CommitOffsets("g", "m", None, (("t", 0, 5),)))
            raise AssertionError("the commit should have failed")
        except Exception as exc:  # noqa: BLE001 - the broker's own error, whatever it is
            assert getattr(exc, "status", None) == 503, exc
        assert p not in groups.coord._loaded  # reloaded from the log next time
        b._closing = False
        g = await groups.coord.existing("g")
        assert g.committed == {} and list(g.members) == ["m"]
        await groups.coord.close()
    finally:
        await b.close()
