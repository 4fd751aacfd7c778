"""The phi-accrual detector: its shape, its cap, and the stall guard."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ring.gossip.phi import FailureDetector, PhiDetector, phi_of, z_of_phi

SETTINGS = settings(max_examples=150, deadline=None)

intervals_ms = st.lists(st.floats(min_value=1.0, max_value=8_000.0), min_size=0, max_size=150)


def _feed(det: PhiDetector, intervals: list[float], start_s: float = 100.0) -> float:
    now = start_s
    det.heartbeat(now)
    for iv in intervals:
        now += iv / 1000.0
        det.heartbeat(now)
    return now


def _first_time_at(det: PhiDetector, t0: float, threshold: float, step_s: float = 0.01) -> float:
    """Seconds of silence after t0 until phi reaches threshold (bounded scan)."""
    for i in range(1, 10_000):
        if det.phi(t0 + i * step_s) >= threshold:
            return i * step_s
    raise AssertionError("phi never reached the threshold within 100 s")


@SETTINGS
@given(intervals_ms, st.lists(st.floats(min_value=0.0, max_value=120.0), min_size=2, max_size=40))
def test_phi_rises_monotonically_with_silence(intervals, silences):
    det = PhiDetector()
    last = _feed(det, intervals)
    phis = [det.phi(last + s) for s in sorted(silences)]
    assert all(math.isfinite(p) and p >= 0 for p in phis)
    assert all(a <= b for a, b in zip(phis, phis[1:])), phis
    # Long enough silence always convicts: the deviation is bounded by the cap.
    assert det.phi(last + 60.0) > 8.0


@SETTINGS
@given(intervals_ms)
def test_phi_is_about_zero_right_after_a_heartbeat(intervals):
    det = PhiDetector()
    last = _feed(det, intervals)
    assert det.phi(last) < 0.05
    # Arrivals "from the future" (clock skew between calls) count as now.
    assert det.phi(last - 1.0) == det.phi(last)


def test_regular_heartbeats_give_the_documented_conviction_time():
    det = PhiDetector()
    last = _feed(det, [1000.0] * 200)
    assert det.phi(last) < 1e-9
    assert det.mean_ms == 1000.0 and det.std_ms == det.min_std_ms == 500.0
    # mean + acceptable_pause + z(8) * min_std = 1 + 2 + 5.226 * 0.5 = 5.61 s
    assert abs(z_of_phi(8.0) - 5.226) < 1e-3 and abs(z_of_phi(5.0) - 4.119) < 1e-3
    convict = _first_time_at(det, last, 8.0)
    suspect = _first_time_at(det, last, 5.0)
    assert abs(convict - 5.61) < 0.02, convict
    assert abs(suspect - 5.06) < 0.02, suspect
    assert abs(det.expected_conviction_s() - convict) < 0.02


def test_jittery_peer_is_convicted_later_but_within_ten_seconds():
    det = PhiDetector()
    last = _feed(det, [200.0, 2200.0] * 50)  # mean 1.2 s, std 1 s
    assert abs(det.std_ms - 1000.0) < 1e-6
    convict = _first_time_at(det, last, 8.0)
    assert 5.0 < convict < 10.0
    assert abs(convict - (1.2 + 2.0 + z_of_phi(8.0) * 1.0)) < 0.02


def test_intervals_over_the_cap_are_not_recorded():
    capped, uncapped = PhiDetector(), PhiDetector(max_interval_ms=1e9)
    for det in (capped, uncapped):
        last = _feed(det, [1000.0] * 50)
        det.heartbeat(last + 60.0)  # the peer (or we) stopped for a minute
    assert 60_000.0 not in list(capped.intervals_ms())
    assert capped.mean_ms == 1000.0
    # Without the cap the one gap would make the next conviction take ages.
    assert capped.expected_conviction_s() < 6.0
    assert uncapped.expected_conviction_s() > 30.0
    # The arrival itself still counts: right after it the peer is not suspect.
    assert capped.phi(last + 60.0) < 1e-9


def test_window_is_bounded():
    det = PhiDetector(window_size=10)
    _feed(det, [1000.0] * 5 + [3000.0] * 20)
    assert list(det.intervals_ms()) == [3000.0] * 10
    assert det.mean_ms == 3000.0


def test_phi_of_matches_the_normal_tail_where_it_matters():
    # The logistic CDF is within 1e-4 of the normal one; phi 0.3 at the mean.
    assert abs(phi_of(0.0, 0.0, 1.0) - math.log10(2)) < 1e-12
    for y in (-1.0, 0.5, 1.0, 2.0):
        exact = -math.log10(0.5 * math.erfc(y / math.sqrt(2)))
        assert abs(phi_of(y, 0.0, 1.0) - exact) < 1e-3


def test_unknown_peer_is_never_convicted():
    fd = FailureDetector()
    assert fd.phi("nobody", 1e6) == 0.0
    assert not fd.is_convicted("nobody", 1e6)


def _regular(fd: FailureDetector, peers: list[str], start: float, end: float) -> None:
    """We tick and all peers heartbeat once a second over [start, end)."""
    t = start
    while t < end:
        fd.tick(t)
        for p in peers:
            fd.heartbeat(p, t)
        t += 1.0


def test_stall_guard_prevents_convictions_after_our_own_pause():
    fd = FailureDetector()
    unguarded = FailureDetector(stall_threshold_s=math.inf)
    for d in (fd, unguarded):
        _regular(d, ["alive", "dead"], 0.0, 60.0)
    resume = 59.0 + 30.0  # we were SIGSTOPped for 30 s; "dead" died meanwhile
    # Control: without the guard both peers look convicted the moment we resume.
    assert unguarded.is_convicted("alive", resume) and unguarded.is_convicted("dead", resume)

    # Before our first tick after the pause: the overdue tick keeps us quiet.
    assert fd.guarded(resume)
    assert not fd.is_convicted("alive", resume) and not fd.is_convicted("dead", resume)
    assert fd.tick(resume) is True and fd.stalls == 1

    convicted_dead_at = None
    t = resume
    for _ in range(40):  # 20 s after resuming, ticking every 0.5 s
        t += 0.5
        fd.tick(t)
        fd.heartbeat("alive", t)
        assert not fd.is_convicted("alive", t), t
        if convicted_dead_at is None and fd.is_convicted("dead", t):
            convicted_dead_at = t
    # The dead peer is convicted after the grace and a full conviction time of
    # silence measured from our resume, not from before our pause.
    assert convicted_dead_at is not None, "a dead peer must still be convicted"
    expected = max(fd.stall_grace_s, 5.61)
    assert expected <= convicted_dead_at - resume <= expected + 0.6, convicted_dead_at - resume
    # The pause was not recorded as an interval of either peer.
    for p in ("alive", "dead"):
        assert max(fd.detector(p).intervals_ms()) <= fd.detector(p).max_interval_ms


def test_grace_suppresses_even_a_tight_detector():
    fd = FailureDetector(min_std_ms=10.0, acceptable_pause_ms=0.0, stall_grace_s=5.0)
    _regular(fd, ["p"], 0.0, 30.0)
    fd.tick(29.0 + 10.0)  # stalled 10 s; p is dead
    t = 39.0
    while t < 39.0 + 4.9:
        t += 0.1
        fd.tick(t)
        assert not fd.is_convicted("p", t)
    fd.tick(39.0 + 5.1)
    assert fd.is_convicted("p", 39.0 + 5.1)


def test_short_gaps_between_ticks_are_not_stalls():
    fd = FailureDetector()
    for i in range(100):
        assert fd.tick(i * 1.9) is False
    assert fd.stalls == 0
