"""Clock offsets between brokers, measured over gossip round trips: pure math that takes ``now`` as an argument.

Every gossip exchange a broker starts is a measurement (as NTP and
CockroachDB measure): the broker notes its own wall clock as the SYN leaves
and the round trip on its monotonic clock; the peer's answer carries the
peer's wall clock as it answered. The peer read its clock somewhere within
the round trip, so::

    offset = peer_wall - (sent_wall + rtt / 2)      |error| <= rtt / 2

A measurement whose round trip is longer than ``rtt_ms_max`` says too little
and is dropped; a peer's latest kept measurement stands for ``ttl_s``.

``judge`` decides about this broker's own clock. It is out of bounds when
more than half of the peers it measured are, for certain (``|offset| -
uncertainty``), further than the hard bound from it, and a warning likewise
with the warning bound. One peer cannot say which of two clocks is wrong:
with one, both brokers call themselves out of bounds beyond the bound, and
neither uses its clock. ``offset_ms`` is this clock minus the cluster's: the
median of its offsets to the peers (of two, the one nearer zero).

Judging needs enough peers measured (``needed``): every live peer when there
are one or two, else a majority of the cluster and at least two. Until it
first has them the answer is ``unknown`` (the broker has not compared its
clock with anyone's yet); later, while too few measurements are fresh (peers
down or unreachable), the last judgement stands. With no live peer there is
nothing to compare with: ``ok``.

A clock stepped while the broker runs is noticed without the peers:
``observe`` compares the wall clock's progress with the monotonic clock's,
and a jump of more than half the warning bound forgets every measurement
(taken with the old clock) and the judgement: ``unknown`` again until
measured anew.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN, OK, WARNING, OUT_OF_BOUNDS = "unknown", "ok", "warning", "out_of_bounds"
STATES = (UNKNOWN, OK, WARNING, OUT_OF_BOUNDS)
USABLE = (OK, WARNING)  # states in which a broker may stamp records, apply time retention and lead


@dataclass(frozen=True)
class Offset:
    """One peer's clock as last measured: its wall clock minus ours, within +- ``uncertainty_ms``."""

    offset_ms: float
    uncertainty_ms: float
    at_s: float  # when the measurement ended, on the monotonic clock


@dataclass(frozen=True)
class ClockVerdict:
    state: str
    offset_ms: float | None = None  # this clock minus the cluster's; None: not measured
    uncertainty_ms: float | None = None
    measured: int = 0  # peers with a fresh measurement
    far: int = 0  # of those, peers certainly beyond the hard bound
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.state in USABLE


def majority(n: int) -> int:
    return n // 2 + 1


def needed(live_peers: int) -> int:
    """Peers that must have a fresh measurement for a judgement, given how many are alive."""
    if live_peers <= 0:
        return 0
    return max(majority(live_peers + 1) - 1, min(2, live_peers))


def describe_ms(offset_ms: float) -> str:
    """``8.0 d ahead``, ``61.2 s behind``, ``340 ms ahead``: an offset for people."""
    size, way = abs(offset_ms), "ahead" if offset_ms >= 0 else "behind"
    if size >= 86_400_000:
        return f"{size / 86_400_000:.1f} d {way}"
    if size >= 1000:
        return f"{size / 1000:.1f} s {way}"
    return f"{size:.0f} ms {way}"


