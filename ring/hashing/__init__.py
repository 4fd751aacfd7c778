"""Placement: Murmur3 tokens, deterministic broker tokens, the broker ring,
and key -> partition hashing. Pure functions and immutable values only: no I/O,
no clock, no randomness, so every broker computes the same placement from the
same membership.
"""

from ring.hashing.jump import jump_hash, partition_for_key
from ring.hashing.murmur import RING_SIZE, TOKEN_MAX, TOKEN_MIN, token
from ring.hashing.ring import Domain, Ring, partition_replicas
from ring.hashing.tokens import broker_token, ordinal_from_name, partition_token

__all__ = [
    "RING_SIZE",
    "TOKEN_MAX",
    "TOKEN_MIN",
    "Domain",
    "Ring",
    "broker_token",
    "jump_hash",
    "ordinal_from_name",
    "partition_for_key",
    "partition_replicas",
    "partition_token",
    "token",
]
