"""The ranges a broker holds for other brokers' partitions, on its own disk.

Under ``<data_dir>/ranges/<topic>/<partition>/`` each range is one closed
segment file named by its base offset (``ring.log.segment``: the stored
batches exactly as the partition's leader has them, with the two sparse
indexes rebuilt beside it) and a ``.range`` file saying what it must be (end
offset, size, checksum, newest timestamp, the topic's creation time). A copy
arrives as a ``.part`` file, written as its bytes come in and hashed on the
way (``IncomingCopy``); only a whole copy whose size and checksum match, and
whose every batch passes its CRC and follows the one before, is fsynced and
renamed into place, its ``.range`` file first. So a range in the store is
always whole and verified; a crash leaves at most a ``.part`` file, removed
at the next open.

Reads go through ``Segment.read``, which checks each batch's CRC again: a
damaged batch is never served, and the damaged copy is dropped (``drop``),
so the partition's leader has it copied again from a good holder. The
checksum is over the range's bytes: ``scrub`` reads a copy whole and
compares (anti-entropy among holders).
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import orjson

from ring import limits
from ring.errors import BadRequest, CorruptBatch, StorageError
from ring.log.fsync import fsync_dir, mkdir_durable, write_all, write_atomically
from ring.log.segment import LOG_SUFFIX, Segment, segment_name
from ring.log.walking import check_identity, walk

log = logging.getLogger("ring.ranges")

META_SUFFIX = ".range"
PART_SUFFIX = ".part"
START_FILE = "start"  # the partition's start offset as its leader last said: nothing below is served
DIGEST_BYTES = 20

Key = tuple[str, int]


def new_hash():  # type: ignore[no-untyped-def]
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


@dataclass(frozen=True)
class Meta:
    base: int
    end: int
    size: int
    checksum: str
    max_timestamp: int
    created_ms: int  # the topic's creation time: which incarnation of the name it belongs to


class Held:
    __slots__ = ("meta", "segment")

    def __init__(self, meta: Meta, segment: Segment) -> None:
        self.meta = meta
        self.segment = segment


class RangeStore:
    def __init__(self, root: Path, index_interval: int = limits.INDEX_INTERVAL_BYTES) -> None:
        self.root = root
        self.interval = index_interval
        self._held: dict[Key, dict[int, Held]] = {}
        self._bases: dict[Key, list[int]] = {}
        self._starts: dict[Key, int] = {}
        self.bytes = 0
        self.dropped = 0  # copies found damaged (read or scrub) and removed

    def directory(self, key: Key) -> Path:
        return self.root / key[0] / str(key[1])

    # --- opening and closing ------------------------------------------------------------

    def open(self) -> None:
        """Load every whole range; remove what a crash left half written."""
        mkdir_durable(self.root)
        for tdir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for pdir in sorted(p for p in tdir.iterdir() if p.is_dir() and p.name.isdigit()):
                self._open_partition((tdir.name, int(pdir.name)), pdir)

    def _open_partition(self, key: Key, pdir: Path) -> None:
        for stray in pdir.glob("*" + PART_SUFFIX):
            stray.unlink(missing_ok=True)
        try:
            self._starts[key] = int((pdir / START_FILE).read_bytes())
        except (OSError, ValueError):
            pass
        for meta_path in sorted(pdir.glob("*" + META_SUFFIX)):
            try:
                meta = Meta(**orjson.loads(meta_path.read_bytes()))
                if not (pdir / (segment_name(meta.base) + LOG_SUFFIX)).stat().st_size == meta.size:
                    raise ValueError("its segment is not the size the range says")
                seg = Segment.load(pdir, meta.base, self.interval, meta.end)
            except (OSError, ValueError, TypeError, CorruptBatch) as exc:
                log.error("dropping range %s of %s/%d: %s", meta_path.name, key[0], key[1], exc)
                self._remove_files(pdir, int(meta_path.stem) if meta_path.stem.isdigit() else -1, meta_path)
                continue
            self._add(key, Held(meta, seg))

    def close(self) -> None:
        for held in self._held.values():
            for h in held.values():
                h.segment.close()
        self._held.clear()
        self._bases.clear()
        self.bytes = 0

    # --- lookups --------------------------------------------------------------------------

    def keys(self) -> list[Key]:
        return sorted(set(self._held) | set(self._starts))

    def ranges(self, key: Key) -> list[Meta]:
        held = self._held.get(key, {})
        return [held[b].meta for b in self._bases.get(key, [])]

    def get(self, key: Key, base: int) -> Meta | None:
        h = self._held.get(key, {}).get(base)
        return h.meta if h is not None else None

    def start(self, key: Key) -> int:
        return self._starts.get(key, 0)

    def set_start(self, key: Key, start: int) -> None:
        """The partition starts at ``start`` (never back): offsets below are not served from here."""
        if start <= self._starts.get(key, 0):
            return
        d = self.directory(key)
        mkdir_durable(d)
        write_atomically(d / START_FILE, b"%d" % start)
        self._starts[key] = start
        for meta in self.ranges(key):
            if meta.end <= start:
                self.drop(key, meta.base, "below its partition's start")

    def find(self, key: Key, offset: int) -> Meta | None:
        """The held range holding ``offset`` (at or past the partition's start), or None."""
        bases = self._bases.get(key)
        if not bases or offset < self._starts.get(key, 0):
            return None
        i = bisect.bisect_right(bases, offset) - 1
        if i < 0:
            return None
        meta = self._held[key][bases[i]].meta
        return meta if offset < meta.end else None

    # --- reading ------------------------------------------------------------------------------

    def read(self, key: Key, offset: int, max_bytes: int) -> bytes | None:
        """Whole checked batches from the held range holding ``offset`` up to its end (at least one
        batch); None when no held range has it. A damaged batch drops the copy (StorageError)."""
        meta = self.find(key, offset)
        if meta is None:
            return None
        seg = self._held[key][meta.base].segment
        try:
            pos, h = seg.find_position(offset)
            data, _, _ = seg.read(pos, h.base_offset, max_bytes, meta.end, True, None)
        except (CorruptBatch, OSError) as exc:
            self.drop(key, meta.base, f"damaged near offset {offset}: {exc}")
            raise StorageError(f"the copy of range {meta.base}-{meta.end} of {key[0]}/{key[1]} here is damaged; "
                               "it is dropped and copied again", offset=offset) from None
        return data

    def chunks(self, key: Key, base: int) -> Iterator[bytes]:
        """The raw bytes of a held range, ``RANGE_CHUNK_BYTES`` at a time (a copy's source)."""
        h = self._held[key][base]
        pos, size, fd = 0, h.meta.size, h.segment.fd
        while pos < size:
            chunk = os.pread(fd, min(limits.RANGE_CHUNK_BYTES, size - pos), pos)
            if not chunk:
                raise StorageError(f"range {base} of {key[0]}/{key[1]} ends early at byte {pos}")
            pos += len(chunk)
            yield chunk

    def first_offset_at(self, key: Key, base: int, timestamp_ms: int) -> int | None:
        h = self._held[key][base]
        try:
            return h.segment.first_record_at_or_after(timestamp_ms, h.meta.base, h.meta.end)
        except (CorruptBatch, OSError) as exc:
            self.drop(key, base, f"damaged: {exc}")
            raise StorageError(f"the copy of range {base} of {key[0]}/{key[1]} here is damaged") from None

    def scrub(self, key: Key, base: int) -> bool:
        """Read a held copy whole and compare its checksum (blocking: run it in a thread); whether it
        is sound. A damaged one is not dropped here: the caller does it on its loop."""
        h = self._held.get(key, {}).get(base)
        if h is None:
            return True
        hasher = new_hash()
        try:
            for chunk in self.chunks(key, base):
                hasher.update(chunk)
        except (OSError, StorageError):
            return False
        return hasher.hexdigest() == h.meta.checksum

    # --- writing --------------------------------------------------------------------------------

    def incoming(self, key: Key, meta: Meta) -> IncomingCopy:
        d = self.directory(key)
        mkdir_durable(d)
        return IncomingCopy(self, key, meta)

    def install(self, key: Key, meta: Meta) -> None:
        """Take a range ``IncomingCopy.finish`` put in place (a copy of the same base is replaced)."""
        old = self._held.get(key, {}).get(meta.base)
        if old is not None and old.meta == meta:
            return
        if old is not None:
            self._forget(key, meta.base)
            old.segment.close()
        seg = Segment.load(self.directory(key), meta.base, self.interval, meta.end)
        self._add(key, Held(meta, seg))

    def drop(self, key: Key, base: int, why: str) -> None:
        h = self._held.get(key, {}).get(base)
        if h is None:
            return
        log.warning("dropping range %d-%d of %s/%d: %s", base, h.meta.end, key[0], key[1], why)
        if why.startswith("damaged"):
            self.dropped += 1
        self._forget(key, base)
        h.segment.close()
        self._remove_files(self.directory(key), base, None)

    def drop_partition(self, key: Key, why: str) -> None:
        for base in list(self._bases.get(key, [])):
            self.drop(key, base, why)
        self._starts.pop(key, None)
        shutil.rmtree(self.directory(key), ignore_errors=True)

    def _add(self, key: Key, h: Held) -> None:
        self._held.setdefault(key, {})[h.meta.base] = h
        bisect.insort(self._bases.setdefault(key, []), h.meta.base)
        self.bytes += h.meta.size

    def _forget(self, key: Key, base: int) -> None:
        h = self._held[key].pop(base)
        self._bases[key].remove(base)
        self.bytes -= h.meta.size
        if not self._held[key]:
            del self._held[key], self._bases[key]

    @staticmethod
    def _remove_files(d: Path, base: int, meta_path: Path | None) -> None:
        if base >= 0:
            for seg_path in Segment.paths(d, base):
                seg_path.unlink(missing_ok=True)
            (d / (segment_name(base) + META_SUFFIX)).unlink(missing_ok=True)
        if meta_path is not None:
            meta_path.unlink(missing_ok=True)
        try:
            fsync_dir(d)
        except OSError:
            pass


class IncomingCopy:
    """One copy arriving: bytes written and hashed as they come, checked whole by ``finish``."""

    def __init__(self, store: RangeStore, key: Key, meta: Meta) -> None:
        self.store, self.key, self.meta = store, key, meta
        d = store.directory(key)
        self.part = d / (segment_name(meta.base) + PART_SUFFIX)
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.hasher = new_hash()
        self.written = 0

    def write(self, chunk: bytes) -> None:
        if self.written + len(chunk) > self.meta.size:
            raise BadRequest(f"the range is {self.meta.size} bytes; more came")
        write_all(self.fd, chunk)
        self.hasher.update(chunk)
        self.written += len(chunk)

    def finish(self) -> None:
        """Check the whole copy and put it in place, durably (blocking: run it in a thread). Raises
        BadRequest when the bytes are not the range asked for; the ``.part`` file is gone either way."""
        try:
            meta = self.meta
            if self.written != meta.size:
                raise BadRequest(f"the copy has {self.written} bytes, the range {meta.size}")
            if self.hasher.hexdigest() != meta.checksum:
                raise BadRequest(f"the copy's checksum {self.hasher.hexdigest()} is not the range's {meta.checksum}")
            expected = meta.base
            try:
                for h, _ in walk(self.fd, 0, meta.size, verify=True):
                    check_identity(h, expected, None)
                    expected = h.next_offset
            except CorruptBatch as exc:
                raise BadRequest(f"the copy of range {meta.base}-{meta.end} does not parse: {exc.message}") from None
            if expected != meta.end:
                raise BadRequest(f"the copy ends at offset {expected}, the range at {meta.end}")
            os.fsync(self.fd)
            d = self.part.parent
            write_atomically(d / (segment_name(meta.base) + META_SUFFIX), orjson.dumps(asdict(meta)))
            for stale in Segment.paths(d, meta.base)[1:]:
                stale.unlink(missing_ok=True)  # indexes of an older copy: rebuilt for this one
            os.replace(self.part, d / (segment_name(meta.base) + LOG_SUFFIX))
            fsync_dir(d)
        finally:
            self.abort()

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.part.unlink(missing_ok=True)
