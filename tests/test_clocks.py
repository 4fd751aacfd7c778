"""The clock-offset estimator (ring/gossip/clocks.py): measurements, the judgement, a stepped clock;
and membership's rule that a starting broker joins only once it has judged its clock."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ring.gossip.clocks import OK, OUT_OF_BOUNDS, UNKNOWN, WARNING, ClockOffsets, describe_ms, needed
from ring.gossip.core import Syn
from ring.gossip.state import EndpointState
from ring.hashing import broker_token
from ring.node.core import NodeCore
from ring.node.members import Members
from ring.node.ready import ClockRead, GossipIn

DAY_MS = 86_400_000
WALL = 1_700_000_000_000  # our wall clock, ms


def mk(max_ms: float = 2000, warn_ms: float = 1000, rtt_max_ms: float = 1000, ttl_s: float = 30) -> ClockOffsets:
    return ClockOffsets(max_ms, warn_ms, rtt_max_ms, ttl_s)


def measure(c: ClockOffsets, peer: str, now_s: float, peer_ahead_ms: float, rtt_s: float = 0.002,
            answered_at: float = 0.5):
    """A round trip ending at ``now_s`` to a peer whose clock is ``peer_ahead_ms`` ahead of ours; the peer
    reads its clock ``answered_at`` of the way through the trip."""
    sent_wall = WALL + int((now_s - rtt_s) * 1000)
    peer_wall = int(sent_wall + answered_at * rtt_s * 1000 + peer_ahead_ms)
    return c.sample(peer, now_s, sent_wall, rtt_s, peer_wall)


@settings(max_examples=200, deadline=None)
@given(st.floats(-10 * DAY_MS, 10 * DAY_MS), st.floats(0.0, 0.9), st.floats(0.0, 1.0))
def test_an_estimate_is_within_half_the_round_trip(true_ms, rtt_s, answered_at):
    got = measure(mk(), "b", 100.0, true_ms, rtt_s, answered_at)
    assert got is not None
    assert got.uncertainty_ms == rtt_s * 500
    assert abs(got.offset_ms - true_ms) <= got.uncertainty_ms + 1  # + the ms the wall clocks are read in


def test_a_slow_round_trip_or_one_across_a_step_is_dropped():
    c = mk(rtt_max_ms=500)
    assert measure(c, "b", 10.0, 0, rtt_s=0.6) is None
    assert measure(c, "b", 10.0, 0, rtt_s=0.4) is not None
    c.observe(20.0, WALL + 20_000)
    c.observe(21.0, WALL + 21_000 + 60_000)  # set 60 s ahead at about 21 s
    assert measure(c, "b", 21.2, -60_000, rtt_s=0.3) is None  # left before the step
    assert measure(c, "b", 21.5, -60_000, rtt_s=0.3) is not None


def test_no_peer_alive_is_ok_and_peers_unmeasured_are_unknown():
    c = mk()
    assert c.judge(0.0, live_peers=0).state == OK
    v = c.judge(0.0, live_peers=2)
    assert v.state == UNKNOWN and v.offset_ms is None and not v.usable
    measure(c, "b", 1.0, 0)
    assert c.judge(1.0, live_peers=2).state == UNKNOWN  # one of two peers cannot tell who is wrong
    measure(c, "c", 1.5, 0)
    v = c.judge(1.5, live_peers=2)
    assert v.state == OK and v.usable and v.measured == 2 and abs(v.offset_ms) <= 2


def test_needed_peers():
    assert [needed(n) for n in range(7)] == [0, 1, 2, 2, 2, 3, 3]


def test_the_skewed_broker_of_three_is_out_and_the_others_are_not():
    skewed, healthy = mk(), mk()
    measure(skewed, "b", 5.0, -8 * DAY_MS)  # b and c are 8 days behind the skewed broker
    measure(skewed, "c", 5.0, -8 * DAY_MS)
    v = skewed.judge(5.0, live_peers=2)
    assert v.state == OUT_OF_BOUNDS and not v.usable and v.far == 2
    assert abs(v.offset_ms - 8 * DAY_MS) <= 2
    assert "8.0 d ahead" in v.reason
    measure(healthy, "a", 5.0, 8 * DAY_MS)
    measure(healthy, "c", 5.0, 3)
    v = healthy.judge(5.0, live_peers=2)
    assert v.state == OK and abs(v.offset_ms) <= 5 and v.far == 1


def test_two_brokers_that_disagree_both_stop_using_their_clocks():
    a, b = mk(), mk()
    measure(a, "b", 1.0, -60_000)
    measure(b, "a", 1.0, 60_000)
    assert a.judge(1.0, live_peers=1).state == OUT_OF_BOUNDS
    assert b.judge(1.0, live_peers=1).state == OUT_OF_BOUNDS


def test_warning_between_the_bounds_and_uncertainty_gives_the_benefit_of_the_doubt():
    c = mk(max_ms=2000, warn_ms=1000)
    measure(c, "b", 1.0, -1500)
    measure(c, "c", 1.0, -1500)
    assert c.judge(1.0, 2).state == WARNING
    c = mk(max_ms=2000, warn_ms=1000)
    measure(c, "b", 1.0, -2100, rtt_s=0.4)  # 2.1 s +- 0.2 s: not certainly beyond 2 s
    measure(c, "c", 1.0, -2100, rtt_s=0.4)
    assert c.judge(1.0, 2).state == WARNING
    measure(c, "b", 2.0, -2300, rtt_s=0.2)
    measure(c, "c", 2.0, -2300, rtt_s=0.2)
    assert c.judge(2.0, 2).state == OUT_OF_BOUNDS


def test_the_last_judgement_stands_while_peers_are_unreachable():
    c = mk(ttl_s=30)
    measure(c, "b", 1.0, -8 * DAY_MS)
    measure(c, "c", 1.0, -8 * DAY_MS)
    assert c.judge(1.0, 2).state == OUT_OF_BOUNDS
    assert c.fresh(100.0) == {}
    assert c.judge(100.0, 2).state == OUT_OF_BOUNDS  # nothing fresh: not forgiven
    assert c.judge(100.0, 0).state == OUT_OF_BOUNDS  # alone now: still not forgiven
    measure(c, "b", 101.0, 0)
    measure(c, "c", 101.0, 0)
    assert c.judge(101.0, 2).state == OK  # measured back within bounds


def test_the_latest_measurement_of_a_peer_counts():
    c = mk()
    measure(c, "b", 1.0, -60_000)
    measure(c, "c", 1.0, -60_000)
    assert c.judge(1.0, 2).state == OUT_OF_BOUNDS
    measure(c, "b", 2.0, 0)  # our clock was corrected slowly (no step): the peers agree again
    measure(c, "c", 2.0, 0)
    assert c.judge(2.0, 2).state == OK


def test_a_stepped_clock_forgets_what_it_measured():
    c = mk(warn_ms=1000)
    assert not c.observe(0.0, WALL)
    assert not c.observe(1.0, WALL + 1000 + 400)  # drift under half the warning bound
    measure(c, "b", 1.5, 0)
    measure(c, "c", 1.5, 0)
    assert c.judge(1.5, 2).state == OK
    assert c.observe(2.0, WALL + 2000 + 400 + 8 * DAY_MS)
    assert c.fresh(2.0) == {}
    assert c.judge(2.0, 2).state == UNKNOWN
    measure(c, "b", 3.0, -8 * DAY_MS)
    measure(c, "c", 3.0, -8 * DAY_MS)
    assert c.judge(3.0, 2).state == OUT_OF_BOUNDS


def test_an_even_count_takes_the_median_nearer_zero():
    c = mk()
    for p, ahead in (("b", -8 * DAY_MS), ("c", 0), ("d", -8 * DAY_MS), ("e", 10)):
        measure(c, p, 1.0, ahead)
    v = c.judge(1.0, 4)
    assert v.state == OK and v.far == 2 and abs(v.offset_ms) <= 10  # two of four: not more than half


def test_describe():
    assert describe_ms(8 * DAY_MS) == "8.0 d ahead"
    assert describe_ms(-61_200) == "61.2 s behind"
    assert describe_ms(340) == "340 ms ahead"


def _core(name: str, wall_ms: int, seeds: list[str]) -> NodeCore:
    ordinal = int(name.rpartition("-")[2])
    me = EndpointState(name, broker_token(ordinal), f"h:{10 * ordinal}", f"h:{10 * ordinal + 1}",
                       generation=wall_ms, status="joining")
    members = Members(me, seeds, random.Random(1))
    members.restore(None, None, 0.0)  # as a broker starts: its clock judged with no live peer yet
    core = NodeCore(name, lambda t, p: None, lambda: [], True, random.Random(2), members)
    core.step(0.0, ClockRead(wall_ms))
    return core


def test_a_starting_broker_reached_first_by_a_peer_stays_joining_until_it_has_measured_a_clock() -> None:
    peer = _core("ring-1", WALL, ["h:1"])
    skewed = _core("ring-0", WALL + 8 * DAY_MS, ["h:11"])
    # The peer's exchange reaches it before its own: SYN, its ACK, the peer's ACK2. It now knows its
    # seed and a live peer, and has measured no clock (only exchanges it starts do).
    ack = skewed.step(0.1, GossipIn("h:11", Syn(peer.name, peer.members.gossip.state.digest()))).reply
    for dst, ack2 in peer.step(0.1, GossipIn("h:1", ack)).sends:
        skewed.step(0.1, GossipIn(dst, ack2))
    assert skewed.members.live_peers(0.1) == ["ring-1"]
    assert skewed.members.clock.verdict.state == UNKNOWN and not skewed.members.joined
