"""Placement invariants: Murmur3 tokens, broker tokens, the ring, jump hash.

Unit tests pin the exact hash outputs every broker and client must agree on;
property tests (hypothesis, bounded) check the placement promises of
DESIGN.md: evenly spaced brokers at 3·2^k, even leadership, a new broker only
splitting one range, and growing a topic moving only ~1/(P+1) of keys, all to
the new partition.
"""

from __future__ import annotations

import math
from collections import Counter

import mmh3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ring.errors import Unavailable
from ring.hashing import (
    RING_SIZE,
    TOKEN_MAX,
    TOKEN_MIN,
    Ring,
    broker_token,
    jump_hash,
    ordinal_from_name,
    partition_for_key,
    partition_replicas,
    partition_token,
    token,
)

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

tokens_st = st.integers(min_value=TOKEN_MIN, max_value=TOKEN_MAX)
topics_st = st.text(min_size=1, max_size=40)


def ordinal_ring(count: int) -> Ring:
    return Ring((f"ring-{ordinal}", broker_token(ordinal)) for ordinal in range(count))


def range_lengths(ring: Ring) -> list[int]:
    """Length of every broker's range, wrap included (one broker: whole ring)."""
    return [(end - start) % RING_SIZE or RING_SIZE for start, end, _ in ring.ranges()]


# --- token ---------------------------------------------------------------------


def test_token_known_answers():
    # Pinned values: a change here moves every topic, partition and key.
    assert token(b"") == 0
    assert token(b"hello") == -3758069500696749310
    assert token(b"hello") == mmh3.hash64(b"hello", 0, True, True)[0]
    assert token(b"orders") == mmh3.hash64(b"orders", signed=True)[0]
    unsigned = mmh3.hash64(b"hello", signed=False)[0]
    assert token(b"hello") % RING_SIZE == unsigned


def test_token_is_signed_both_ways():
    values = [token(f"k{i}".encode()) for i in range(64)]
    assert any(v < 0 for v in values) and any(v > 0 for v in values)


def test_ring_constants():
    assert RING_SIZE == 2**64
    assert TOKEN_MIN == -(2**63) and TOKEN_MAX == 2**63 - 1
    assert TOKEN_MAX - TOKEN_MIN + 1 == RING_SIZE


@SETTINGS
@given(st.binary(max_size=200))
def test_token_range_and_determinism(data):
    first = token(data)
    assert isinstance(first, int) and TOKEN_MIN <= first <= TOKEN_MAX
    assert token(bytes(data)) == first
    assert first == mmh3.hash64(data, signed=True)[0]


# --- broker tokens -------------------------------------------------------------


def test_first_broker_tokens():
    third = RING_SIZE // 3
    assert broker_token(0) == TOKEN_MIN
    assert broker_token(1) == TOKEN_MIN + third
    assert broker_token(2) == TOKEN_MIN + (2 * RING_SIZE) // 3
    # Level 1 splits the three thirds at their midpoints.
    assert broker_token(3) == TOKEN_MIN + RING_SIZE // 6
    assert broker_token(4) == 0
    assert broker_token(5) == TOKEN_MIN + (5 * RING_SIZE) // 6


@pytest.mark.parametrize("level", range(5))
def test_three_times_power_of_two_brokers_are_evenly_spaced(level):
    count = 3 * 2**level
    lengths = range_lengths(ordinal_ring(count))
    assert len(lengths) == count
    ideal = RING_SIZE / count
    assert all(abs(length - ideal) <= 1 for length in lengths), lengths
    assert max(lengths) - min(lengths) <= 1


def test_each_new_ordinal_splits_one_range_at_its_midpoint():
    ring = ordinal_ring(3)
    for ordinal in range(3, 200):
        new = broker_token(ordinal)
        containing = [
            (start, end) for start, end, _ in ring.ranges() if _inside(new, start, end)
        ]
        assert len(containing) == 1
        start, end = containing[0]
        length = (end - start) % RING_SIZE
        assert abs((new - start) % RING_SIZE - length / 2) <= 1
        ring = ring.with_broker(f"ring-{ordinal}", new)


def _inside(tok: int, start_exclusive: int, end_inclusive: int) -> bool:
    if start_exclusive < end_inclusive:
        return start_exclusive < tok <= end_inclusive
    return tok > start_exclusive or tok <= end_inclusive