class ClockOffsets:
    def __init__(self, max_offset_ms: float, warn_offset_ms: float, rtt_ms_max: float, ttl_s: float) -> None:
        assert 0 < warn_offset_ms <= max_offset_ms and rtt_ms_max > 0 and ttl_s > 0
        self.max_offset_ms = max_offset_ms
        self.warn_offset_ms = warn_offset_ms
        self.rtt_ms_max = rtt_ms_max
        self.ttl_s = ttl_s
        self._offsets: dict[str, Offset] = {}
        self._judged: ClockVerdict | None = None
        self._wall_minus_mono_ms: float | None = None
        self._stepped_at_s = float("-inf")

    # --- measurements -----------------------------------------------------------------

    def sample(self, peer: str, now_s: float, sent_wall_ms: int, rtt_s: float, peer_wall_ms: int) -> Offset | None:
        """A round trip to ``peer`` that began ``rtt_s`` before ``now_s`` (our wall clock read
        ``sent_wall_ms`` then) and brought back the peer's ``peer_wall_ms``; the measurement
        kept, or None when it says too little (too slow, or across a step of our clock)."""
        if rtt_s < 0 or rtt_s * 1000 > self.rtt_ms_max or now_s - rtt_s <= self._stepped_at_s:
            return None
        half_ms = rtt_s * 500
        got = Offset(peer_wall_ms - (sent_wall_ms + half_ms), half_ms, now_s)
        self._offsets[peer] = got
        return got

    def forget(self, peer: str) -> None:
        self._offsets.pop(peer, None)

    def fresh(self, now_s: float) -> dict[str, Offset]:
        """Peer -> its latest measurement younger than ``ttl_s``."""
        return {p: o for p, o in sorted(self._offsets.items()) if now_s - o.at_s <= self.ttl_s}

    def observe(self, now_s: float, wall_ms: int) -> bool:
        """Our two clocks read together; True when the wall clock jumped against the monotonic one
        (it was set), which forgets every measurement and the judgement."""
        skew = wall_ms - now_s * 1000
        before, self._wall_minus_mono_ms = self._wall_minus_mono_ms, skew
        if before is None or abs(skew - before) <= self.warn_offset_ms / 2:
            return False
        self._offsets.clear()
        self._judged = None
        self._stepped_at_s = now_s
        return True

    # --- the judgement ----------------------------------------------------------------

    def judge(self, now_s: float, live_peers: int) -> ClockVerdict:
        """What this broker may make of its clock now, given how many peers gossip says are alive."""
        fresh = self.fresh(now_s)
        if fresh and len(fresh) >= needed(live_peers):
            self._judged = self._verdict(list(fresh.values()))
            return self._judged
        if self._judged is not None:
            return self._judged
        if live_peers <= 0:
            return ClockVerdict(OK, reason="no live peer to compare this clock with")
        return ClockVerdict(UNKNOWN, measured=len(fresh), reason=f"{len(fresh)} of the {needed(live_peers)} peers needed "
                       "to judge this clock are measured")

    def _verdict(self, offsets: list[Offset]) -> ClockVerdict:
        n = len(offsets)
        mine = sorted((-o.offset_ms, o.uncertainty_ms) for o in offsets)  # our clock minus each peer's
        if n % 2:
            median = mine[n // 2]
        else:
            a, b = mine[n // 2 - 1], mine[n // 2]
            median = a if abs(a[0]) <= abs(b[0]) else b
        far = sum(1 for o in offsets if abs(o.offset_ms) - o.uncertainty_ms > self.max_offset_ms)
        warned = sum(1 for o in offsets if abs(o.offset_ms) - o.uncertainty_ms > self.warn_offset_ms)
        if 2 * far > n:
            state, bound = OUT_OF_BOUNDS, self.max_offset_ms
        elif 2 * warned > n:
            state, bound = WARNING, self.warn_offset_ms
        else:
            state, bound = OK, None
        beyond = far if state == OUT_OF_BOUNDS else warned
        reason = (f"this clock is {describe_ms(median[0])} of the cluster's (+- {median[1]:.0f} ms): "
                  f"{beyond} of {n} peers measured are further than {bound:.0f} ms from it" if bound is not None
                  else f"this clock is within {self.warn_offset_ms:.0f} ms of the cluster's")
        return ClockVerdict(state, median[0], median[1], n, far, reason)


# --- what a broker gossips about its own clock ---------------------------------------------


def to_gossip(v: ClockVerdict) -> dict[str, object]:
    """The ``clock`` entry of a broker's gossiped extra: its state and offset, the offset rounded to
    100 ms so that jitter does not make a new entry every round."""
    return {"state": v.state, "offset_ms": None if v.offset_ms is None else int(round(v.offset_ms, -2))}


def from_gossip(doc: object) -> tuple[str | None, float | None]:
    """(state, offset_ms) from a peer's ``clock`` entry; (None, None) when it has none (an older
    version) or it is malformed."""
    if not isinstance(doc, dict) or doc.get("state") not in STATES:
        return None, None
    offset = doc.get("offset_ms")
    return doc["state"], float(offset) if isinstance(offset, (int, float)) and not isinstance(offset, bool) else None
