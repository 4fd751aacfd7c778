"""Where the client reads a partition's ranges from: straight from their holders.

For a topic whose partitions keep only a local tail (``local_retention_bytes``
set, ``ring.ranges``), offsets below the tail live in ranges on other
brokers. Any broker answers a fetch there (it proxies), but the client asks
a range's holders itself: it loads the partition's ``GET .../ranges`` once
(and again when that answer is older than ``CLIENT_RANGES_MAX_AGE_MS``),
orders each range's holders so the ranges' bytes spread over them
(``ring.ranges.readers.spread``), and puts those URLs first for a fetch in
the range. Offsets at or past the tail go to the replicas as before.
"""

from __future__ import annotations

import bisect
from typing import Any, NamedTuple

from ring import limits
from ring.client.metadata import Metadata, quote
from ring.ranges.readers import spread


class RangeMap(NamedTuple):
    loaded_ms: float
    local_start: int
    bases: list[int]
    ranges: list[tuple[int, int, list[str]]]  # (base, end, holder names best first)


class RangeMaps:
    def __init__(self, meta: Metadata) -> None:
        self.meta = meta
        self._maps: dict[tuple[str, int], RangeMap] = {}
        self.loads = 0

    async def urls(self, topic: str, partition: int, offset: int) -> list[str]:
        """Client URLs of the live holders of the range holding ``offset``, best first ([] if none)."""
        m = self._maps.get((topic, partition))
        if m is not None and offset >= m.local_start:
            return []
        if m is None or self.meta.now_ms() - m.loaded_ms > limits.CLIENT_RANGES_MAX_AGE_MS:
            m = await self._load(topic, partition)
        i = bisect.bisect_right(m.bases, offset) - 1
        if i < 0 or offset >= m.ranges[i][1]:
            return []
        topo = self.meta.topology
        return [u for n in m.ranges[i][2] if topo.is_live(n) and (u := topo.url_of(n))]

    async def _load(self, topic: str, partition: int) -> RangeMap:
        reply = await self.meta.ask_any("GET", f"/v1/topics/{quote(topic)}/partitions/{partition}/ranges")
        doc: Any = reply.json() or {}
        ranges = spread(doc.get("ranges") or [])
        m = RangeMap(self.meta.now_ms(), int(doc.get("local_start_offset") or 0), [r[0] for r in ranges], ranges)
        self._maps[(topic, partition)] = m
        self.loads += 1
        return m

    def forget(self, topic: str) -> None:
        for key in [k for k in self._maps if k[0] == topic]:
            del self._maps[key]
