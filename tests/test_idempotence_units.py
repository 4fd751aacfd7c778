"""Idempotent producers' table: duplicates answered with the original offsets, old retries refused,
LRU-bounded producer ids, and a table rebuilt from a real partition log's batch headers that judges
exactly like the one kept while appending (what a new leader relies on)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ring import limits
from ring.clock import ManualClock
from ring.errors import Conflict
from ring.log import batch as batchfmt
from ring.log.config import LogConfig
from ring.log.partition import PartitionLog
from ring.replication.idempotence import Duplicate, ProducerStates, ProducerTable


def header(pid: int, seq: int, n: int) -> batchfmt.BatchHeader:
    return batchfmt.read_header(batch(pid, seq, n))


NOW_MS = ManualClock().wall_ms()


def batch(pid: int, seq: int, n: int, contiguous: bool = False) -> bytearray:
    return batchfmt.encode([(None, None, b"v%d" % i, None) for i in range(n)], now_ms=NOW_MS, producer_id=pid,
                           base_sequence=seq, sequences_contiguous=contiguous)


def kafka_header(pid: int, seq: int, n: int) -> batchfmt.BatchHeader:
    """The header of a batch whose producer's sequences have no gap (a Kafka producer's)."""
    return batchfmt.read_header(batch(pid, seq, n, contiguous=True))


def test_a_retry_gets_the_original_offsets() -> None:
    t = ProducerTable()
    t.record(7, 0, 3, 100)
    t.record(7, 3, 2, 103)
    assert t.judge("t", 0, [header(7, 3, 2)]) == Duplicate(103, 2)
    assert t.judge("t", 0, [header(7, 0, 3), header(7, 3, 2)]) == Duplicate(100, 5)
    assert t.judge("t", 0, [header(7, 5, 1)]) is None  # the next one
    assert t.judge("t", 0, [header(7, 50, 1)]) is None  # gaps are allowed
    assert t.judge("t", 0, [header(8, 0, 1)]) is None  # another producer
    assert t.judge("t", 0, [header(-1, -1, 4)]) is None  # not idempotent


def test_old_or_reordered_sequences_are_refused() -> None:
    t = ProducerTable(batches_kept=2)
    for i in range(4):
        t.record(1, i * 10, 10, i * 10)
    with pytest.raises(Conflict) as info:
        t.judge("t", 0, [header(1, 0, 10)])  # written, but no longer remembered
    assert info.value.extra["reason"] == "out_of_order_sequence"
    with pytest.raises(Conflict):
        t.judge("t", 0, [header(1, 35, 2)])  # inside the last batch, not matching it
    with pytest.raises(Conflict) as info:
        t.judge("t", 0, [header(1, 30, 10), header(1, 40, 1)])  # half duplicate, half new
    assert info.value.extra["reason"] == "partial_duplicate"
    with pytest.raises(Conflict):
        t.judge("t", 0, [header(1, 60, 2), header(1, 50, 2)])  # backwards within a request


def test_producer_ids_are_bounded_least_recently_used_first() -> None:
    t = ProducerTable(ids_max=3)
    for pid in (1, 2, 3):
        t.record(pid, 0, 1, pid)
    t.record(1, 1, 1, 10)  # 1 is used again: 2 is now the oldest
    t.record(4, 0, 1, 11)
    assert len(t) == 3 and t.evicted == 1 and t.batches(2) == []
    assert t.judge("t", 0, [header(2, 0, 1)]) is None  # forgotten: written again


def test_a_producer_with_contiguous_sequences_is_refused_a_gap() -> None:
    t = ProducerTable()
    assert t.judge("t", 0, [kafka_header(3, 40, 2)]) is None  # unknown: it may start anywhere
    t.record(3, 40, 2, 0)
    assert kafka_header(3, 42, 1).sequences_contiguous and not header(3, 42, 1).sequences_contiguous
    assert t.judge("t", 0, [kafka_header(3, 42, 1)]) is None  # the next one
    assert t.judge("t", 0, [kafka_header(3, 40, 2)]) == Duplicate(0, 2)  # a retry
    with pytest.raises(Conflict) as info:
        t.judge("t", 0, [kafka_header(3, 43, 1)])  # 42 not written yet: it would be overtaken
    assert info.value.extra["reason"] == "out_of_order_sequence" and info.value.extra["last_sequence"] == 41
    assert t.judge("t", 0, [kafka_header(3, 42, 1), kafka_header(3, 43, 1)]) is None  # in one request, in turn
    with pytest.raises(Conflict):
        t.judge("t", 0, [kafka_header(3, 42, 1), kafka_header(3, 44, 1)])  # a gap inside the request
    assert t.judge("t", 0, [header(3, 50, 1)]) is None  # a batch without the flag may skip


def test_an_append_waits_for_the_idempotent_appends_before_it(tmp_path: Path) -> None:
    """Two appends of one partition on the awaited path go in arrival order, while the table is built."""
    clock = ManualClock()

    async def run(tmp: Path) -> list[int]:
        states = ProducerStates(clock)
        part = Part(_log(tmp, clock))
        order: list[int] = []

        async def append(seq: int) -> None:
            b = [batch(5, seq, 1, contiguous=True)]
            turn = await states.turn(part, b)
            try:
                assert not states.ready(part, b)  # a later append would take the awaited path too
                assert states.check(part, b) is None
                base = part.log.end_offset
                part.log.append(b[0], part.epoch)
                states.appended(part, b, base)
                order.append(seq)
            finally:
                states.end_turn(turn)

        await asyncio.gather(append(0), append(1), append(2))
        assert states.ready(part, [batch(5, 3, 1, contiguous=True)])  # every turn ended: none is kept
        return order

    assert asyncio.run(run(tmp_path)) == [0, 1, 2]


def _log(tmp: Path, clock: ManualClock) -> PartitionLog:
    return PartitionLog(tmp, LogConfig(segment_bytes=4096), clock)


class Part:
    """The few fields of a replica ProducerStates reads: a real log, its epoch and identity."""

    def __init__(self, plog: PartitionLog, epoch: int = 1) -> None:
        self.topic, self.index, self.log, self.epoch = "t", 0, plog, epoch


def _append(states: ProducerStates, part: Part, batches: list[bytearray]) -> Duplicate | tuple[int, int]:
    asyncio.run(states.prepare(part, batches))
    dup = states.check(part, batches)
    if dup is not None:
        return dup
    base = part.log.end_offset
    for b in batches:
        part.log.append(b, part.epoch)
    states.appended(part, batches, base)
    return base, part.log.end_offset - base


def test_a_new_leader_rebuilds_the_table_from_the_log(tmp_path: Path) -> None:
    clock = ManualClock()
    plog = _log(tmp_path, clock)
    leader = ProducerStates(clock)
    part = Part(plog)
    assert _append(leader, part, [batch(5, 0, 3)]) == (0, 3)
    assert _append(leader, part, [batch(-1, -1, 2)]) == (3, 2)
    assert _append(leader, part, [batch(5, 3, 1), batch(6, 0, 2)]) == (5, 3)
    assert _append(leader, part, [batch(5, 3, 1), batch(6, 0, 2)]) == Duplicate(5, 3)
    # Another broker's states over the same log (a failover): same judgement, nothing appended.
    other = ProducerStates(clock)
    assert _append(other, Part(plog, epoch=2), [batch(5, 0, 3)]) == Duplicate(0, 3)
    assert _append(other, Part(plog, epoch=2), [batch(6, 0, 2)]) == Duplicate(6, 2)
    assert plog.end_offset == 8
    # Appends the table did not see (a follower's replicated ones) are caught up before judging.
    plog.append(batch(9, 0, 1), 2)
    assert _append(other, Part(plog, epoch=2), [batch(9, 0, 1)]) == Duplicate(8, 1)
    plog.close()


def stamped(pid: int, seq: int, ts_ms: int) -> bytearray:
    return batchfmt.encode([(None, None, b"v", None)], now_ms=ts_ms, producer_id=pid, base_sequence=seq)


def test_the_rebuild_window_reaches_back_from_the_newest_record(tmp_path: Path) -> None:
    clock = ManualClock()
    plog = _log(tmp_path, clock)
    plog.append(stamped(1, 0, NOW_MS), 1)
    later = NOW_MS + limits.PRODUCER_STATE_WINDOW_MS + 60_000
    plog.append(stamped(2, 0, later), 1)
    clock.advance((later - NOW_MS) / 1000)
    states = ProducerStates(clock)
    # Producer 1's only batch is older than the window before the newest record: a retry of it is not
    # recognised; producer 2's is.
    assert _append(states, Part(plog), [stamped(2, 0, later)]) == Duplicate(1, 1)
    assert _append(states, Part(plog, epoch=2), [stamped(1, 0, NOW_MS)]) == (2, 1)
    plog.close()


def test_a_wall_clock_stepped_forward_still_recognises_a_retry(tmp_path: Path) -> None:
    # A new leader whose wall clock jumped hours ahead builds its table: the window counts back from the
    # log's newest record, not from that clock, so the retry of a batch written a moment ago is no append.
    clock = ManualClock()
    plog = _log(tmp_path, clock)
    plog.append(stamped(1, 0, NOW_MS), 1)
    jumped = ManualClock(wall_ms=NOW_MS + 3 * limits.PRODUCER_STATE_WINDOW_MS)
    assert _append(ProducerStates(jumped), Part(plog), [stamped(1, 0, NOW_MS)]) == Duplicate(0, 1)
    plog.close()


ops = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.booleans()), min_size=1, max_size=30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_rebuilt_and_live_tables_agree(tmp_path_factory, steps) -> None:
    clock = ManualClock()
    plog = _log(tmp_path_factory.mktemp("idem"), clock)
    live = ProducerStates(clock)
    part = Part(plog)
    next_seq = {pid: 0 for pid in range(4)}
    sent: list[tuple[int, int, int]] = []
    for pid, n, retry in steps:
        if retry and sent:
            p, s, c = sent[-1]
            got = _append(live, part, [batch(p, s, c)])
            assert isinstance(got, Duplicate)
        else:
            got = _append(live, part, [batch(pid, next_seq[pid], n)])
            assert isinstance(got, tuple)
            sent.append((pid, next_seq[pid], n))
            next_seq[pid] += n
    end = plog.end_offset
    assert end == sum(c for _, _, c in sent)  # nothing was written twice
    rebuilt = ProducerStates(clock)
    for p, s, c in sent[-limits.PRODUCER_BATCHES_KEPT:]:
        assert _append(rebuilt, Part(plog, epoch=3), [batch(p, s, c)]) == \
            _append(live, part, [batch(p, s, c)])
    assert plog.end_offset == end
    plog.close()
