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

Partition p of P of a topic sits at ``token(topic) + p·2^64/P`` (mod 2^64):
evenly spaced and rotated per topic, so leadership of the topics' partitions
spreads evenly over evenly spaced brokers.
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


def broker_position(ordinal: int) -> tuple[int, int]:
    """(numerator, denominator) of the ring fraction where ``ordinal`` sits.

    The denominator is 3·2^k for the level k the ordinal belongs to; the
    fraction is exact, so tokens of different levels agree on shared points.
    """
    if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
        raise ValueError(f"broker ordinal must be an int >= 0, got {ordinal!r}")
    if ordinal < 3:
        return ordinal, 3
    level = (ordinal // 3).bit_length()  # ordinals 3·2^(level-1) .. 3·2^level-1
    ranges_before = 3 << (level - 1)  # ranges existing when this level starts
    index = ordinal - ranges_before  # 0 .. ranges_before-1
    third = index % 3
    within = _bit_reverse(index // 3, level - 1)
    split_range = third * (1 << (level - 1)) + within
    return 2 * split_range + 1, 3 << level


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


def partition_token(topic: str, partition: int, partitions: int) -> int:
    """Token of ``partition`` of a topic with ``partitions`` partitions."""
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    if not isinstance(partition, int) or not 0 <= partition < partitions:
        raise ValueError(f"partition {partition!r} not in [0, {partitions})")
    offset = partition * RING_SIZE // partitions
    return to_signed(token(topic.encode()) + offset)
