"""Phi-accrual failure detection over heartbeat arrivals, as pure math.

A ``PhiDetector`` keeps the last ``window_size`` intervals between heartbeat
arrivals of one peer and answers, for a moment ``now``, how surprising the
silence since the last arrival is: ``phi = -log10(P(next arrival is later
than now))``. phi 1 means a 10 % chance we are wrong to call the peer dead,
phi 8 one in 10^8. The arrival distribution is a normal one with the window's
mean and standard deviation, its CDF approximated by the logistic function
Akka uses (``1 / (1 + exp(-y (1.5976 + 0.070566 y^2)))``: CDF error < 1e-4,
and in the far tail it runs a little ahead of the exact normal, phi 8 at 5.23
deviations instead of 5.61). The exponential approximation Cassandra uses is
not taken: its phi grows only linearly, so threshold 8 would mean ~18 mean
intervals of silence whatever the jitter. As in Akka,
``acceptable_pause_ms`` is added to the mean (a peer may skip that long without
alarm) and the deviation is floored at ``min_std_ms`` (perfectly regular
heartbeats would otherwise make one late packet fatal). Intervals longer than
``max_interval_ms`` are not recorded: after a peer restarts, or after our own
pause, one huge gap must not widen the distribution for the next 100 beats.
The first heartbeat seeds the window with ``first_heartbeat_estimate_ms`` +-
a quarter of it. With ``z(8) ~= 5.226`` and ``z(5) ~= 4.119`` (where the
approximation gives phi 8 and 5) a silent peer is::

    convicted (phi >= 8) after  mean + acceptable_pause + 5.226 * max(std, min_std)
    suspect   (phi >= 5) after  mean + acceptable_pause + 4.119 * max(std, min_std)

With the defaults and a 1 s gossip interval (mean ~1 s, std <= 0.5 s) that is
~5.6 s to conviction and ~5.1 s to suspicion; a jittery peer (std 1 s) is
convicted after ~8.2 s. An observer's delay from the moment a peer stops is
that plus the age of the freshest heartbeat gossip had brought it (0-4 s): in
the seeded simulation of 3-8 brokers with 5 % message loss (200 seeds) the
first observer convicts 4.5-8 s after the stop, the last 5-12.75 s (median
7.9 s). ``FailureDetector`` holds one detector per peer and guards against our
own stalls (GC, SIGSTOP, an overloaded host): if ``tick`` finds more than
``stall_threshold_s`` since the previous tick, every peer's arrival clock
restarts at ``now`` and nobody is convicted for ``stall_grace_s``; and while a
tick is overdue (we were stalled and have not ticked yet) nobody is convicted
either. A peer silent after our stall is so convicted ``max(stall_grace_s,
conviction time)`` after we resume. Nothing here reads a clock: ``now`` is an
argument, in seconds of a monotonic clock.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from typing import Iterator

# Intervals remembered per peer: 100 s of history at a 1 s gossip interval,
# enough for a stable mean/deviation, small enough to follow a changed network
# within two minutes. Cassandra and Akka use 1000; ours bounds memory too.
WINDOW_SIZE_DEFAULT = 100
# Floor of the deviation. Half the gossip interval: gossip delivers a peer's
# heartbeat one to two rounds after it was made, so arrivals jitter by about
# that much even on a quiet network.
MIN_STD_MS_DEFAULT = 500.0
# Silence a peer may show on top of its mean interval before phi rises fast:
# two gossip rounds, covering a lost exchange and a short GC pause.
ACCEPTABLE_PAUSE_MS_DEFAULT = 2_000.0
# Longest interval recorded. Just under the default conviction time (~5.6 s):
# a gap that long means the peer (or we) stopped, not that the network is slow.
MAX_INTERVAL_MS_DEFAULT = 5_000.0
# The gossip interval: what a new peer's heartbeats are assumed to look like.
FIRST_HEARTBEAT_ESTIMATE_MS_DEFAULT = 1_000.0

# A gap between our own ticks longer than this (two gossip rounds) means we
# were not running; false alarms only delay convictions, so err low.
STALL_THRESHOLD_S_DEFAULT = 2.0
# No conviction for this long after our stall: our inbox holds stale news and
# our peers need a round or two to reach us again.
STALL_GRACE_S_DEFAULT = 5.0

CONVICT_PHI_DEFAULT = 8.0

_LN10 = math.log(10.0)


def phi_of(elapsed_ms: float, mean_ms: float, std_ms: float) -> float:
    """phi for ``elapsed_ms`` of silence under Normal(mean_ms, std_ms).

    ``-log10(1 - F(elapsed))`` with F the logistic approximation of the
    normal CDF, written as ``softplus(g) / ln 10`` so that it is finite and
    non-decreasing in ``elapsed_ms`` for every input (Akka's two-branch form
    computes the same value).
    """
    assert std_ms > 0
    y = (elapsed_ms - mean_ms) / std_ms
    g = y * (1.5976 + 0.070566 * y * y)
    if g > 0:
        return (g + math.log1p(math.exp(-g))) / _LN10
    return math.log1p(math.exp(g)) / _LN10


class PhiDetector:
    """Arrival history of one peer; answers phi for any later moment."""

    def __init__(
        self,
        window_size: int = WINDOW_SIZE_DEFAULT,
        min_std_ms: float = MIN_STD_MS_DEFAULT,
        max_interval_ms: float = MAX_INTERVAL_MS_DEFAULT,
        first_heartbeat_estimate_ms: float = FIRST_HEARTBEAT_ESTIMATE_MS_DEFAULT,
        acceptable_pause_ms: float = ACCEPTABLE_PAUSE_MS_DEFAULT,
    ) -> None:
        assert window_size >= 2, "two seed intervals must fit in the window"
        assert min_std_ms > 0 and max_interval_ms > 0
        assert first_heartbeat_estimate_ms > 0 and acceptable_pause_ms >= 0
        self.window_size = window_size
        self.min_std_ms = float(min_std_ms)
        self.max_interval_ms = float(max_interval_ms)
        self.first_heartbeat_estimate_ms = float(first_heartbeat_estimate_ms)
        self.acceptable_pause_ms = float(acceptable_pause_ms)
        self._intervals_ms: deque[float] = deque(maxlen=window_size)
        self._last_arrival_s: float | None = None
        # After a reset the next interval measures our restart, not the peer.
        self._skip_next_interval = False
        self._mean_ms = 0.0
        self._std_ms = self.min_std_ms

    # -- input ---------------------------------------------------------------

    def heartbeat(self, now_s: float) -> None:
        """Record an arrival (a newer heartbeat version of the peer) at now_s."""
        last = self._last_arrival_s
        if last is None:
            est = self.first_heartbeat_estimate_ms
            # Akka's bootstrap: mean = estimate, deviation = estimate / 4.
            self._intervals_ms.extend((est - est / 4, est + est / 4))
            self._recompute()
        elif not self._skip_next_interval:
            interval_ms = (now_s - last) * 1000.0
            if 0.0 <= interval_ms <= self.max_interval_ms:
                self._intervals_ms.append(interval_ms)
                self._recompute()
        self._skip_next_interval = False
        if last is None or now_s > last:
            self._last_arrival_s = now_s

    def restart_clock(self, now_s: float) -> None:
        """Pretend the last arrival was now, without recording an interval.

        Used after our own stall: the silence we measured was ours.
        """
        if self._last_arrival_s is not None:
            self._last_arrival_s = max(self._last_arrival_s, now_s)
            self._skip_next_interval = True

    # -- queries -------------------------------------------------------------

    @property
    def last_arrival_s(self) -> float | None:
        return self._last_arrival_s

    @property
    def mean_ms(self) -> float:
        return self._mean_ms

    @property
    def std_ms(self) -> float:
        """The deviation phi uses (already floored at min_std_ms)."""
        return self._std_ms

    def intervals_ms(self) -> Iterator[float]:
        return iter(self._intervals_ms)

    def phi(self, now_s: float) -> float:
        """Suspicion at now_s; 0.0 before the first heartbeat."""
        if self._last_arrival_s is None:
            return 0.0
        elapsed_ms = max(0.0, (now_s - self._last_arrival_s) * 1000.0)
        return phi_of(elapsed_ms, self._mean_ms + self.acceptable_pause_ms, self._std_ms)

    def expected_conviction_s(self, threshold: float = CONVICT_PHI_DEFAULT) -> float:
        """Silence after which phi reaches threshold, from the current window."""
        return (self._mean_ms + self.acceptable_pause_ms + z_of_phi(threshold) * self._std_ms) / 1000.0

    def _recompute(self) -> None:
        n = len(self._intervals_ms)
        mean = math.fsum(self._intervals_ms) / n
        var = math.fsum((x - mean) ** 2 for x in self._intervals_ms) / n
        self._mean_ms = mean
        self._std_ms = max(math.sqrt(var), self.min_std_ms)


@functools.lru_cache(maxsize=16)
def z_of_phi(threshold: float) -> float:
    """The y (deviations past the mean) at which phi_of reaches threshold."""
    assert threshold > 0
    lo, hi = -50.0, 50.0
    for _ in range(200):  # bisection; 200 halvings exhaust a double
        mid = (lo + hi) / 2
        if phi_of(mid, 0.0, 1.0) < threshold:
            lo = mid
        else:
            hi = mid
    return hi


class FailureDetector:
    """One PhiDetector per peer plus the guard against our own stalls."""

    def __init__(
        self,
        *,
        window_size: int = WINDOW_SIZE_DEFAULT,
        min_std_ms: float = MIN_STD_MS_DEFAULT,
        max_interval_ms: float = MAX_INTERVAL_MS_DEFAULT,
        first_heartbeat_estimate_ms: float = FIRST_HEARTBEAT_ESTIMATE_MS_DEFAULT,
        acceptable_pause_ms: float = ACCEPTABLE_PAUSE_MS_DEFAULT,
        stall_threshold_s: float = STALL_THRESHOLD_S_DEFAULT,
        stall_grace_s: float = STALL_GRACE_S_DEFAULT,
    ) -> None:
        assert stall_threshold_s > 0 and stall_grace_s >= 0
        self._params = dict(
            window_size=window_size,
            min_std_ms=min_std_ms,
            max_interval_ms=max_interval_ms,
            first_heartbeat_estimate_ms=first_heartbeat_estimate_ms,
            acceptable_pause_ms=acceptable_pause_ms,
        )
        self.stall_threshold_s = stall_threshold_s
        self.stall_grace_s = stall_grace_s
        self._detectors: dict[str, PhiDetector] = {}
        self._last_tick_s: float | None = None
        self._grace_until_s = -math.inf
        self.stalls = 0  # how many of our own stalls were seen (a metric)

    def tick(self, now_s: float) -> bool:
        """Call every gossip round. Returns True when it found we had stalled."""
        last = self._last_tick_s
        self._last_tick_s = now_s if last is None else max(last, now_s)
        if last is None or now_s - last <= self.stall_threshold_s:
            return False
        self.stalls += 1
        self._grace_until_s = now_s + self.stall_grace_s
        for det in self._detectors.values():
            det.restart_clock(now_s)
        return True

    def heartbeat(self, peer: str, now_s: float) -> None:
        det = self._detectors.get(peer)
        if det is None:
            det = self._detectors[peer] = PhiDetector(**self._params)
        det.heartbeat(now_s)

    def forget(self, peer: str) -> None:
        """Drop a peer's history (removed, or restarted with a new generation)."""
        self._detectors.pop(peer, None)

    def peers(self) -> list[str]:
        return sorted(self._detectors)

    def detector(self, peer: str) -> PhiDetector | None:
        return self._detectors.get(peer)

    def guarded(self, now_s: float) -> bool:
        """True while convictions are suppressed: in the grace after a stall,
        or while a tick is overdue (we are stalled and have not noticed yet)."""
        if now_s < self._grace_until_s:
            return True
        last = self._last_tick_s
        return last is not None and now_s - last > self.stall_threshold_s

    def next_crossing_s(self, now_s: float, thresholds: tuple[float, ...]) -> float | None:
        """The first moment after ``now_s`` when some peer's phi reaches one of ``thresholds`` if it stays
        silent, or the stall guard ends: when a status seen now could next change (None: never)."""
        times = [self._grace_until_s] if self._grace_until_s > now_s else []
        for det in self._detectors.values():
            last = det.last_arrival_s
            if last is None:
                continue
            for threshold in thresholds:
                at = last + det.expected_conviction_s(threshold)
                if at > now_s:
                    times.append(at)
        return min(times) if times else None

    def phi(self, peer: str, now_s: float) -> float:
        """The peer's phi, or 0.0 while guarded or for a peer never heard from."""
        det = self._detectors.get(peer)
        if det is None or self.guarded(now_s):
            return 0.0
        return det.phi(now_s)

    def is_convicted(self, peer: str, now_s: float, threshold: float = CONVICT_PHI_DEFAULT) -> bool:
        return self.phi(peer, now_s) >= threshold
