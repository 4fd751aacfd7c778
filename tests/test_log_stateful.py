"""A hypothesis state machine drives a real PartitionLog against an in-memory model.

The model is the list of records by offset, the batch boundaries, the start
offset and the leader-epoch history. Besides appends (leader and follower
paths), reads, time lookups and truncations, it crashes the log: the file
handles are dropped without ``close``, then the active segment is cut at a
random byte or has one random byte garbled, always after the last ``sync``.
Reopening must keep everything synced, cut exactly at the damaged batch (and
everything after it), and hand back only records equal to the model's. A
garbled payload that whole batches follow is damage, not a torn tail: the key
the log had is kept for its owner, and the newest epoch stays above the cut.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ring.clock import ManualClock
from ring.errors import StorageError
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.log import recovery

T0 = 1_700_000_000_000


def decode_all(data: bytes) -> list[B.Record]:
    out = []
    for _, pos in B.scan(data):
        out.extend(B.decode(data, pos)[1])
    return out


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ring-log-"))
        self.clock = ManualClock(T0)
        self.log: PartitionLog | None = None

    @initialize(segment_bytes=st.integers(1024, 2500), interval=st.integers(0, 400))
    def open_log(self, segment_bytes: int, interval: int) -> None:
        self.config = LogConfig(
            segment_bytes=segment_bytes, index_interval_bytes=interval, fsync=FsyncPolicy("never")
        )
        self.log = PartitionLog(self.dir, self.config, self.clock)
        self.records: dict[int, tuple] = {}  # offset -> (timestamp, key, value, headers)
        self.batches: list[tuple[int, int]] = []  # (base offset, next offset), in order
        self.start = self.end = self.synced_end = 0
        self.epoch = 0
        self.model_epochs: list[tuple[int, int]] = []

    def teardown(self) -> None:
        if self.log is not None:
            self.log.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- model helpers ---------------------------------------------------------

    def _records_in(self, n: int, vsize: int, jitter: int) -> list[tuple]:
        now = self.clock.wall_ms()
        return [
            (now + (i * jitter) % 7 - 3, f"k{self.end + i}".encode() if i % 2 else None, bytes([i]) * vsize,
             [("i", str(i).encode())] if i % 3 == 0 else None)
            for i in range(n)
        ]

    def _model_append(self, base: int, recs: list[tuple], epoch: int) -> None:
        if epoch > (self.model_epochs[-1][0] if self.model_epochs else -1):
            self.model_epochs = [(e, s) for e, s in self.model_epochs if s < base] + [(epoch, base)]
        for i, r in enumerate(recs):
            self.records[base + i] = r
        self.batches.append((base, base + len(recs)))
        self.end = base + len(recs)

    def _model_cut(self, end: int, keep_latest_epoch: bool = False) -> None:
        self.records = {o: r for o, r in self.records.items() if o < end}
        self.batches = [b for b in self.batches if b[0] < end]
        self.end = end
        kept = [(e, s) for e, s in self.model_epochs if s < end]
        if keep_latest_epoch and len(kept) < len(self.model_epochs):
            kept.append((self.model_epochs[-1][0], end))  # a crash does not make the epoch go backwards
        self.model_epochs = kept

    def _model_epochs_from(self, start: int) -> None:
        i = max((k for k, (_, s) in enumerate(self.model_epochs) if s <= start), default=-1)
        if i >= 0:
            self.model_epochs = [(self.model_epochs[i][0], start)] + self.model_epochs[i + 1 :]

    def _model_restart_empty(self, at: int) -> None:
        self.records, self.batches, self.model_epochs = {}, [], []
        self.start = self.end = at

    def _check_batches(self, data: bytes) -> list[B.BatchHeader]:
        hs = [h for h, _ in B.scan(data)]
        for a, b in zip(hs, hs[1:]):
            assert b.base_offset == a.next_offset
        for h in hs:
            assert (h.base_offset, h.next_offset) in self.batches
        for r in decode_all(data):
            assert (r.timestamp, r.key, r.value, r.headers) == self.records[r.offset], r.offset
        return hs

    # --- rules -------------------------------------------------------------------

    @rule(n=st.integers(1, 5), vsize=st.integers(0, 150), jitter=st.integers(0, 5), dt_ms=st.integers(0, 50),
          bump=st.booleans(), codec=st.sampled_from([0, 1, 2]))
    def append(self, n, vsize, jitter, dt_ms, bump, codec):
        self.clock.advance(dt_ms / 1000)
        self.epoch += bump
        recs = self._records_in(n, vsize, jitter)
        h = self.log.append(B.encode(recs, now_ms=self.clock.wall_ms(), codec=codec), self.epoch)
        assert (h.base_offset, h.record_count, h.leader_epoch) == (self.end, n, self.epoch)
        self._model_append(h.base_offset, recs, self.epoch)

    @rule(sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 200)), min_size=1, max_size=4),
          bump=st.booleans())
    def append_replicated(self, sizes, bump):
        self.epoch += bump
        parts, base = [], self.end
        for n, vsize in sizes:
            recs = self._records_in(n, vsize, 1)
            buf = B.encode(recs, now_ms=self.clock.wall_ms())
            B.stamp(buf, 0, base, self.epoch)
            parts.append(bytes(buf))
            self._model_append(base, recs, self.epoch)
            base += n
        assert self.log.append_replicated(b"".join(parts)) == self.end

    @rule(data=st.data())
    def read(self, data):
        offset = data.draw(st.integers(self.start, self.end), label="offset")
        max_bytes = data.draw(st.integers(1, 3000), label="max_bytes")
        upto = data.draw(st.none() | st.integers(self.start, self.end + 3), label="upto")
        got = self.log.read(offset, max_bytes, upto)
        hw = self.end if upto is None else min(upto, self.end)
        if offset >= hw:
            assert got == b""
            return
        hs = self._check_batches(got)
        assert hs[0].base_offset <= offset < hs[0].next_offset
        assert all(h.base_offset < hw for h in hs)
        assert len(hs) == 1 or len(got) <= max_bytes

    @rule(data=st.data())
    def offset_for_timestamp(self, data):
        target = data.draw(st.integers(T0 - 5, self.clock.wall_ms() + 5), label="timestamp")
        want = min((o for o, r in self.records.items() if o >= self.start and r[0] >= target), default=None)
        assert self.log.offset_for_timestamp(target) == want

    @rule()
    def sync(self):
        self.log.sync()
        assert self.log.unsynced_bytes == 0
        self.synced_end = self.end

    @rule(data=st.data())
    def truncate_before(self, data):
        offset = data.draw(st.integers(self.start, self.end), label="offset")
        self.log.truncate_before(offset)
        if offset > self.start:
            self.start = offset
            self._model_epochs_from(offset)

    @precondition(lambda self: self.end > self.start)
    @rule(data=st.data())
    def truncate_after(self, data):
        offset = data.draw(st.integers(self.start, self.end - 1), label="offset")
        self.log.truncate_after(offset)
        cut = next(b for b, n in self.batches if b <= offset < n)  # rounded down to its batch
        if cut < self.start:
            self._model_restart_empty(cut)
        else:
            self._model_cut(cut)
        self.synced_end = self.end  # truncate_after syncs

    @rule()
    def reopen_cleanly(self):
        self.log.close()
        self.log = PartitionLog(self.dir, self.config, self.clock)
        assert self.log.clean_shutdown and self.log.recovered_bytes_cut == 0
        self.synced_end = self.end

    @rule(data=st.data())
    def crash(self, data):
        self.log.abandon()
        active = sorted(self.dir.glob("*.log"))[-1]
        content = bytearray(active.read_bytes())
        spans = [(h, pos) for h, pos in B.scan(content)]  # the active segment is whole before the damage
        synced_pos = next((pos for h, pos in spans if h.base_offset >= self.synced_end), len(content))
        damage = data.draw(st.sampled_from(["none", "truncate", "garble"]), label="damage")
        cut_base = cut_bytes = None
        if damage != "none" and synced_pos < len(content):
            p = data.draw(st.integers(synced_pos, len(content) - 1), label="position")
            h, pos = next((h, pos) for h, pos in spans if pos <= p < pos + h.size)
            if damage == "garble" and h.next_offset <= self.start:
                p = pos + 20  # (below the start offset nothing is read: hit magic, which no walk passes)
            if damage == "garble" and 34 <= p - pos < 42:
                # A kept batch's max timestamp indexes its segment as it reads (recovery's docstring): a flip
                # there can mislead time lookups in that segment until its indexes are built again.
                p = pos + B.HEADER_SIZE + (p - pos) % (h.size - B.HEADER_SIZE)
            original = bytes(content[pos:pos + h.size])
            cut_base = h.base_offset
            xor = 0
            if damage == "truncate":
                del content[p:]
                cut_bytes = p - pos
            else:
                xor = data.draw(st.integers(1, 255), label="xor")
                content[p] ^= xor
                cut_bytes = len(content) - pos
            # A garbled batch whole ones follow, its magic and record count intact and its length too (or
            # one bit off): the walk steps past it, and recovery keeps it for a repair (here: the original
            # bytes) to mend.
            field = p - pos
            kept = damage == "garble" and h.next_offset < self.end and field not in (20, 22, 23, 24, 25) and (
                field not in (12, 13, 14, 15) or xor & (xor - 1) == 0)
            active.write_bytes(bytes(content))
        self.log = PartitionLog(self.dir, self.config, self.clock)
        assert not self.log.clean_shutdown
        if cut_base is not None and kept:
            assert self.log.end_offset == self.end and self.log.recovered_bytes_cut == 0
            assert self.log.recovered_damage == max(cut_base, self.start)
            assert recovery.damaged_key(self.dir) is None
            with pytest.raises(StorageError):
                self.log.read(max(cut_base, self.start), 2000)  # never handed out
            self.log.mend(original)
        elif cut_base is None:
            assert self.log.end_offset == self.end and self.log.recovered_bytes_cut == 0
        else:
            assert self.log.recovered_bytes_cut == cut_bytes
            # A torn tail vouches for nothing; a payload bit of a batch that whole ones follow is damage,
            # and recovery keeps the key the log had (the replica takes it, as steps.restore does).
            lost = recovery.damaged_key(self.dir)
            recovery.forget_damaged_key(self.dir)
            if damage == "truncate":
                assert lost is None
            elif p - pos >= B.HEADER_SIZE and h.next_offset < self.end:
                epoch = max(e for e, s in self.model_epochs if s <= self.end)
                assert lost == (epoch, self.end)
            # Cut at the damaged batch; if that is below the start offset, the log restarts empty there.
            # The newest epoch moves down to the cut after a torn tail, not over damage.
            self._model_cut(max(cut_base, self.start), keep_latest_epoch=lost is None)
            if cut_base < self.start:
                self.records, self.batches = {}, []
            self._model_epochs_from(self.start)
        assert self.log.end_offset >= self.synced_end
        self.synced_end = self.end  # recovery syncs what it kept
        # Everything still held reads back exactly as the model has it.
        offset = self.start
        while offset < self.end:
            hs = self._check_batches(self.log.read(offset, 2000))
            offset = hs[-1].next_offset
        assert offset == self.end

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def offsets_and_sizes_agree(self):
        if self.log is None:
            return
        assert (self.log.start_offset, self.log.end_offset) == (self.start, self.end)
        assert self.log.epochs() == self.model_epochs
        assert self.log.size_bytes == sum(p.stat().st_size for p in self.dir.glob("*.log"))
        assert all(p.stat().st_size <= self.config.segment_bytes for p in self.dir.glob("*.log"))


LogMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPartitionLogStateful = LogMachine.TestCase
