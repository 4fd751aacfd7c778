"""Reading offsets that live in ranges: fetches, offsets by timestamp, the ranges a partition has.

A replica's log starts at its local tail; below it, down to the
partition's earliest offset, the offsets are in ranges on other brokers.
``route`` decides for a fetch there: answered from this broker's own copy
of the range when it holds one, else the live holders' client URLs, which
the fetch path proxies to as it proxies to replicas (the answer keeps its
shape; the high watermark is this replica's). Ranges are committed closed
segments, so a fetch in one never waits and never sees an uncommitted
offset. A broker that holds a range but no replica of its partition
answers fetches in it from its copy (``held``), which is what the Python
client and sparkio ask when they read straight from the holders; any other
fetch it gets goes to a replica as before. A copy that fails a CRC check is
dropped on the spot and the read goes to another holder.

Only an offset below the local log start comes here (one comparison on the
fetch path): a fetch of a local offset costs nothing more.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import orjson

from ring.catalog import TopicConfig
from ring.errors import OffsetOutOfRange, RingError, StorageError, Unavailable
from ring.offsets import EARLIEST, LATEST, At
from ring.ranges.catalogue import Catalogue, Range
from ring.ranges.host import RangesHost
from ring.ranges.store import Key, RangeStore
from ring.replication.reads import StoredRead
from ring.replication.replica import Replica

log = logging.getLogger("ring.ranges")


class ReadsOwner(Protocol):
    """What ``Reads`` uses of the ranges it reads for (``manager.Ranges``)."""

    host: RangesHost
    store: RangeStore
    hw_heard: dict[Key, int]  # each partition's high watermark as its leader last told a copy's holder

    def catalogue(self, rep: Replica) -> Catalogue: ...

    def earliest(self, rep: Replica) -> int: ...

    def created_ms(self, topic: str) -> int | None: ...

    def topic_config(self, topic: str) -> TopicConfig | None: ...

    def pull_catalogue(self, rep: Replica) -> None:
        """Ask the leader for its catalogue in the background."""

    async def move_start(self, rep: Replica, start: int) -> None: ...

    async def peer(self, method: str, name: str, path: str, *, params: dict[str, str] | None = None,
                   body: bytes | None = None, timeout_s: float = ...) -> bytes: ...


class Reads:
    def __init__(self, ranges: ReadsOwner) -> None:
        self.ranges = ranges
        self.bytes_served = 0  # fetch answers read from the copies held here

    @property
    def host(self) -> RangesHost:
        return self.ranges.host

    @property
    def store(self) -> RangeStore:
        return self.ranges.store

    # --- fetch ------------------------------------------------------------------------------

    def route(self, rep: Replica, offset: int | None, max_bytes: int) -> StoredRead | tuple[list[str], int] | None:
        """A fetch at ``offset`` (None: the earliest) on a replica, when it is below the local log:
        the answer from our copy, or (client URLs of holders, or of the leader, offset) to proxy to;
        None when the local log serves it."""
        cat = self.ranges.catalogue(rep)
        local = rep.log.start_offset
        earliest = cat.earliest(local) if cat.ranges else local
        if earliest == local and local > 0 and self._incomplete(rep):
            # Our log starts past the ranges we know of: a follower whose leader has not handed it the
            # catalogue yet (a new replica). The leader knows; we ask it for the catalogue meanwhile.
            self.ranges.pull_catalogue(rep)
            leader = self.host.leader_of(rep.topic, rep.index)
            url = self.host.membership.client_url(leader) if leader and leader != self.host.name else None
            if url and self.host.membership.alive(leader):
                return [url], offset if offset is not None else None
        if not cat.ranges:
            return None
        if offset is None:
            offset = earliest
        if offset >= local:
            return None
        r = cat.find(offset) if offset >= earliest else None
        if r is None:
            raise OffsetOutOfRange(
                f"offset {offset} is below the earliest offset of {rep.topic}/{rep.index} (earliest {earliest}, "
                f"latest {rep.log.end_offset})", topic=rep.topic, partition=rep.index, earliest=earliest,
                latest=rep.log.end_offset)
        key = (rep.topic, rep.index)
        mine = self.store.get(key, r.base)
        if mine is not None and (mine.end, mine.checksum) == (r.end, r.checksum):
            try:
                data = self.store.read(key, offset, max_bytes)
            except StorageError:
                data = None  # dropped: another holder answers
            if data is not None:
                self.bytes_served += len(data)
                return StoredRead(rep.topic, rep.index, offset, data, rep.hw, earliest)
        ms = self.host.membership
        urls = [ms.client_url(h) for h in r.holders if h != self.host.name and ms.alive(h)]
        urls = [u for u in urls if u]
        if not urls:
            raise Unavailable(f"no holder of range {r.base}-{r.end} of {rep.topic}/{rep.index} is alive "
                              f"({', '.join(r.holders) or 'none yet'}); retry", topic=rep.topic, partition=rep.index)
        return urls, offset

    def _incomplete(self, rep: Replica) -> bool:
        """Whether this follower's catalogue may lack ranges below its log (its topic makes ranges)."""
        if rep.is_leader:
            return False
        cfg = self.ranges.topic_config(rep.topic)
        return cfg is not None and cfg.local_retention_bytes >= 0

    def held(self, topic: str, partition: int, offset: int, max_bytes: int) -> StoredRead | None:
        """A fetch this broker answers from a range it holds for a partition it has no replica of."""
        key = (topic, partition)
        meta = self.store.find(key, offset)
        if meta is None or meta.created_ms != self.ranges.created_ms(topic):
            return None
        try:
            data = self.store.read(key, offset, max_bytes)
        except StorageError:
            return None
        if data is None:
            return None
        self.bytes_served += len(data)
        hw = max(meta.end, self.ranges.hw_heard.get(key, 0))
        return StoredRead(topic, partition, offset, data, hw, -1)

    # --- offsets --------------------------------------------------------------------------------

    async def offsets(self, rep: Replica, at: At) -> dict[str, Any] | None:
        """GET .../offsets when the answer is in the ranges; None when the local log answers it."""
        cat = self.ranges.catalogue(rep)
        if not cat.ranges or at == LATEST:
            return None
        earliest, local = self.ranges.earliest(rep), rep.log.start_offset
        doc = {"topic": rep.topic, "partition": rep.index, "timestamp": str(at), "leader_epoch": -1}
        if at == EARLIEST:
            return {**doc, "offset": earliest}
        assert type(at) is int, at
        ts = at
        for r in cat.ranges:
            if r.base >= local:
                break
            if r.end <= earliest or r.max_timestamp < ts:
                continue
            found = await self._first_at(rep, r, ts)
            if found is not None:
                return {**doc, "offset": max(found, earliest)}
        return None

    async def _first_at(self, rep: Replica, r: Range, ts: int) -> int | None:
        key = (rep.topic, rep.index)
        mine = self.store.get(key, r.base)
        if mine is not None and (mine.end, mine.checksum) == (r.end, r.checksum):
            try:
                return self.store.first_offset_at(key, r.base, ts)
            except StorageError:
                pass
        why = "no holder is alive"
        for h in r.holders:
            if h == self.host.name or not self.host.membership.alive(h):
                continue
            try:
                raw = await self.ranges.peer("GET", h, f"/peer/v1/ranges/{rep.topic}/{rep.index}/offset",
                                      params={"base": str(r.base), "timestamp": str(ts)})
                found = orjson.loads(raw).get("offset")
                return found if type(found) is int else None
            except (RingError, ValueError, AttributeError) as exc:
                why = getattr(exc, "message", str(exc))
        raise Unavailable(f"no holder of range {r.base}-{r.end} of {rep.topic}/{rep.index} answered ({why}); retry",
                          topic=rep.topic, partition=rep.index)

    def offset_in_held(self, topic: str, partition: int, base: int, ts: int) -> int | None:
        """The peer route's answer: the first offset at or after ``ts`` in a range held here."""
        if self.store.get((topic, partition), base) is None:
            raise Unavailable(f"{self.host.name} holds no range {base} of {topic}/{partition}")
        return self.store.first_offset_at((topic, partition), base, ts)

    # --- truncation and description ---------------------------------------------------------------

    async def truncated(self, rep: Replica, before_offset: int) -> int:
        """After the leader's log took a truncation: the ranges below ``before_offset`` go too; the
        partition's earliest offset."""
        cat = self.ranges.catalogue(rep)
        if cat.ranges and before_offset > cat.start:
            await self.ranges.move_start(rep, before_offset)
        return self.ranges.earliest(rep)
