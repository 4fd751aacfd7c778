"""Where a range lives: its token on the ring and the brokers that hold it (pure).

A range of partition ``p`` of topic ``t`` starting at offset ``base`` sits at
``murmur3("t/p/base")``: ranges of one partition scatter over the whole ring,
so a long partition's storage and its backlog reads spread over every
broker. Its holders are the first ``copies`` brokers clockwise from that
token on the same ring partitions use (``ring.node.placement``: every
broker not removed, down ones included), so a join, a decommission or the
down-grace removal moves ranges as it moves partitions, and a broker down
only briefly moves nothing. Brokers that say they are full (free disk below
their floor, gossiped) are passed over, except where they already hold the
range: a full broker takes no new range but keeps what it has.
"""

from __future__ import annotations

from typing import Collection

from ring.hashing import Ring, token


def range_token(topic: str, partition: int, base: int) -> int:
    return token(f"{topic}/{partition}/{base}".encode())


def copies_for(rf: int, ring: Ring) -> int:
    """How many holders a range gets: the topic's replication factor, capped at the ring's size."""
    return max(0, min(rf, len(ring)))


def holders(ring: Ring, topic: str, partition: int, base: int, copies: int,
            full: Collection[str] = (), keep: Collection[str] = ()) -> list[str]:
    """The brokers that should hold the range at ``base``, in ring order from its token.

    ``full``: brokers that take no new range; one of them still counts where
    it is in ``keep`` (it holds a verified copy already).
    """
    if not len(ring) or copies <= 0:
        return []
    order = ring.preference_list(range_token(topic, partition, base), len(ring))
    return [b for b in order if b not in full or b in keep][:copies]
