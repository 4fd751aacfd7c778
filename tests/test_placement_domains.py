"""Placement over failure domains: hosts and zones (ring.hashing.ring's Domain).

Property tests (hypothesis, bounded) of the promises docs/ARCHITECTURE.md and
docs/OPERATIONS.md make: no two replicas of a partition on one host while at
least RF hosts have brokers, distinct zones while there are at least RF
zones, every host (zone) holding one before any holds two, the natural leader
the token's owner whatever the domains (so leadership is exactly as even as
the ring), a broker joining or leaving changing only the lists it enters or
leaves, and a ring whose brokers each have a host of their own placing
exactly as before domains existed.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ring.gossip.state import EndpointState
from ring.hashing import TOKEN_MAX, TOKEN_MIN, Domain, Ring, broker_token, partition_replicas
from ring.node import placement

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

tokens_st = st.integers(min_value=TOKEN_MIN, max_value=TOKEN_MAX)


@st.composite
def domain_rings(draw, min_size: int = 1, max_size: int = 16) -> tuple[Ring, dict[str, Domain]]:
    """A ring of up to ``max_size`` brokers on random tokens, spread at random over a few hosts and zones;
    some brokers without a domain (a host of their own)."""
    n = draw(st.integers(min_size, max_size))
    toks = draw(st.lists(tokens_st, min_size=n, max_size=n, unique=True))
    hosts = draw(st.integers(1, max(1, n)))
    zones = draw(st.integers(0, 4))
    domains: dict[str, Domain] = {}
    for i in range(n):
        if draw(st.integers(0, 9)) == 0:
            continue  # no host gossiped: placed as a host of its own
        h = draw(st.integers(0, hosts - 1))
        # Every broker of one host is in that host's zone.
        host, zone = f"h{h}", None if zones == 0 else f"z{h % zones}"
        domains[f"b{i}"] = Domain(host, zone)
    return Ring(((f"b{i}", t) for i, t in enumerate(toks)), domains), domains


def _host(ring: Ring, name: str) -> str:
    return ring.domain_of(name).host


def _zone(ring: Ring, name: str) -> str | None:
    return ring.domain_of(name).zone


@SETTINGS
@given(domain_rings(), st.integers(1, 5), st.lists(tokens_st, min_size=1, max_size=20))
def test_no_host_holds_two_replicas_while_there_are_enough_hosts(rd, rf, probes) -> None:
    ring, _ = rd
    names = [n for _, n in ring.brokers]
    hosts = {_host(ring, n) for n in names}
    for tok in probes:
        replicas = ring.preference_list(tok, rf)
        assert len(replicas) == min(rf, len(names)) == len(set(replicas))
        assert replicas[0] == ring.leader(tok)  # the owner leads, whatever the domains
        held = Counter(_host(ring, r) for r in replicas)
        if len(hosts) >= rf:
            assert max(held.values()) == 1, (replicas, held)
        else:  # fewer hosts than replicas: every host holds one before any holds two
            assert set(held) == hosts, (replicas, held)


@SETTINGS
@given(domain_rings(), st.integers(1, 5), st.lists(tokens_st, min_size=1, max_size=20))
def test_replicas_sit_in_distinct_zones_while_there_are_enough_zones(rd, rf, probes) -> None:
    ring, _ = rd
    names = [n for _, n in ring.brokers]
    zones = {_zone(ring, n) for n in names}
    hosts = {_host(ring, n) for n in names}
    for tok in probes:
        replicas = ring.preference_list(tok, rf)
        in_zone = Counter(_zone(ring, r) for r in replicas)
        if len(zones) >= rf:
            # Zones first, hosts second: with enough zones every replica is in a zone of its own (each
            # zone holds a host, so hosts are distinct too).
            assert max(in_zone.values()) == 1, (replicas, in_zone)
        elif len(hosts) >= rf:
            assert len(in_zone) == min(len(zones), len(replicas))  # every zone used before one repeats


@SETTINGS
@given(domain_rings(min_size=2), st.integers(1, 5), st.lists(tokens_st, min_size=1, max_size=20), st.data())
def test_a_broker_joining_or_leaving_changes_only_the_lists_it_is_in(rd, rf, probes, data) -> None:
    ring, domains = rd
    names = [n for _, n in ring.brokers]
    leaving = data.draw(st.sampled_from(names))
    smaller = ring.without_broker(leaving)
    for tok in probes:
        before, after = ring.preference_list(tok, rf), smaller.preference_list(tok, rf)
        if before != after:
            assert leaving in before, (before, after)
        else:
            assert leaving not in before
        # The same change read the other way: the broker joining ``smaller``.
        grown = smaller.with_broker(leaving, ring.token_of(leaving), domains.get(leaving))
        assert grown == ring
        assert grown.preference_list(tok, rf) == before


@SETTINGS
@given(st.lists(tokens_st, min_size=1, max_size=24, unique=True), st.integers(1, 5),
       st.lists(tokens_st, min_size=1, max_size=20))
def test_brokers_each_on_a_host_of_their_own_place_as_without_domains(toks, rf, probes) -> None:
    """An upgrade moves nothing: a cluster whose brokers each sit on their own host (and gossip it, or
    gossip no host at all) keeps every partition where it was."""
    pairs = [(f"b{i}", t) for i, t in enumerate(toks)]
    plain = Ring(pairs)
    own_hosts = Ring(pairs, {n: Domain(f"host-of-{n}") for n, _ in pairs})
    some = Ring(pairs, {n: Domain(f"host-of-{n}") for n, _ in pairs[::2]})
    for tok in probes:
        expected = plain.preference_list(tok, rf)
        assert own_hosts.preference_list(tok, rf) == expected
        assert some.preference_list(tok, rf) == expected
        # The walk over the next brokers clockwise, as placement has always been.
        ordered = sorted((t, n) for n, t in pairs)
        start = next((i for i, (t, _) in enumerate(ordered) if t >= tok), 0)
        assert expected == [ordered[(start + k) % len(ordered)][1] for k in range(min(rf, len(ordered)))]


@SETTINGS
@given(st.integers(0, 3), st.integers(1, 4), st.integers(1, 4), st.text(min_size=1, max_size=20))
def test_leadership_at_three_times_a_power_of_two_stays_exactly_even_on_any_hosts(level, per_host, mult, topic):
    """Leadership is the ring's ownership, whatever the domains: at 3·2^k brokers every broker leads the
    same number of a topic's partitions (DESIGN's placement), also with several brokers per host."""
    n = 3 * 2**level
    ring = Ring(((f"ring-{i}", broker_token(i)) for i in range(n)),
                {f"ring-{i}": Domain(f"h{i // per_host}") for i in range(n)})
    partitions = n * mult
    leaders = Counter(partition_replicas(ring, topic, p, partitions, 3)[0] for p in range(partitions))
    assert set(leaders.values()) == {mult} and len(leaders) == n


def _endpoint(name: str, tok: int, **extra: object) -> EndpointState:
    return EndpointState(name, tok, f"{name}:1", f"{name}:2", 1, status="normal", extra=dict(extra))


def test_the_placement_ring_takes_the_host_and_zone_each_broker_gossips() -> None:
    eps = [_endpoint("ring-0", broker_token(0), host="a", zone="z1"),
           _endpoint("ring-1", broker_token(1), host="a", zone="z1"),
           _endpoint("ring-2", broker_token(2), host="b"),
           _endpoint("ring-3", broker_token(3))]  # gossips no host: a host of its own
    ring = placement.placement_ring(eps)
    assert ring.domain_of("ring-0") == Domain("a", "z1") == ring.domain_of("ring-1")
    assert ring.domain_of("ring-2") == Domain("b") and ring.domain_of("ring-3") == Domain("ring-3")
    for tok in (broker_token(i) for i in range(4)):
        replicas = ring.preference_list(tok, 3)
        assert "ring-0" not in replicas or "ring-1" not in replicas  # host a holds one of them at most
    # Same tokens, other domains: not the same ring (placement is computed anew).
    assert placement.placement_ring(eps[:2] + [_endpoint("ring-2", broker_token(2), host="a")] + eps[3:]) != ring


def test_a_walk_skips_a_host_already_chosen_and_comes_back_for_it_only_when_short() -> None:
    # Clockwise: a1 a2 b1 c1 (tokens 10..40).
    ring = Ring([("a1", 10), ("a2", 20), ("b1", 30), ("c1", 40)],
                {"a1": Domain("a"), "a2": Domain("a"), "b1": Domain("b"), "c1": Domain("c")})
    assert ring.preference_list(5, 3) == ["a1", "b1", "c1"]
    assert ring.preference_list(15, 3) == ["a2", "b1", "c1"]
    assert ring.preference_list(5, 4) == ["a1", "b1", "c1", "a2"]  # four replicas on three hosts
    zoned = Ring([("a1", 10), ("b1", 20), ("c1", 30), ("d1", 40)],
                 {"a1": Domain("a", "z1"), "b1": Domain("b", "z1"), "c1": Domain("c", "z2"), "d1": Domain("d", "z2")})
    assert zoned.preference_list(5, 2) == ["a1", "c1"]  # two zones for two replicas
    assert zoned.preference_list(5, 3) == ["a1", "c1", "d1"]  # both zones used: the next new host on


@SETTINGS
@given(st.integers(0, 3), st.integers(3, 6), st.integers(1, 5), st.lists(tokens_st, min_size=1, max_size=20))
def test_hosts_alternating_around_the_ring_place_as_without_hosts(level, hosts, rf, probes) -> None:
    """Brokers given hosts round-robin in ring order (docs/OPERATIONS.md's advice for several brokers per
    host): every preference list is the ring's own, so each broker holds the share the ring gives it."""
    n = 3 * 2**level * hosts
    order = [i for _, i in sorted((broker_token(i), i) for i in range(n))]
    plain = Ring((f"ring-{i}", broker_token(i)) for i in range(n))
    alternating = Ring(((f"ring-{i}", broker_token(i)) for i in range(n)),
                       {f"ring-{i}": Domain(f"h{pos % hosts}") for pos, i in enumerate(order)})
    for tok in probes + [broker_token(i) for i in range(min(n, 12))]:
        if rf <= hosts:
            assert alternating.preference_list(tok, rf) == plain.preference_list(tok, rf)
