"""A broker's judgement of its own wall clock against its peers', for the node core's membership rules.

``ring.gossip.clocks`` is the math (offsets from round trips, the verdict);
``ClockWatch`` applies it as the membership rules need: every gossip round
the clock is judged against the live peers measured (``check``), the
verdict is gossiped (``clock`` in the entry's extra) and logged when it
changes; live peers without a fresh measurement get an exchange of their own
(``to_measure``); a clock set while the broker runs (``observe``, given the
wall clock with the monotonic one) forgets what was measured. A broker whose
clock is out of bounds, or not compared yet, stamps no record, applies no
retention by age and leads no partition (``usable``, ``ring.node.watch``).
The wall clock is an argument, as the monotonic one is: nothing here reads
a clock.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from ring import limits
from ring.gossip import clocks

log = logging.getLogger("ring.cluster")


class ClockWatch:
    def __init__(self, name: str, max_offset_ms: float, rng: random.Random) -> None:
        self.name = name
        warn_ms = max_offset_ms * limits.CLOCK_OFFSET_WARN_PERCENT / 100
        self.offsets = clocks.ClockOffsets(max_offset_ms, warn_ms, limits.CLOCK_SAMPLE_RTT_MS_MAX,
                                           limits.CLOCK_SAMPLE_TTL_S)
        self.verdict = clocks.ClockVerdict(clocks.UNKNOWN, reason="not judged yet")
        self.rng = rng

    def observe(self, now: float, wall_ms: int) -> bool:
        """Our two clocks read together; True when the wall clock was set meanwhile."""
        if not self.offsets.observe(now, wall_ms):
            return False
        log.error("the wall clock of %s was set (it jumped against the monotonic clock): it is not used until "
                  "measured against the peers again", self.name)
        return True

    def sample(self, peer: str, now: float, sent_s: float, sent_wall_ms: int, peer_wall_ms: int) -> None:
        """An exchange with ``peer`` that left at ``sent_s`` (our wall clock then ``sent_wall_ms``) and
        brought back the peer's wall clock."""
        self.offsets.sample(peer, now, sent_wall_ms, now - sent_s, peer_wall_ms)

    def check(self, now: float, live_peers: int) -> tuple[clocks.ClockVerdict, bool]:
        """Judge our clock against the peers measured; the verdict, and whether its gossiped form changed
        (the broker is told then)."""
        verdict = self.offsets.judge(now, live_peers)
        old, self.verdict = self.verdict, verdict
        if verdict.state != old.state:
            self._say(old, verdict)
        return verdict, clocks.to_gossip(verdict) != clocks.to_gossip(old)

    def _say(self, old: clocks.ClockVerdict, new: clocks.ClockVerdict) -> None:
        max_ms = self.offsets.max_offset_ms
        if new.state == clocks.OUT_OF_BOUNDS:
            log.error("clock of %s out of bounds (--max-clock-offset %.0f ms): %s. It stops leading partitions, "
                      "stamping records and applying time-based retention until it is back within bounds",
                      self.name, max_ms, new.reason)
        elif new.state == clocks.WARNING:
            log.warning("clock of %s: %s (the hard bound is %.0f ms)", self.name, new.reason, max_ms)
        elif new.state == clocks.OK and old.state != clocks.UNKNOWN:
            log.info("clock of %s back within bounds: %s", self.name, new.reason)

    def to_measure(self, now: float, live: list[str]) -> list[str]:
        """Live peers we have no fresh measurement of, as many as a judgement needs (drawn at random)."""
        fresh = self.offsets.fresh(now)
        missing = clocks.needed(len(live)) - sum(1 for n in live if n in fresh)
        unmeasured = [n for n in live if n not in fresh]
        self.rng.shuffle(unmeasured)
        return unmeasured[:max(0, missing)]

    def of(self, name: str, now: float, gossiped: Any) -> dict[str, Any]:
        """A broker's clock as this broker knows it: its own judgement (gossiped), and our measurement."""
        if name == self.name:
            v = self.verdict
            return {"state": v.state, "offset_ms": None if v.offset_ms is None else round(v.offset_ms),
                    "measured_offset_ms": 0}
        state, offset = clocks.from_gossip(gossiped)
        seen = self.offsets.fresh(now).get(name)
        return {"state": state, "offset_ms": None if offset is None else round(offset),
                "measured_offset_ms": None if seen is None else round(seen.offset_ms)}

    def usable(self, name: str, gossiped: Any) -> bool:
        """Whether ``name`` may use its clock (lead, stamp, retain by time): by its own gossiped judgement;
        a broker of a version that gossips none counts as usable."""
        if name == self.name:
            return self.verdict.usable
        state = clocks.from_gossip(gossiped)[0]
        return state is None or state in clocks.USABLE

    def status(self, now: float) -> dict[str, Any]:
        """This broker's clock for /v1/status."""
        v, offsets = self.verdict, self.offsets
        return {"state": v.state, "offset_ms": None if v.offset_ms is None else round(v.offset_ms),
                "uncertainty_ms": None if v.uncertainty_ms is None else round(v.uncertainty_ms),
                "max_offset_ms": offsets.max_offset_ms, "warn_offset_ms": offsets.warn_offset_ms,
                "message": v.reason, "peers": {n: {"offset_ms": round(o.offset_ms),
                                                   "uncertainty_ms": round(o.uncertainty_ms)}
                                               for n, o in offsets.fresh(now).items()}}