def test_growing_one_broker_at_a_time_stays_balanced():
    for count in range(3, 3 * 2**5 + 1):
        ring = ordinal_ring(count)
        lengths = range_lengths(ring)
        # Every range is one of two sizes, a factor two apart.
        assert max(lengths) <= 2 * min(lengths) + 2
        # New brokers are spread out, not bunched: cut the ring into 3·2^j
        # equal arcs at any coarser level j; brokers per arc differ by <= 1.
        for level in range(max(1, (count // 3).bit_length())):
            arcs = 3 * 2**level
            # (+arcs-1: a broker on an arc's start boundary counts in that arc, not the one before.)
            per_arc = Counter(
                ((tok - TOKEN_MIN) * arcs + arcs - 1) // RING_SIZE
                for tok, _ in ring.brokers
            )
            counts = [per_arc[arc] for arc in range(arcs)]
            assert max(counts) - min(counts) <= 1, (count, level, counts)


def test_broker_tokens_distinct_and_in_range():
    tokens = [broker_token(ordinal) for ordinal in range(3 * 2**10)]
    assert len(set(tokens)) == len(tokens)
    assert all(TOKEN_MIN <= t <= TOKEN_MAX for t in tokens)
    for ordinal in (10**6, 2**40 + 7, 3 * 2**61):
        assert TOKEN_MIN <= broker_token(ordinal) <= TOKEN_MAX
        assert broker_token(ordinal) == broker_token(ordinal)


@pytest.mark.parametrize("bad", [-1, 1.0, "3", True])
def test_broker_token_rejects_bad_ordinals(bad):
    with pytest.raises(ValueError):
        broker_token(bad)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("ring-0", 0),
        ("kafka-12", 12),
        ("my-cluster-ring-7", 7),
        ("ring-007", 7),
        ("ring", None),
        ("ring-", None),
        ("-3", None),
        ("ring-1a", None),
        ("ring-1\n", None),
        ("ring-١", None),  # non-ASCII digit
        ("", None),
    ],
)
def test_ordinal_from_name(name, expected):
    assert ordinal_from_name(name) == expected


# --- partition tokens and leadership -------------------------------------------


@SETTINGS
@given(topics_st, st.integers(1, 64), st.data())
def test_partition_token_formula(topic, partitions, data):
    partition = data.draw(st.integers(0, partitions - 1))
    got = partition_token(topic, partition, partitions)
    base = mmh3.hash64(topic.encode(), signed=False)[0]
    expected_unsigned = (base + partition * 2**64 // partitions) % 2**64
    assert got % RING_SIZE == expected_unsigned
    assert TOKEN_MIN <= got <= TOKEN_MAX
    if partition == 0:
        assert got == token(topic.encode())


@pytest.mark.parametrize("args", [("t", 0, 0), ("t", 3, 3), ("t", -1, 3)])
def test_partition_token_rejects_bad_partitions(args):
    with pytest.raises(ValueError):
        partition_token(*args)


@SETTINGS
@given(topics_st, st.integers(0, 4), st.integers(1, 4))
def test_leadership_is_even_at_three_times_power_of_two(topic, level, multiplier):
    brokers = 3 * 2**level
    ring = ordinal_ring(brokers)
    partitions = brokers * multiplier
    leaders = Counter(
        partition_replicas(ring, topic, p, partitions, 3)[0] for p in range(partitions)
    )
    assert len(leaders) == brokers
    assert set(leaders.values()) == {multiplier}


@SETTINGS
@given(topics_st, st.integers(1, 16), st.integers(0, 80))
def test_growing_a_topic_keeps_every_partition_token(topic, base, added):
    """Partitions added later split the ranges between existing ones; the old ones never move."""
    grown = base + added
    before = [partition_token(topic, p, base) for p in range(base)]
    after = [partition_token(topic, p, grown, base) for p in range(grown)]
    assert after[:base] == before
    assert len(set(after)) == grown
    for p in range(grown):  # the count a partition is placed with does not matter, only the base
        assert partition_token(topic, p, max(p + 1, base), base) == after[p]


@SETTINGS
@given(topics_st, st.integers(1, 12), st.integers(0, 5))
def test_grown_partitions_are_evenly_spaced_at_base_times_power_of_two(topic, base, level):
    partitions = base << level
    start = token(topic.encode()) % RING_SIZE
    offsets = sorted((partition_token(topic, p, partitions, base) - start) % RING_SIZE for p in range(partitions))
    gaps = [b - a for a, b in zip(offsets, offsets[1:] + [offsets[0] + RING_SIZE])]
    assert max(gaps) - min(gaps) <= 1


@pytest.mark.parametrize("args", [("t", 0, 3, 4), ("t", 0, 3, 0), ("t", 0, 3, True)])
def test_partition_token_rejects_bad_bases(args):
    with pytest.raises(ValueError):
        partition_token(*args)


def test_partition_replicas_is_preference_list_of_partition_token():
    ring = ordinal_ring(5)
    for p in range(8):
        tok = partition_token("orders", p, 8)
        replicas = partition_replicas(ring, "orders", p, 8, 3)
        assert replicas == ring.preference_list(tok, 3)
        assert replicas[0] == ring.leader(tok)


# --- adding a broker -----------------------------------------------------------


@SETTINGS
@given(
    st.integers(1, 40),
    st.integers(1, 5),
    st.lists(tokens_st, min_size=1, max_size=60),
)
def test_adding_next_ordinal_only_changes_lists_that_gain_it(count, rf, probes):
    before = ordinal_ring(count)
    new_name, new_token = f"ring-{count}", broker_token(count)
    after = before.with_broker(new_name, new_token)
    previous_token = max(
        (t for t, _ in before.brokers if t < new_token), default=before.brokers[-1][0]
    )
    # Tokens at the edges of the split range, plus random ones.
    edges = [new_token, new_token - 1, previous_token, previous_token + 1]
    for tok in probes + [t for t in edges if TOKEN_MIN <= t <= TOKEN_MAX]:
        old = before.preference_list(tok, rf)
        new = after.preference_list(tok, rf)
        if new == old:
            assert new_name not in new
            continue
        assert new_name in new
        # The new broker slots in; everyone else keeps their order.
        without = [name for name in new if name != new_name]
        assert without == old[: len(without)]
        # Only tokens in the split range change leader, and they go to the newcomer.
        in_split = _inside(tok, previous_token, new_token)
        assert (after.leader(tok) != before.leader(tok)) == in_split
        if in_split:
            assert after.leader(tok) == new_name


# --- the Ring ------------------------------------------------------------------

rings_st = st.dictionaries(
    st.text(min_size=1, max_size=8), tokens_st, min_size=1, max_size=20
).filter(lambda d: len(set(d.values())) == len(d))


def reference_preference_list(pairs, tok, rf):
    ordered = sorted((t, n) for n, t in pairs)
    start = next((i for i, (t, _) in enumerate(ordered) if t >= tok), 0)
    rotated = ordered[start:] + ordered[:start]
    return [name for _, name in rotated[:rf]]


@SETTINGS
@given(rings_st, tokens_st, st.integers(1, 25))
def test_preference_list_matches_linear_scan(brokers, tok, rf):
    ring = Ring(brokers.items())
    got = ring.preference_list(tok, rf)
    assert got == reference_preference_list(brokers.items(), tok, rf)
    assert len(got) == min(rf, len(brokers))
    assert len(set(got)) == len(got)
    assert got[0] == ring.leader(tok)
    owner = [name for start, end, name in ring.ranges() if _inside(tok, start, end)]
    assert owner == [got[0]]


@SETTINGS
@given(rings_st)
def test_ranges_and_brokers_are_consistent(brokers):
    ring = Ring(brokers.items())
    assert ring.brokers == sorted((t, n) for n, t in brokers.items())
    ranges = ring.ranges()
    assert [(end, name) for _, end, name in ranges] == ring.brokers
    # Ranges tile the ring: each starts where the previous one ended.
    ends = [end for _, end, _ in ranges]
    assert [start for start, _, _ in ranges] == ends[-1:] + ends[:-1]
    assert sum(range_lengths(ring)) == RING_SIZE
    for name, tok in brokers.items():
        assert ring.leader(tok) == name


@SETTINGS
@given(rings_st, st.text(min_size=1, max_size=8), tokens_st)
def test_with_and_without_broker(brokers, name, tok):
    ring = Ring(brokers.items())
    if name in brokers or tok in brokers.values():
        with pytest.raises(ValueError):
            ring.with_broker(name, tok)
        return
    grown = ring.with_broker(name, tok)
    assert len(grown) == len(ring) + 1 and name in grown
    assert grown.leader(tok) == name
    assert grown.without_broker(name) == ring
    assert len(ring) == len(brokers)  # the original is untouched


def test_ring_rejects_duplicates_and_bad_tokens():
    with pytest.raises(ValueError):
        Ring([("a", 1), ("b", 1)])
    with pytest.raises(ValueError):
        Ring([("a", 1), ("a", 2)])
    with pytest.raises(ValueError):
        Ring([("a", TOKEN_MAX + 1)])
    with pytest.raises(ValueError):
        Ring([("a", True)])
    with pytest.raises(KeyError):
        Ring([("a", 1)]).without_broker("b")
    ring = Ring([("a", 1)])
    with pytest.raises(ValueError):
        ring.preference_list(0, 0)
    with pytest.raises(ValueError):
        ring.leader(TOKEN_MIN - 1)


def test_single_and_empty_ring():
    single = Ring([("only", 5)])
    assert single.ranges() == [(5, 5, "only")]
    assert single.preference_list(TOKEN_MAX, 3) == ["only"]
    assert single.leader(TOKEN_MIN) == "only"
    empty = Ring([])
    assert empty.preference_list(0, 3) == []
    assert empty.ranges() == [] and empty.brokers == []
    with pytest.raises(Unavailable):
        empty.leader(0)


def test_wraps_past_the_highest_token():
    ring = Ring([("a", -100), ("b", 0), ("c", 100)])
    assert ring.preference_list(101, 2) == ["a", "b"]
    assert ring.preference_list(TOKEN_MAX, 3) == ["a", "b", "c"]
    assert ring.preference_list(TOKEN_MIN, 3) == ["a", "b", "c"]
    assert ring.preference_list(0, 3) == ["b", "c", "a"]
    assert ring.preference_list(1, 5) == ["c", "a", "b"]


# --- jump hash -----------------------------------------------------------------


def test_jump_hash_known_answers():
    # Values from the published C++ reference implementation.
    assert jump_hash(123456, 1000) == 984
    assert jump_hash(256, 1024) == 520
    assert jump_hash(0, 1) == 0


@SETTINGS
@given(st.integers(-(2**63), 2**64 - 1), st.integers(1, 10_000))
def test_jump_hash_range_stability_and_monotonicity(key_hash, buckets):
    bucket = jump_hash(key_hash, buckets)
    assert 0 <= bucket < buckets
    assert jump_hash(key_hash, buckets) == bucket
    assert jump_hash(key_hash % RING_SIZE, buckets) == bucket  # unsigned view
    assert jump_hash(key_hash, buckets + 1) in (bucket, buckets)


@pytest.mark.parametrize("bad", [0, -1])
def test_jump_hash_rejects_empty_bucket_sets(bad):
    with pytest.raises(ValueError):
        jump_hash(1, bad)


KEYS = [f"user-{i}".encode() for i in range(20_000)]
KEY_TOKENS = [token(key) for key in KEYS]


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 8, 16, 63])
def test_growing_a_topic_moves_about_one_in_p_plus_one_keys(partitions):
    before = [jump_hash(t, partitions) for t in KEY_TOKENS]
    after = [jump_hash(t, partitions + 1) for t in KEY_TOKENS]
    moved = [(old, new) for old, new in zip(before, after) if old != new]
    # Exact: keys only ever move to the new partition.
    assert all(new == partitions for _, new in moved)
    # Statistical: binomial(n, 1/(P+1)), allowed six standard deviations.
    n, p = len(KEYS), 1 / (partitions + 1)
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(len(moved) - n * p) <= 6 * sigma, (len(moved), n * p)


def test_keys_spread_evenly_over_partitions():
    partitions = 16
    counts = Counter(partition_for_key(key, partitions) for key in KEYS)
    expected = len(KEYS) / partitions
    sigma = math.sqrt(len(KEYS) * (1 / partitions) * (1 - 1 / partitions))
    assert set(counts) == set(range(partitions))
    assert all(abs(c - expected) <= 6 * sigma for c in counts.values()), counts


def test_partition_for_key_is_jump_of_token():
    for key in KEYS[:200]:
        assert partition_for_key(key, 12) == jump_hash(token(key), 12)
