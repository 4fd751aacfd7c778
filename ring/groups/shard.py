"""The groups of one offsets partition, as the coordinator holds them: replay, checkpoints, records to write.

A coordinator owns every group whose name hashes to an offsets partition it
leads. ``Shard`` is that set of groups plus the bookkeeping that keeps replay
short: the offset where the latest complete checkpoint starts and how many
records were written since. Pure and synchronous: the driver hands it stored
batches to replay (``replay_batches``) and asks it for the records of events
to append (``records_for``); it never touches the log itself.

Checkpoints. Without compaction the offsets log only grows, so every
``GROUP_CHECKPOINT_RECORDS`` records (or ``GROUP_CHECKPOINT_INTERVAL_MS``,
which is well under the topic's retention) the coordinator writes a ``State``
event for every group it holds, leaving out groups that have been empty and
unused for ``GROUP_OFFSETS_RETENTION_MS``. Every record written after a
checkpoint carries its start offset in the ``ring-checkpoint`` header, so a
new coordinator reads the last record of the partition and replays from that
checkpoint: replay costs one checkpoint plus at most a checkpoint interval of
records, whatever the age of the log. Retention (by age, whole segments)
never deletes the latest checkpoint because checkpoints are younger than it.
"""

from __future__ import annotations

import logging

from ring import limits
from ring.errors import CorruptBatch
from ring.groups import codec
from ring.groups.classic import ClassicGroup
from ring.groups.group import Event, Group
from ring.log import batch as batchfmt
from ring.log.batch import RecordIn

log = logging.getLogger("ring.groups")


class Shard:
    def __init__(self, partition: int, now_ms: int) -> None:
        self.partition = partition
        self.groups: dict[str, Group] = {}
        # Kafka's classic membership of groups (``classic``): not persisted, so a new coordinator starts
        # with none and the members join again; their committed offsets are in ``groups``.
        self.classic: dict[str, ClassicGroup] = {}
        self.checkpoint: int | None = None  # where the latest complete checkpoint starts
        self.since_checkpoint = 0  # records after it
        self.checkpoint_ms = now_ms  # when it was written (or when this shard was loaded)
        self.skipped = 0  # records replay could not read

    # --- replay -----------------------------------------------------------------------------

    def replay_batches(self, data: bytes, start: int, now: float) -> int:
        """Apply the events in stored batches ``data`` from offset ``start`` on; the next offset."""
        next_offset = start
        for h, pos in batchfmt.scan(data, verify=False):  # the log checked every CRC on read
            if h.next_offset <= start:
                continue
            try:
                _, records = batchfmt.decode(data, pos, verify=False)
            except CorruptBatch as exc:
                log.error("offsets partition %d: batch at %d unreadable, skipped: %s",
                          self.partition, h.base_offset, exc.message)
                self.skipped += h.record_count
                next_offset = h.next_offset
                continue
            for rec in records:
                if rec.offset >= start:
                    self.replay_record(rec.offset, rec.key, rec.value, rec.headers, now)
            next_offset = h.next_offset
        return next_offset

    def replay_record(self, offset: int, key: bytes | None, value: bytes,
                      headers: list[tuple[str, bytes | None]] | None, now: float) -> None:
        try:
            if key is None:
                raise CorruptBatch("a record without a group name")
            name = key.decode("utf-8")
            event = codec.decode(value, headers)
        except (CorruptBatch, UnicodeDecodeError) as exc:
            log.error("offsets partition %d: record %d skipped: %s", self.partition, offset, exc)
            self.skipped += 1
            return
        self.group(name).apply(event, now)
        self.since_checkpoint += 1
        pointer = codec.checkpoint_of(headers)
        if pointer is not None and pointer != self.checkpoint:
            self.checkpoint, self.since_checkpoint = pointer, 0

    def group(self, name: str) -> Group:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = Group(name)
        return g

    # --- writing ----------------------------------------------------------------------------

    def records_for(self, name: str, events: list[Event], now_ms: int) -> list[RecordIn]:
        pointer = [] if self.checkpoint is None else [(codec.CHECKPOINT_HEADER, str(self.checkpoint).encode())]
        key = name.encode("utf-8")
        out: list[RecordIn] = []
        for e in events:
            ids = codec.ids_header(e)
            headers = pointer + ([ids] if ids is not None else [])
            out.append((now_ms, key, codec.encode(e), headers or None))
        return out

    def written(self, count: int) -> None:
        self.since_checkpoint += count

    def checkpoint_due(self, now_ms: int) -> bool:
        return bool(self.groups) and (
            self.since_checkpoint >= limits.GROUP_CHECKPOINT_RECORDS
            or now_ms - self.checkpoint_ms >= limits.GROUP_CHECKPOINT_INTERVAL_MS)

    def checkpoint_records(self, now_ms: int) -> tuple[list[RecordIn], list[str]]:
        """A ``State`` record for every group worth keeping, and the names of those forgotten."""
        records: list[RecordIn] = []
        forgotten: list[str] = []
        for name in sorted(self.groups):
            g = self.groups[name]
            kafka = self.classic.get(name)
            if kafka is not None and kafka.members:
                # A group of Kafka consumers is in use while it has members, committing or not: Kafka's
                # offsets expire once their group has been empty for the retention period.
                g.used_ms = max(g.used_ms, now_ms)
            if g.dropped or g.forgettable(now_ms):
                forgotten.append(name)
                continue
            records.extend(self.records_for(name, [g.snapshot()], now_ms))
        return records, forgotten

    def checkpointed(self, base_offset: int, forgotten: list[str], now_ms: int) -> None:
        """The checkpoint starting at ``base_offset`` is in the log: later records point at it."""
        for name in forgotten:
            self.groups.pop(name, None)
        self.checkpoint, self.since_checkpoint, self.checkpoint_ms = base_offset, 0, now_ms
