"""Unit tests of the partition log (ring/log): real files in a temporary directory, a ManualClock."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ring.clock import ManualClock
from ring.errors import Conflict, CorruptBatch, OffsetOutOfRange, StorageError
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B

T0 = 1_700_000_000_000


def cfg(**kw) -> LogConfig:
    kw.setdefault("segment_bytes", 1024)
    kw.setdefault("index_interval_bytes", 128)
    kw.setdefault("fsync", FsyncPolicy("never"))
    return LogConfig(**kw)


def mk(path: Path, clock: ManualClock | None = None, **kw) -> PartitionLog:
    return PartitionLog(path, cfg(**kw), clock or ManualClock(T0))


def recs(n: int, ts: int = T0, tag: str = "r", size: int = 20):
    return [(ts + i, f"{tag}{i}".encode(), bytes([i % 251]) * size, None) for i in range(n)]


def put(log: PartitionLog, n: int = 3, ts: int = T0, epoch: int = 0, tag: str = "r", codec: int = 0, size: int = 20):
    return log.append(B.encode(recs(n, ts, tag, size), now_ms=ts, codec=codec), epoch)


def decode_all(data: bytes) -> list[B.Record]:
    out = []
    for _, pos in B.scan(data):
        out.extend(B.decode(data, pos)[1])
    return out


def headers(data: bytes) -> list[B.BatchHeader]:
    return [h for h, _ in B.scan(data)]


def log_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.log"))


def everything(log: PartitionLog) -> list[B.Record]:
    """All records from start_offset to the end, read in small steps."""
    out, off = [], log.start_offset
    while off < log.end_offset:
        data = log.read(off, 200)
        got = decode_all(data)
        assert got and got[0].offset <= off
        out.extend(r for r in got if r.offset >= off)
        off = headers(data)[-1].next_offset
    return out


# --- configuration -------------------------------------------------------------


def test_fsync_policy_parse():
    assert FsyncPolicy.parse("always") == FsyncPolicy("always", 0)
    assert FsyncPolicy.parse("never").mode == "never"
    assert FsyncPolicy.parse("interval") == FsyncPolicy("interval", 1000)
    assert FsyncPolicy.parse("interval:250") == FsyncPolicy("interval", 250)
    assert FsyncPolicy.parse(" Interval:5 ").interval_ms == 5
    assert str(FsyncPolicy.parse("interval:250")) == "interval:250"
    for bad in ["", "sometimes", "interval:", "interval:0", "interval:-5", "interval:x", "always:3"]:
        with pytest.raises(ValueError):
            FsyncPolicy.parse(bad)


def test_log_config_validates():
    assert LogConfig().fsync == FsyncPolicy("interval", 1000)
    assert LogConfig(codec="zstd").codec_id == B.CODEC_ZSTD
    for bad in [dict(segment_bytes=10), dict(codec="gzip"), dict(retention_ms=0), dict(retention_bytes=-2),
                dict(index_interval_bytes=-1)]:
        with pytest.raises(ValueError):
            LogConfig(**bad)


# --- appending -----------------------------------------------------------------


def test_new_log_is_empty_and_clean(tmp_path):
    log = mk(tmp_path / "p0")
    assert (log.start_offset, log.end_offset, log.size_bytes) == (0, 0, 0)
    assert log.clean_shutdown and log.recovered_bytes_cut == 0
    assert log.read(0, 100) == b""
    assert log.epochs() == [] and log.latest_epoch == -1
    assert [p.name for p in log_files(tmp_path / "p0")] == ["00000000000000000000.log"]


def test_append_stamps_offsets_and_epoch(tmp_path):
    log = mk(tmp_path)
    h1 = put(log, 3, epoch=2)
    h2 = put(log, 2, epoch=2)
    assert (h1.base_offset, h1.leader_epoch, h1.record_count) == (0, 2, 3)
    assert (h2.base_offset, h2.last_offset) == (3, 4)
    assert log.end_offset == 5
    assert log.size_bytes == h1.size + h2.size == sum(p.stat().st_size for p in log_files(tmp_path))
    assert log.unsynced_bytes == log.size_bytes
    got = decode_all(log.read(0, 10_000))
    assert [r.offset for r in got] == [0, 1, 2, 3, 4]
    assert [r.key for r in got] == [b"r0", b"r1", b"r2", b"r0", b"r1"]
    assert [h.leader_epoch for h in headers(log.read(0, 10_000))] == [2, 2]


def test_append_refuses_bad_batches_and_old_epochs(tmp_path):
    log = mk(tmp_path)
    put(log, 1, epoch=5)
    bad = B.encode(recs(2), now_ms=T0)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptBatch):
        log.append(bad, 5)
    with pytest.raises(CorruptBatch):
        log.append(B.encode(recs(2), now_ms=T0) + b"extra", 5)
    with pytest.raises(Conflict, match="epoch 4"):
        log.append(B.encode(recs(2), now_ms=T0), 4)
    assert log.end_offset == 1 and log.epochs() == [(5, 0)]


def test_segments_roll_at_segment_bytes(tmp_path):
    log = mk(tmp_path, segment_bytes=1024)
    sizes = [put(log, 2, tag=f"b{i}").size for i in range(30)]
    files = log_files(tmp_path)
    assert len(files) == log.segment_count > 3
    assert all(f.stat().st_size <= 1024 for f in files)
    assert sum(f.stat().st_size for f in files) == sum(sizes) == log.size_bytes
    # File names are the zero-padded base offsets, and every batch is in the right one.
    for f in files:
        data = f.read_bytes()
        assert headers(data)[0].base_offset == int(f.stem) and len(f.stem) == 20
    # A batch bigger than a segment goes alone into a segment of its own.
    big = put(log, 1, size=3000)
    assert log_files(tmp_path)[-1].stat().st_size == big.size
    put(log, 1)
    assert headers(log_files(tmp_path)[-1].read_bytes())[0].base_offset == big.next_offset
    assert [r.offset for r in everything(log)] == list(range(log.end_offset))
    # Reopened, closed segments hold one descriptor each (their indexes none).
    count, end = log.segment_count, log.end_offset
    log.close()
    fds_before = len(os.listdir("/proc/self/fd"))
    log = mk(tmp_path, segment_bytes=1024)
    assert len(os.listdir("/proc/self/fd")) - fds_before == count
    assert [r.offset for r in everything(log)] == list(range(end))


# --- reading -------------------------------------------------------------------


def test_read_returns_whole_batches_from_the_one_holding_offset(tmp_path):
    log = mk(tmp_path, segment_bytes=2048)
    hs = [put(log, 4, tag=f"b{i}") for i in range(40)]
    size = hs[0].size
    for offset in (0, 1, 5, 7, 42, 159):
        data = log.read(offset, 3 * size)
        got = headers(data)
        assert got[0].base_offset <= offset < got[0].next_offset
        assert 1 <= len(got) <= 3 and len(data) <= 3 * size
        assert [h.base_offset for h in got] == list(range(got[0].base_offset, got[-1].next_offset, 4))
    # At least one whole batch even when max_bytes is tiny.
    assert len(headers(log.read(10, 1))) == 1
    # A read runs across segment boundaries when the budget allows.
    data = log.read(0, log.size_bytes)
    assert len(data) == log.size_bytes and log.segment_count > 2
    assert log.read(log.end_offset, 1000) == b""


def test_read_never_returns_a_batch_at_or_above_upto(tmp_path):
    log = mk(tmp_path)
    for i in range(20):
        put(log, 3, tag=f"b{i}")
    for upto in range(0, 61, 7):
        for offset in range(0, 60, 5):
            data = log.read(offset, 10_000, upto=upto)
            if offset >= upto:
                assert data == b""
            else:
                assert data and all(h.base_offset < upto for h in headers(data))
                assert headers(data)[-1].next_offset >= min(upto, 60)


def test_offset_out_of_range_names_earliest(tmp_path):
    log = mk(tmp_path)
    for i in range(30):
        put(log, 2, tag=f"b{i}")
    log.truncate_before(17)
    with pytest.raises(OffsetOutOfRange) as err:
        log.read(3, 100)
    assert err.value.extra == {"earliest": 17, "latest": 60}
    assert "17" in err.value.message and err.value.status == 416
    with pytest.raises(OffsetOutOfRange) as err:
        log.read(61, 100)
    assert err.value.extra["earliest"] == 17
    # The batch holding the start offset is returned whole (it begins below it).
    assert headers(log.read(17, 10))[0].base_offset == 16


def test_compression_codecs_round_trip_through_the_log(tmp_path):
    for codec in ("none", "zstd", "lz4"):
        log = mk(tmp_path / codec, codec=codec)
        want = []
        for i in range(10):
            rs = [(T0 + i, b"key", (b"value %d " % i) * 20, [("h", b"x"), ("n", None), ("h", b"y")]) for _ in range(5)]
            h = log.append(B.encode(rs, now_ms=T0, codec=log.config.codec_id), 1)
            assert h.codec == log.config.codec_id
            want.extend(rs)
        got = decode_all(log.read(0, 1 << 20))
        assert [(r.timestamp, r.key, r.value, r.headers) for r in got] == want
        assert [r.offset for r in got] == list(range(50))
        if codec != "none":
            assert log.size_bytes < sum(len(r[2]) for r in want)


# --- follower path -------------------------------------------------------------


def test_append_replicated_copies_the_leader_byte_for_byte(tmp_path):
    leader = mk(tmp_path / "leader", segment_bytes=4096)
    follower = mk(tmp_path / "follower", segment_bytes=1024)
    for i in range(25):
        put(leader, 3, epoch=1 if i < 10 else 3, tag=f"b{i}")
    off = 0
    while off < leader.end_offset:
        data = leader.read(off, 700)
        off = follower.append_replicated(data)
        assert off == headers(data)[-1].next_offset
    assert follower.read(0, 1 << 20) == leader.read(0, 1 << 20)
    assert follower.epochs() == leader.epochs() == [(1, 0), (3, 30)]
    assert follower.segment_count > leader.segment_count
    assert follower.append_replicated(b"") == follower.end_offset


def test_append_replicated_refuses_gaps_corruption_and_old_epochs(tmp_path):
    leader = mk(tmp_path / "leader")
    follower = mk(tmp_path / "follower")
    for i in range(6):
        put(leader, 2, epoch=2, tag=f"b{i}")
    first, rest = leader.read(0, 1), leader.read(2, 10_000)
    with pytest.raises(Conflict, match="expected 0") as err:
        follower.append_replicated(rest)
    assert err.value.extra == {"expected_offset": 0, "got_offset": 2}
    damaged = bytearray(first + rest)
    damaged[-3] ^= 1
    with pytest.raises(CorruptBatch):
        follower.append_replicated(damaged)
    assert follower.end_offset == 0 and follower.size_bytes == 0  # nothing half-written
    assert follower.append_replicated(first + rest) == 12
    older = B.encode(recs(1), now_ms=T0)
    B.stamp(older, 0, 12, 1)
    with pytest.raises(Conflict, match="epoch 1"):
        follower.append_replicated(older)


# --- timestamps ----------------------------------------------------------------


def brute_offset_for_timestamp(log: PartitionLog, ts: int) -> int | None:
    return next((r.offset for r in everything(log) if r.timestamp >= ts), None)


def test_offset_for_timestamp(tmp_path):
    log = mk(tmp_path, segment_bytes=1024, index_interval_bytes=100)
    ts = T0
    for i in range(60):
        # Mostly rising timestamps, with some going backwards within and across batches.
        rs = [(ts + (7 * i + 3 * j) % 11 - 5, b"k", b"v" * 10, None) for j in range(3)]
        log.append(B.encode(rs, now_ms=ts), 0)
        ts += 10
    assert log.segment_count > 2
    for target in range(T0 - 20, ts + 20, 3):
        assert log.offset_for_timestamp(target) == brute_offset_for_timestamp(log, target), target
    assert log.offset_for_timestamp(ts + 100) is None
    assert log.offset_for_timestamp(T0 - 1000) == 0
    log.truncate_before(50)
    assert log.offset_for_timestamp(T0 - 1000) == 50
    assert log.offset_for_timestamp(T0 - 1000, upto=40) is None
    log.close()
    log = mk(tmp_path, index_interval_bytes=100)
    for target in range(T0, ts, 17):
        assert log.offset_for_timestamp(target) == brute_offset_for_timestamp(log, target)


# --- durability ------------------------------------------------------------------


def test_sync_and_maybe_sync_follow_the_policy(tmp_path):
    clock = ManualClock(T0)
    log = mk(tmp_path / "i", clock, fsync=FsyncPolicy.parse("interval:250"))
    assert not log.maybe_sync()  # nothing to sync
    put(log)
    assert log.unsynced_bytes > 0
    assert not log.maybe_sync()
    clock.advance(0.2)
    assert not log.maybe_sync()
    clock.advance(0.06)
    assert log.maybe_sync() and log.unsynced_bytes == 0
    put(log)
    assert not log.maybe_sync()
    log.sync()
    assert log.unsynced_bytes == 0
    always = mk(tmp_path / "a", clock, fsync=FsyncPolicy("always"))
    put(always)
    assert always.maybe_sync() and not always.maybe_sync()
    never = mk(tmp_path / "n", clock, fsync=FsyncPolicy("never"))
    put(never)
    clock.advance(100)
    assert not never.maybe_sync() and never.unsynced_bytes > 0


def test_start_writeback_counts_what_it_covers_and_leaves_durability_to_sync(tmp_path):
    log = mk(tmp_path, fsync=FsyncPolicy.parse("interval:1000"))
    assert not log.writeback_due(1)
    put(log, n=50, size=1000)
    assert log.writeback_due(40_000) and not log.writeback_due(10**9)
    assert log.start_writeback() is (sys.platform == "linux")  # the kernel took the hint
    assert not log.writeback_due(1)
    assert log.unsynced_bytes > 0  # only sync makes anything durable
    put(log)
    assert log.writeback_due(1)
    log.close()
    assert not log.start_writeback()  # a closed log: nothing to do, no error


def test_close_marks_a_clean_shutdown_and_abandon_does_not(tmp_path):
    log = mk(tmp_path)
    put(log, epoch=3)
    log.close()
    log = mk(tmp_path)
    assert log.clean_shutdown and log.end_offset == 3 and log.epochs() == [(3, 0)]
    log.abandon()
    log = mk(tmp_path)
    assert not log.clean_shutdown and log.recovered_bytes_cut == 0 and log.end_offset == 3
    log.close()
    assert mk(tmp_path).clean_shutdown


def test_recovery_cuts_a_torn_tail_and_removes_strays(tmp_path):
    log = mk(tmp_path, segment_bytes=4096)
    for i in range(8):
        put(log, 2, tag=f"b{i}")
    log.sync()
    synced = log.end_offset
    last = put(log, 2, tag="late")
    log.abandon()
    active = log_files(tmp_path)[-1]
    with open(active, "r+b") as f:
        f.truncate(active.stat().st_size - 5)
    (tmp_path / "00000000000000000999.log").write_bytes(b"")  # an empty last segment
    (tmp_path / "00000000000000000003.log").write_bytes(b"")  # an empty segment in the middle: stray,
    (tmp_path / "00000000000000000003.index").write_bytes(b"")  # and its index goes with it
    (tmp_path / "00000000000000000500.index").write_bytes(b"junk")  # index without a segment
    (tmp_path / "log-start-offset.tmp").write_bytes(b"half")
    log = mk(tmp_path, segment_bytes=4096)
    assert not log.clean_shutdown
    # The empty segment 999 does not continue segment 0 (which ends at 16 once cut): dropped with the tail.
    assert log.end_offset == synced == last.base_offset
    assert log.recovered_bytes_cut == last.size - 5
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not any(n.endswith(".tmp") or n.startswith("00000000000000000500") or "999" in n for n in names)
    assert not any(n.startswith("00000000000000000003") for n in names)
    assert [r.offset for r in everything(log)] == list(range(synced))
    put(log, 1)
    assert log.end_offset == synced + 1


def test_recovery_rebuilds_missing_and_damaged_indexes(tmp_path):
    log = mk(tmp_path, segment_bytes=2048, index_interval_bytes=100)
    for i in range(50):
        put(log, 2, ts=T0 + 10 * i, tag=f"b{i}")
    want = everything(log)
    ts_answers = {t: log.offset_for_timestamp(t) for t in range(T0 - 5, T0 + 520, 13)}
    log.close()
    indexes = sorted(tmp_path.glob("*.index")) + sorted(tmp_path.glob("*.timeindex"))
    assert len(indexes) == 2 * len(log_files(tmp_path)) > 4
    originals = {p: p.read_bytes() for p in indexes}
    for p in indexes[::2]:
        p.unlink()
    indexes[1].write_bytes(b"\x00" * 7)  # not whole entries
    indexes[3].write_bytes(originals[indexes[3]][:12])  # a valid prefix of entries, closing entry lost
    for clean in (True, False):
        log = mk(tmp_path, segment_bytes=2048, index_interval_bytes=100)
        assert log.clean_shutdown is clean
        assert everything(log) == want
        assert {t: log.offset_for_timestamp(t) for t in ts_answers} == ts_answers
        assert {p: p.read_bytes() for p in indexes} == originals  # rebuilt exactly as appends made them
        if clean:
            log.abandon()
        else:
            log.close()


def test_crash_after_truncate_before_past_the_surviving_end_restarts_there(tmp_path):
    log = mk(tmp_path)
    for i in range(5):
        put(log, 2, tag=f"b{i}")
    log.sync()
    put(log, 2)
    log.truncate_before(12)
    log.abandon()
    active = log_files(tmp_path)[-1]
    with open(active, "r+b") as f:
        f.truncate(active.stat().st_size - 1)
    log = mk(tmp_path)
    assert (log.start_offset, log.end_offset, log.size_bytes) == (12, 12, 0)
    assert put(log).base_offset == 12


# --- damage in a closed segment ----------------------------------------------------


@pytest.mark.parametrize("where", ["payload", "crc", "base_offset", "epoch", "length"])
def test_a_flipped_bit_in_a_closed_segment_is_never_returned(tmp_path, where):
    """Choice: a read whose FIRST batch is damaged raises StorageError (local disk's fault, 500);
    a damaged batch later in a read ends the read before it (excluded), so the next read raises."""
    log = mk(tmp_path, segment_bytes=1024)
    for i in range(30):
        put(log, 2, epoch=1, tag=f"b{i}")
    log.close()
    first = log_files(tmp_path)[0]
    data = bytearray(first.read_bytes())
    hs = list(B.scan(data))
    victim, pos = hs[3]
    bit_at = {"payload": pos + 60, "crc": pos + 17, "base_offset": pos + 7, "epoch": pos + 11, "length": pos + 15}[where]
    data[bit_at] ^= 0x04
    first.write_bytes(bytes(data))
    log = mk(tmp_path, segment_bytes=1024)
    assert log.clean_shutdown and log.segment_count > 2  # closed segments are not re-verified at open
    before = log.read(0, 1 << 20)
    assert headers(before)[-1].next_offset == victim.base_offset  # stops short of the damage
    for offset in (victim.base_offset, victim.last_offset):
        with pytest.raises(StorageError, match="damaged") as err:
            log.read(offset, 1 << 20)
        assert err.value.status == 500
    # The other segments are still served.
    second = int(log_files(tmp_path)[1].stem)
    assert decode_all(log.read(second, 1 << 20))[-1].offset == log.end_offset - 1


# --- retention and truncation ------------------------------------------------------


def test_retention_by_age(tmp_path):
    clock = ManualClock(T0)
    log = mk(tmp_path, clock, retention_ms=60_000)
    for i in range(40):
        put(log, 2, ts=T0 + 1000 * i, tag=f"b{i}")  # records one second apart
    n_segments = log.segment_count
    assert n_segments > 4
    assert log.enforce_retention(clock.wall_ms()) == 0
    assert log.enforce_retention(None) == 0  # no time to judge by: nothing goes by age
    clock.advance(60 + 15)  # records older than T0 + 15 s are now past retention
    assert log.enforce_retention(None) == 0
    deleted = log.enforce_retention(clock.wall_ms())
    assert 0 < deleted < n_segments
    assert log.segment_count == n_segments - deleted
    first_kept = int(log_files(tmp_path)[0].stem)
    assert log.start_offset == first_kept > 0
    # The first kept segment holds a record within retention.
    assert max(h.max_timestamp for h in headers(log_files(tmp_path)[0].read_bytes())) >= T0 + 15_000
    with pytest.raises(OffsetOutOfRange) as err:
        log.read(0, 100)
    assert err.value.extra["earliest"] == first_kept
    clock.advance(10_000)
    log.enforce_retention(clock.wall_ms())
    assert log.segment_count == 1  # the active segment is never deleted
    assert log.read(log.start_offset, 100)
    log.close()
    assert mk(tmp_path, clock).start_offset == log.start_offset


def test_retention_by_size_and_upto(tmp_path):
    log = mk(tmp_path, retention_bytes=3000)
    for i in range(60):
        put(log, 2, tag=f"b{i}")
    total, count = log.size_bytes, log.segment_count
    hw = int(log_files(tmp_path)[2].stem)
    assert log.enforce_retention(None, upto=hw) == 2  # only segments wholly below the high watermark
    deleted = log.enforce_retention(None)
    assert deleted > 0 and log.segment_count == count - 2 - deleted
    assert 3000 <= log.size_bytes < 3000 + 1024  # keeps at least retention_bytes, drops whole segments
    assert log.size_bytes == sum(p.stat().st_size for p in log_files(tmp_path)) < total
    assert log.start_offset == int(log_files(tmp_path)[0].stem)


def test_a_start_moved_by_retention_survives_a_crash_that_kept_the_deleted_files(tmp_path):
    log = mk(tmp_path, retention_bytes=3000)
    for i in range(60):
        put(log, 2, tag=f"b{i}")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert log.enforce_retention(None) > 0
    start = log.start_offset
    log.abandon()
    for name, data in before.items():  # the deletions never reached the disk
        if not (tmp_path / name).exists():
            (tmp_path / name).write_bytes(data)
    reopened = mk(tmp_path)
    assert reopened.start_offset == start > 0
    with pytest.raises(OffsetOutOfRange):
        reopened.read(0, 100)


def test_truncate_before_survives_reopen(tmp_path):
    log = mk(tmp_path)
    for i in range(40):
        put(log, 2, epoch=1 if i < 20 else 2, tag=f"b{i}")
    count = log.segment_count
    log.truncate_before(45)
    assert log.start_offset == 45 and log.segment_count < count
    assert int(log_files(tmp_path)[0].stem) <= 45
    assert log.epochs() == [(2, 45)]
    with pytest.raises(OffsetOutOfRange):
        log.read(44, 10)
    log.truncate_before(10)  # lower: no change
    assert log.start_offset == 45
    with pytest.raises(OffsetOutOfRange):
        log.truncate_before(81)
    log.abandon()
    log = mk(tmp_path)
    assert (log.start_offset, log.end_offset) == (45, 80)
    assert everything(log)[0].offset == 45
    log.close()
    log = mk(tmp_path)
    assert log.start_offset == 45
    log.truncate_before(80)
    assert log.start_offset == log.end_offset == 80 and log.read(80, 10) == b""
    assert put(log, epoch=2).base_offset == 80


def test_truncate_after_rounds_down_to_a_batch_start(tmp_path):
    log = mk(tmp_path)
    for i in range(30):
        put(log, 3, epoch=i // 10, tag=f"b{i}")
    assert log.epochs() == [(0, 0), (1, 30), (2, 60)]
    log.truncate_after(65)  # inside the batch [63, 66): it goes whole
    assert log.end_offset == 63 and log.epochs() == [(0, 0), (1, 30), (2, 60)]
    log.truncate_after(60)
    assert log.end_offset == 60 and log.epochs() == [(0, 0), (1, 30)]
    assert log.end_offset_for_epoch(0) == (0, 30) and log.end_offset_for_epoch(5) == (1, 60)
    log.truncate_after(12)
    assert log.end_offset == 12 and log.epochs() == [(0, 0)]
    assert log.size_bytes == sum(p.stat().st_size for p in log_files(tmp_path))
    assert [r.offset for r in everything(log)] == list(range(12))
    assert put(log, epoch=4).base_offset == 12
    log.abandon()
    log = mk(tmp_path)
    assert log.end_offset == 15 and log.epochs() == [(0, 0), (4, 12)]
    log.truncate_before(9)
    log.truncate_after(7)  # below the start: the log empties and restarts there
    assert (log.start_offset, log.end_offset, log.epochs(), log.size_bytes) == (7, 7, [], 0)
    log.close()
    log = mk(tmp_path)
    assert (log.start_offset, log.end_offset) == (7, 7)
    assert put(log, epoch=5).base_offset == 7


def test_sync_in_another_thread_while_appending_and_deleting(tmp_path):
    """The broker runs sync() in an executor thread while its loop appends (group commit)."""
    import threading

    log = mk(tmp_path, segment_bytes=1024, retention_bytes=4096)
    stop, errors, syncs = threading.Event(), [], [0]

    def syncer():
        while not stop.is_set():
            try:
                log.sync()
                syncs[0] += 1
            except Exception as exc:  # reported below: any failure fails the test
                errors.append(exc)
                return

    thread = threading.Thread(target=syncer)
    thread.start()
    try:
        for i in range(400):
            put(log, 2, tag=f"b{i}")
            if i % 25 == 0:
                log.enforce_retention(T0)
            if i == 300:
                log.truncate_after(log.end_offset - 5)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors and syncs[0] > 0 and not thread.is_alive()
    end, start = log.end_offset, log.start_offset
    log.sync()
    assert log.unsynced_bytes == 0
    log.abandon()
    log = mk(tmp_path, segment_bytes=1024)
    assert (log.start_offset, log.end_offset, log.recovered_bytes_cut) == (start, end, 0)
    assert [r.offset for r in everything(log)] == list(range(start, end))
