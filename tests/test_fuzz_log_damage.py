"""A damaged partition directory never makes the log hand out a wrong record.

Each example writes batches into a real ``PartitionLog`` (small segments and
index intervals, so there are several of each), closes it cleanly or
abandons it as a crash would, then damages the directory: bits flipped,
bytes overwritten or inserted, whole valid batches grafted where they do not
belong, files cut short or extended, index files deleted, in random segment and index files (and, in one test, the small
checkpoint files). Then it reopens the log and reads every offset.

The contract: opening either succeeds (recovery may cut a damaged tail) or
raises ``StorageError``; every read either raises ``StorageError`` or returns
whole, CRC-valid batches whose records are exactly the ones written at those
offsets, with the epoch they were written in; a time lookup never points at a
record older than asked for. No other exception type, and no wrong data.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ring.clock import ManualClock
from ring.errors import CorruptBatch, StorageError
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B

T0 = 1_700_000_000_000
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=128, fsync=FsyncPolicy("never"))
DAMAGE_OK = (StorageError, CorruptBatch)


@dataclass(frozen=True)
class Written:
    timestamp: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes | None] | None
    epoch: int


records = st.lists(
    st.tuples(st.integers(0, 10_000), st.none() | st.binary(min_size=1, max_size=6), st.binary(max_size=40),
              st.none() | st.just({"h": b"x"})),
    min_size=1, max_size=4,
)
batches = st.lists(st.tuples(records, st.sampled_from([B.CODEC_NONE] * 3 + [B.CODEC_ZSTD, B.CODEC_LZ4]),
                             st.booleans()),  # bump the epoch before this batch?
                   min_size=1, max_size=25)


def write(log: PartitionLog, plan: list[tuple[list, int, bool]]) -> dict[int, Written]:
    model: dict[int, Written] = {}
    epoch = 1
    for recs, codec_id, bump in plan:
        epoch += bump
        stamped = [(T0 + ts, k, v, h) for ts, k, v, h in recs]
        h = log.append(B.encode(stamped, now_ms=T0, codec=codec_id), epoch)
        for i, (ts, k, v, hd) in enumerate(stamped):
            model[h.base_offset + i] = Written(ts, k, v, hd, epoch)
    return model


def damage(directory: Path, data: st.DataObject, with_checkpoints: bool) -> list[str]:
    """Apply 1-3 random kinds of damage; returns what was done (for the failure report)."""
    done = []
    # Grafts take whole batches from the segments as written, not from ones already damaged.
    pristine = {p.name: p.read_bytes() for p in sorted(directory.glob("*.log"))}
    for _ in range(data.draw(st.integers(1, 3), label="damages")):
        files = sorted(p for p in directory.iterdir()
                       if p.suffix in (".log", ".index", ".timeindex") or with_checkpoints)
        if not files:
            break
        path = data.draw(st.sampled_from(files), label="file")
        raw = bytearray(path.read_bytes())
        kind = data.draw(st.sampled_from(["flip", "flip", "overwrite", "cut", "insert", "extend", "delete", "graft"]),
                         label="kind")
        at = data.draw(st.integers(0, max(0, len(raw) - 1)), label="at")
        if kind == "flip" and raw:
            raw[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif kind == "overwrite" and raw:
            raw[at : at + 4] = data.draw(st.sampled_from([b"\0\0\0\0", b"\xff\xff\xff\xff", b"\0\0\0\x01"]))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="inserted")
        elif kind == "extend":
            raw += data.draw(st.binary(min_size=1, max_size=80), label="appended")
        elif kind == "graft":
            # A whole, CRC-valid batch from some segment, placed where it does not belong.
            donor = data.draw(st.sampled_from(sorted(pristine)), label="donor")
            blob = pristine[donor]
            if len(blob) >= B.HEADER_SIZE:
                size = B.read_header(blob).size
                raw[at:at] = blob[:size]
        elif kind == "delete" and path.suffix != ".log":
            path.unlink()
            done.append(f"delete {path.name}")
            continue
        path.write_bytes(bytes(raw))
        done.append(f"{kind} {path.name} at {at}")
    return done


def check_batches(data: bytes, model: dict[int, Written]) -> int:
    """Every batch in a read answer is whole, CRC-valid and exactly as written; returns the next offset."""
    next_offset = -1
    for h, pos in B.scan(data):  # verifies each CRC
        _, recs = B.decode(data, pos)
        for r in recs:
            w = model.get(r.offset)
            assert w is not None, f"offset {r.offset} was never written"
            # Headers written as a map (the layout of older batches) read back as its pairs, in order.
            assert (r.timestamp, r.key, r.value, r.headers) == (w.timestamp, w.key, w.value,
                                                                B.header_pairs(w.headers)), r.offset
            assert h.leader_epoch == w.epoch, (r.offset, h.leader_epoch, w.epoch)
        next_offset = h.next_offset
    assert next_offset >= 0, "a read below the end returned nothing"
    return next_offset


def read_everything(log: PartitionLog, model: dict[int, Written], max_bytes: int) -> set[int]:
    """Offsets that could be read; a StorageError at an offset moves on to the next one."""
    seen: set[int] = set()
    assert log.end_offset <= max(model, default=-1) + 1 or log.end_offset == log.start_offset
    off = log.start_offset
    for _ in range(2 * len(model) + 2):
        if off >= log.end_offset:
            break
        try:
            data = log.read(off, max_bytes)
        except StorageError:
            off += 1
            continue
        nxt = check_batches(data, model)
        assert nxt > off
        seen.update(range(off, nxt))
        off = nxt
    return seen


def check_time_lookups(log: PartitionLog, model: dict[int, Written]) -> None:
    for ts in sorted({w.timestamp for w in model.values()})[:5] + [T0 - 1, T0 + 20_000]:
        try:
            found = log.offset_for_timestamp(ts)
        except StorageError:
            continue
        if found is not None:
            assert found in model and log.start_offset <= found < log.end_offset
            assert model[found].timestamp >= ts, (ts, found)


def reopen_and_check(directory: Path, model: dict[int, Written], data: st.DataObject) -> dict[int, Written]:
    """Open, read everything, look up times, append one more record; the model with that record."""
    try:
        log = PartitionLog(directory, CONFIG, ManualClock(T0))
    except StorageError:
        return model
    try:
        read_everything(log, model, data.draw(st.sampled_from([1, 200, 1 << 20]), label="max_bytes"))
        check_time_lookups(log, model)
        # The reopened log takes new appends, and they read back.
        end, epoch = log.end_offset, max(log.latest_epoch, 1)
        try:
            h = log.append(B.encode([(T0, None, b"after", None)], now_ms=T0), epoch)
        except StorageError:
            return model
        assert h.base_offset == end
        model = {**{o: w for o, w in model.items() if o < end}, end: Written(T0, None, b"after", None, epoch)}
        try:
            check_batches(log.read(end, 1 << 20), model)
        except StorageError:
            pass
        log.sync()
        return model
    finally:
        log.abandon()


def _run(plan: list, clean: bool, data: st.DataObject, with_checkpoints: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="ring-damage-") as tmp:
        directory = Path(tmp) / "p"
        log = PartitionLog(directory, CONFIG, ManualClock(T0))
        model = write(log, plan)
        if clean:
            log.close()
        else:
            if data.draw(st.booleans(), label="synced before the crash"):
                log.sync()
            log.abandon()
        done = damage(directory, data, with_checkpoints)
        data.draw(st.just(done), label="damage done")
        model = reopen_and_check(directory, model, data)
        # Opened again (after a crash: abandoned), the directory recovery left must hold up as well.
        reopen_and_check(directory, model, data)


@SETTINGS
@given(batches, st.booleans(), st.data())
def test_damaged_segments_and_indexes_never_yield_wrong_records(plan: list, clean: bool, data: st.DataObject) -> None:
    _run(plan, clean, data, with_checkpoints=False)


@settings(SETTINGS, max_examples=30)
@given(batches, st.booleans(), st.data())
def test_damaged_checkpoint_files_never_yield_wrong_records(plan: list, clean: bool, data: st.DataObject) -> None:
    _run(plan, clean, data, with_checkpoints=True)


def test_undamaged_directory_reads_back_whole() -> None:
    """The checker itself: with no damage every offset is read and matches."""
    plan = [([(i, b"k", bytes([i]) * 30, None), (i + 1, None, b"v", {"h": b"x"})], i % 3, i % 4 == 0)
            for i in range(20)]
    with tempfile.TemporaryDirectory(prefix="ring-damage-") as tmp:
        log = PartitionLog(Path(tmp), CONFIG, ManualClock(T0))
        model = write(log, plan)
        log.close()
        assert len(os.listdir(tmp)) > 6  # several segments, each with two indexes
        log = PartitionLog(Path(tmp), CONFIG, ManualClock(T0))
        try:
            assert read_everything(log, model, 200) == set(model)
        finally:
            log.close()
