"""The admin page's charts: records into and out of each topic, and each group's lag, over the last minutes.

Every ``TRENDS_INTERVAL_MS`` a broker takes a sample from numbers it keeps
anyway: the records it acknowledged to producers, handed to fetches and to
group polls, per topic (``ring.http_api.metrics.Metrics``), and the lag of the groups
it coordinates (``Metrics.group_source``). A sample holds what moved since the
one before (records, not totals, so a quiet topic takes no room) and the
milliseconds it covers; the last ``TRENDS_SAMPLES_MAX`` are kept, so a page
opened now shows the last minutes, not an empty chart that fills while it
watches. ``GET /admin/trends`` answers them.

Each broker counts only the requests it answered (a produce sent to ring-1 is
ring-1's, whichever broker leads the partition) and lag only for the groups
it coordinates, so the page sums every live broker's answer (through
``/admin/brokers/{broker}/trends``, relayed like a topic's description). The
sampler reads counters and a list the coordinator keeps in memory: no I/O,
a few hundred microseconds every five seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from ring import limits
from ring.http_api.web import App, Request, Response, json

log = logging.getLogger("ring.admin")


class Trends:
    """The sampler of one broker and its last samples."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.samples: deque[dict[str, Any]] = deque(maxlen=limits.TRENDS_SAMPLES_MAX)
        self._seen: dict[str, tuple[int, int]] = {}  # topic -> (records in, records out) so far
        self._last_ms = broker.clock.monotonic() * 1000  # of the last sample (or the start)
        self._task: asyncio.Task[None] | None = None

    # --- sampling ------------------------------------------------------------------

    def totals(self) -> dict[str, tuple[int, int]]:
        """Topic -> (records acknowledged to producers, records handed to consumers) since the broker started."""
        m = self.broker.metrics
        if m is None:
            return {}
        out: dict[str, tuple[int, int]] = {}
        for topic in {*m.produced, *m.fetched, *m.polled}:
            produced, fetched = m.produced.get(topic), m.fetched.get(topic)
            out[topic] = ((produced[1] if produced else 0),
                          (fetched[1] if fetched else 0) + m.polled.get(topic, 0))
        return out

    def lags(self) -> dict[str, int]:
        """Group -> records behind, summed over its partitions, for the groups coordinated here."""
        m = self.broker.metrics
        source = m.group_source if m is not None else None
        out: dict[str, int] = {}
        for row in (source() if source is not None else ()):
            out[row.group] = out.get(row.group, 0) + max(0, row.end_offset - (row.committed or 0))
        return out

    def sample(self) -> dict[str, Any]:
        """Take one sample now, keep it, and return it."""
        clock = self.broker.clock
        now = clock.monotonic() * 1000
        covers, self._last_ms = round(now - self._last_ms), now
        totals = self.totals()
        moved = {}
        for topic, (got, gave) in totals.items():
            before = self._seen.get(topic, (0, 0))
            d_in, d_out = max(0, got - before[0]), max(0, gave - before[1])  # counters of a deleted topic restart
            if d_in or d_out:
                moved[topic] = [d_in, d_out]
        self._seen = totals
        busiest = sorted(moved, key=lambda t: -(moved[t][0] + moved[t][1]))[:limits.TRENDS_TOPICS_MAX]
        lags = self.lags()
        behind = sorted(lags, key=lambda g: -lags[g])[:limits.TRENDS_GROUPS_MAX]
        doc = {"t": clock.wall_ms(), "ms": covers, "topics": {t: moved[t] for t in busiest},
               "groups": {g: lags[g] for g in behind}}
        self.samples.append(doc)
        return doc

    def doc(self) -> dict[str, Any]:
        return {"broker": self.broker.config.name, "interval_ms": limits.TRENDS_INTERVAL_MS,
                "samples_max": limits.TRENDS_SAMPLES_MAX, "samples": list(self.samples)}

    # --- the loop --------------------------------------------------------------------

    async def start(self) -> None:
        self._seen, self._last_ms = self.totals(), self.broker.clock.monotonic() * 1000
        self._task = asyncio.create_task(self._run(), name="trends")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.broker.clock.sleep(limits.TRENDS_INTERVAL_MS / 1000)
            try:
                self.sample()
            except Exception:  # a chart is not worth a broker: say so and try again next time
                log.exception("sampling the admin page's trends failed")


TRENDS_KEY = "trends"


def get_trends(request: Request) -> Response:
    return json(request.app[TRENDS_KEY].doc())


def install(app: App, broker: Any) -> Trends:
    """Sample while ``app`` runs; the route is added by ``ring.http_api.admin``."""
    trends = Trends(broker)
    app[TRENDS_KEY] = trends
    app.on_startup.append(trends.start)
    app.on_cleanup.append(trends.close)
    return trends
