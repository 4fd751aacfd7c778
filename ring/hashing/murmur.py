"""Murmur3 tokens: the one hash that places topics, partitions and keys.

Everything ring places lives on a circle of 2**64 signed 64-bit tokens, the
same token space Cassandra's Murmur3Partitioner uses. ``token`` is the first
64 bits of Murmur3 x64-128 (seed 0) as computed by ``mmh3.hash64(data,
seed=0, x64arch=True, signed=True)[0]``; every broker and client must agree on
it bit for bit, so it is pinned by known-answer tests. The helpers here move
between the signed token and its unsigned (two's-complement) form, because
ring arithmetic (rotations, jump hash) is done modulo 2**64.
"""

from __future__ import annotations

import mmh3

RING_SIZE = 2**64
TOKEN_MIN = -(2**63)
TOKEN_MAX = 2**63 - 1


def token(data: bytes) -> int:
    """Signed 64-bit token of ``data``: mmh3.hash64(data, signed=True)[0]."""
    # Explicit arguments: a future mmh3 default change must not move every key.
    return mmh3.hash64(data, 0, True, True)[0]


def to_unsigned(signed_token: int) -> int:
    """Two's-complement view of a signed token, in [0, 2**64)."""
    return signed_token % RING_SIZE


def to_signed(value: int) -> int:
    """Reduce any integer modulo 2**64 and return it as a signed token."""
    value %= RING_SIZE
    return value - RING_SIZE if value > TOKEN_MAX else value


def is_token(value: object) -> bool:
    """True for an int (not a bool) inside [TOKEN_MIN, TOKEN_MAX]."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and TOKEN_MIN <= value <= TOKEN_MAX
    )
