"""Deterministic tokens for brokers and partitions.

A broker named ``NAME-<ordinal>`` (StatefulSet style) gets a token computed
from its ordinal alone, so a cluster needs no token assignment step and every
broker computes the same ring. Ordinals 0..2 sit at thirds of the ring,
starting at TOKEN_MIN. Ordinals 3·2^(k-1) .. 3·2^k - 1 ("level k") each split
one range of level k-1 at its midpoint, so at 3·2^k brokers the ring is cut
into exactly equal ranges (up to 1 token of integer rounding) and adding one
broker only ever splits one existing range in two. Within a level the ranges
are split third by third (round-robin over the three thirds) and, inside a
third, in bit-reversed order, so a cluster grown one broker at a time has its
new, smaller ranges spread around the ring rather than bunched together.

Partitions follow the same scheme with the topic's partition count at
creation, B, in place of 3: partition p < B of a topic sits at
``token(topic) + p·2^64/B`` (mod 2^64), evenly spaced and rotated per topic,
so leadership of the topics' partitions spreads evenly over evenly spaced
brokers. Partitions added when the topic grows split the existing ranges at
their midpoints, level by level, so a partition's token never changes when
the topic grows and at B·2^k partitions they are evenly spaced again.
"""

from __future__ import annotations

import re

from ring.hashing.murmur import RING_SIZE, TOKEN_MIN, to_signed, token

_ORDINAL_SUFFIX = re.compile(r".+-([0-9]+)", re.ASCII | re.DOTALL)


def _bit_reverse(value: int, width: int) -> int:
    """``value``'s lowest ``width`` bits in reverse order."""
    result = 0
    for _ in range(width):
        result = (result << 1) | (value & 1)
        value >>= 1
    return result


def position(index: int, base: int) -> tuple[int, int]:
    """(numerator, denominator) of the ring fraction of the ``index``-th point when ``base`` points
    start evenly spaced and each later level of points splits every range of the one before.

    Indexes below ``base`` sit at index/base; the denominator is base·2^k for
    the level k the index belongs to, so the fraction is exact and points of
    different levels agree on shared points.
    """
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"index must be an int >= 0, got {index!r}")
    if index < base:
        return index, base
    level = (index // base).bit_length()  # indexes base·2^(level-1) .. base·2^level-1
    ranges_before = base << (level - 1)  # ranges existing when this level starts
    offset = index - ranges_before  # 0 .. ranges_before-1
    first = offset % base  # round-robin over the base ranges ...
    within = _bit_reverse(offset // base, level - 1)  # ... and bit-reversed inside each
    split_range = first * (1 << (level - 1)) + within
    return 2 * split_range + 1, base << level


def broker_position(ordinal: int) -> tuple[int, int]:
    """(numerator, denominator) of the ring fraction where ``ordinal`` sits (base 3)."""
    if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
        raise ValueError(f"broker ordinal must be an int >= 0, got {ordinal!r}")
    return position(ordinal, 3)


def broker_token(ordinal: int) -> int:
    """Deterministic token of the broker with this ordinal (any ordinal >= 0).

    Distinct for ordinals below 3·2^62, far beyond any real cluster size.
    """
    numerator, denominator = broker_position(ordinal)
    return TOKEN_MIN + numerator * RING_SIZE // denominator


def ordinal_from_name(name: str) -> int | None:
    """The ordinal in a ``NAME-<digits>`` broker name, else None.

    ``ring-0`` -> 0, ``kafka-12`` -> 12; a name without a non-empty prefix,
    or without trailing ASCII digits after the last dash, has no ordinal.
    """
    match = _ORDINAL_SUFFIX.fullmatch(name)
    return int(match.group(1)) if match else None


def partition_token(topic: str, partition: int, partitions: int, base: int | None = None) -> int:
    """Token of ``partition`` of a topic with ``partitions`` partitions, created with ``base``
    (default: ``partitions``, a topic that never grew)."""
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    if not isinstance(partition, int) or not 0 <= partition < partitions:
        raise ValueError(f"partition {partition!r} not in [0, {partitions})")
    base = partitions if base is None else base
    if not isinstance(base, int) or isinstance(base, bool) or not 1 <= base <= partitions:
        raise ValueError(f"base partitions must be an int in [1, {partitions}], got {base!r}")
    numerator, denominator = position(partition, base)
    return to_signed(token(topic.encode()) + numerator * RING_SIZE // denominator)
