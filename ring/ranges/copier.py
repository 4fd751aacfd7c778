"""Copying ranges between brokers: the leader orders, the holder pulls and verifies.

A partition's leader asks a broker placement names to hold a range
(``order``: ``POST /peer/v1/ranges/{t}/{p}/copy`` with the range's offsets,
size, checksum and the brokers to take it from). The holder (``pull``)
takes the bytes from the first source that gives them (``GET
.../bytes``: a holder's copy, or a replica's own log, ``serve``), writes
them as they arrive, and answers only once the copy is whole, its checksum
and every batch's CRC match, and it is on disk (``store.IncomingCopy``); the
leader adds it to the range's holders only on that answer. A broker whose
free disk is below its floor refuses (507), before any byte is written.

Copies of one range to one broker never run twice at once (a second order
waits for the first), and a leader runs at most ``RANGE_COPIES_IN_FLIGHT_MAX``
orders at once.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

import aiohttp
import orjson

from ring import limits
from ring.errors import (BadRequest, InsufficientStorage, OffsetOutOfRange, RingError, StorageError, Unavailable,
                         UnknownTopic)
from ring.log import batch as batchfmt
from ring.ranges.catalogue import Range
from ring.ranges.host import RangesHost
from ring.ranges.store import Key, Meta, RangeStore

if TYPE_CHECKING:
    from ring.replication.replica import Replica

log = logging.getLogger("ring.ranges")


class CopyOwner(Protocol):
    """What the copier uses of the ranges it copies for (``manager.Ranges``)."""

    host: RangesHost
    store: RangeStore

    def created_ms(self, topic: str) -> int | None: ...

    def heard_hw(self, key: Key, hw: int) -> None: ...

    def copied(self, rep: Replica, epoch: int, r: Range, target: str) -> None: ...

    async def peer(self, method: str, name: str, path: str, *, params: dict[str, str] | None = None,
                   body: bytes | None = None, timeout_s: float = ...) -> bytes: ...


def ranges_path(topic: str, partition: int) -> str:
    return f"/peer/v1/ranges/{topic}/{partition}"


def copy_timeout_s(size: int) -> float:
    return limits.RANGE_COPY_TIMEOUT_S_MIN + size / limits.RANGE_COPY_BYTES_PER_S_MIN


class Copier:
    def __init__(self, ranges: CopyOwner) -> None:
        self.ranges = ranges
        self._pulls: dict[tuple[Key, int], asyncio.Future[None]] = {}
        self._orders: dict[tuple[Key, int, str], asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(limits.RANGE_COPIES_IN_FLIGHT_MAX)
        self.copies_in = 0  # ranges this broker took
        self.copies_ordered = 0
        self.refused_full = 0

    @property
    def host(self) -> RangesHost:
        return self.ranges.host

    def in_flight(self, key: Key, base: int, broker: str) -> bool:
        return (key, base, broker) in self._orders

    async def close(self) -> None:
        tasks = list(self._orders.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- the leader's side ----------------------------------------------------------------

    def order(self, rep: Replica, r: Range, target: str, sources: list[str]) -> None:
        """Have ``target`` copy ``r`` (in the background); on success it joins the range's holders."""
        key = (rep.topic, rep.index)
        if (key, r.base, target) in self._orders or len(self._orders) >= limits.RANGE_COPY_ORDERS_MAX:
            return
        task = asyncio.create_task(self._order(rep, r, target, sources), name=f"range copy {key} {r.base}")
        self._orders[(key, r.base, target)] = task
        task.add_done_callback(lambda _t: self._orders.pop((key, r.base, target), None))

    async def _order(self, rep: Replica, r: Range, target: str, sources: list[str]) -> None:
        key, epoch = (rep.topic, rep.index), rep.epoch
        async with self._slots:
            if not rep.is_leader or rep.epoch != epoch or rep.deleted:
                return
            doc = {"base": r.base, "end": r.end, "size": r.size, "checksum": r.checksum,
                   "max_timestamp": r.max_timestamp, "created_ms": self.ranges.created_ms(rep.topic),
                   "sources": sources, "hw": rep.hw}
            self.copies_ordered += 1
            try:
                if target == self.host.name:
                    await self.pull(key, self._meta(doc), sources)
                else:
                    await self.ranges.peer("POST", target, ranges_path(*key) + "/copy", body=orjson.dumps(doc),
                                           timeout_s=copy_timeout_s(r.size))
            except RingError as exc:
                log.debug("%s/%d: copying range %d-%d to %s failed: %s", key[0], key[1], r.base, r.end, target,
                         exc.message)
                return
        self.ranges.copied(rep, epoch, r, target)

    # --- the holder's side -----------------------------------------------------------------

    @staticmethod
    def _meta(doc: Any) -> Meta:
        if not isinstance(doc, dict):
            raise BadRequest("a copy order is a JSON object")
        try:
            meta = Meta(doc["base"], doc["end"], doc["size"], doc["checksum"], doc["max_timestamp"], doc["created_ms"])
        except KeyError as exc:
            raise BadRequest(f"a copy order needs {exc.args[0]}") from None
        ints = (meta.base, meta.end, meta.size, meta.max_timestamp, meta.created_ms)
        if not all(type(v) is int for v in ints) or not 0 <= meta.base < meta.end or \
                not 0 < meta.size <= limits.SEGMENT_BYTES_MAX or type(meta.checksum) is not str or \
                len(meta.checksum) != 40:
            raise BadRequest("a copy order's offsets, size and checksum are malformed")
        return meta

    async def on_order(self, topic: str, partition: int, doc: Any) -> dict[str, Any]:
        """``POST .../copy``: pull the range, answer once it is verified and on disk."""
        meta = self._meta(doc)
        sources = doc.get("sources")
        if type(sources) is not list or not sources or not all(type(s) is str for s in sources) or \
                len(sources) > limits.RANGE_COPIES_MAX + 1:
            raise BadRequest("a copy order names the brokers to copy from")
        if type(doc.get("hw")) is int:
            self.ranges.heard_hw((topic, partition), doc["hw"])
        await self.pull((topic, partition), meta, sources)
        return {"base": meta.base, "end": meta.end, "checksum": meta.checksum}

    def check_room(self, size: int) -> None:
        free = shutil.disk_usage(self.ranges.store.root).free
        floor = self.host.config.disk_free_min_bytes
        if free - size < floor:
            self.refused_full += 1
            raise InsufficientStorage(f"{self.host.name} has {free} bytes of disk free; a range of {size} bytes would "
                                      f"take it below its floor of {floor} (--disk-free-min-bytes)",
                                      free_bytes=free, floor_bytes=floor)

    async def pull(self, key: Key, meta: Meta, sources: list[str]) -> None:
        held = self.ranges.store.get(key, meta.base)
        if held == meta:
            return
        if self.ranges.created_ms(key[0]) != meta.created_ms:
            raise Unavailable(f"{self.host.name} does not know topic {key[0]} as created at {meta.created_ms} (yet)")
        running = self._pulls.get((key, meta.base))
        if running is not None:
            await asyncio.shield(running)
            if self.ranges.store.get(key, meta.base) == meta:
                return
        fut = asyncio.get_running_loop().create_future()
        self._pulls[(key, meta.base)] = fut
        try:
            await self._pull(key, meta, sources)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else Unavailable("cancelled"))
            fut.exception()  # retrieved: a waiter may not exist
            raise
        finally:
            self._pulls.pop((key, meta.base), None)

    async def _pull(self, key: Key, meta: Meta, sources: list[str]) -> None:
        self.check_room(meta.size)
        why = "no source named"
        for src in sources:
            incoming = self.ranges.store.incoming(key, meta)
            try:
                async for chunk in self._source_bytes(src, key, meta):
                    incoming.write(chunk)
                await asyncio.get_running_loop().run_in_executor(None, incoming.finish)
            except (RingError, OSError, aiohttp.ClientError, TimeoutError) as exc:
                incoming.abort()
                why = f"{src}: {getattr(exc, 'message', None) or exc!r}"
                log.info("%s/%d: copying range %d-%d from %s failed: %s", key[0], key[1], meta.base, meta.end, src, why)
                continue
            self.ranges.store.install(key, meta)
            self.copies_in += 1
            log.info("%s/%d: holds range %d-%d (%d bytes) copied from %s", key[0], key[1], meta.base, meta.end,
                     meta.size, src)
            return
        raise Unavailable(f"range {meta.base}-{meta.end} of {key[0]}/{key[1]} could not be copied: {why}")

    async def _source_bytes(self, src: str, key: Key, meta: Meta) -> AsyncIterator[bytes]:
        if src == self.host.name:
            for chunk in self.local_chunks(key, meta.base, meta.end):
                yield chunk
                await self.host.clock.sleep(0)
            return
        ms, session = self.host.membership, self.host.session
        url = ms.peer_url(src) if ms is not None else None
        if url is None or session is None or not ms.alive(src):
            raise Unavailable(f"{src} is not reachable")
        timeout = aiohttp.ClientTimeout(total=copy_timeout_s(meta.size), sock_read=limits.RANGE_COPY_READ_TIMEOUT_S)
        params = {"base": str(meta.base), "end": str(meta.end)}
        async with session.get(url + ranges_path(*key) + "/bytes", params=params, timeout=timeout) as resp:
            if resp.status != 200:
                raise Unavailable(f"{src} answered {resp.status}: {(await resp.content.read(300))!r}")
            async for chunk in resp.content.iter_chunked(limits.RANGE_CHUNK_BYTES):
                yield chunk

    # --- a source's side ----------------------------------------------------------------------

    def local_chunks(self, key: Key, base: int, end: int):  # type: ignore[no-untyped-def]
        """The bytes of [base, end) from this broker: its copy of that range, or its own replica's log."""
        store = self.ranges.store
        held = store.get(key, base)
        if held is not None and held.end == end:
            return store.chunks(key, base)
        rep = self.host.replica(*key)
        if rep is None or rep.deleted or not (rep.log.start_offset <= base and end <= min(rep.hw, rep.log.end_offset)):
            raise OffsetOutOfRange(f"{self.host.name} holds no copy of {key[0]}/{key[1]} offsets {base}-{end}")
        return self._log_chunks(rep, base, end)

    @staticmethod
    def _log_chunks(rep: Replica, base: int, end: int):  # type: ignore[no-untyped-def]
        offset = base
        while offset < end:
            data = rep.log.read(offset, limits.RANGE_CHUNK_BYTES, upto=end)  # whole, CRC-checked batches
            if not data:
                raise StorageError(f"{rep.topic}/{rep.index}: the log ends at {offset}, before {end}")
            for h, _ in batchfmt.scan(data, verify=False):
                offset = h.next_offset
            yield data

    def check_topic(self, topic: str) -> None:
        if self.ranges.created_ms(topic) is None:
            raise UnknownTopic(f"unknown topic {topic!r}", topic=topic)
