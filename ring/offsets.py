"""An offset lookup, a leader epoch's end and a truncate, each as one value: ``OffsetsAt``, ``EpochEnd`` and
``Truncate``.

Every front that asks where a time falls in a partition (the client port's
``ring.http_api.app``, the Kafka listener's ListOffsets, the group
coordinator's resets and its members' first polls) parses and checks the
time once and builds an ``OffsetsAt``; the broker, its router
(``ring.cluster.routing``, ``ring.replication.local``), the ranges below the
log (``ring.ranges.remote``) and the replica's lookup
(``ring.replication.reads``) take it as it is. A truncate is a ``Truncate``,
built by the client port's front; an ``EpochEnd`` is the Kafka listener's
OffsetForLeaderEpoch, answered by the partition's leader alone. Both sit beside ``ring.fetch`` and
``ring.produce``, below every layer that carries them.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Union

from ring.errors import BadRequest

EARLIEST = "earliest"  # the partition's first offset
LATEST = "latest"  # its high watermark: what is read from there is what arrives next

At = Union[int, str]  # milliseconds since the epoch, EARLIEST or LATEST

_INTEGER = re.compile(r"-?[0-9]+")


def is_integer(raw: str) -> bool:
    """Whether ``raw`` is a decimal integer in ASCII digits: ``int`` also takes other scripts'
    digits ("١٢"), underscores, a plus sign and surrounding spaces, which no client means."""
    return raw.isascii() and _INTEGER.fullmatch(raw) is not None


class OffsetsAt(NamedTuple):
    """The first offset of ``partition`` of ``topic`` whose record's timestamp is at or after ``at``
    (milliseconds since the epoch), or its EARLIEST or LATEST offset."""

    topic: str
    partition: int
    at: At


def parse_at(text: str | None) -> At:
    """A ``timestamp`` parameter as a front reads it: a decimal integer in ASCII digits, ``earliest`` or
    ``latest``."""
    if text in (EARLIEST, LATEST):
        return text
    if text is None or not is_integer(text):
        raise BadRequest("timestamp is required: milliseconds since the epoch (ASCII digits), earliest or latest")
    return int(text)


class EpochEnd(NamedTuple):
    """Where leader epoch ``leader_epoch`` of ``partition`` of ``topic`` ended in its leader's log (Kafka's
    OffsetForLeaderEpoch), asked by a client whose metadata names ``current_leader_epoch`` (-1: unchecked)."""

    topic: str
    partition: int
    current_leader_epoch: int
    leader_epoch: int


class Truncate(NamedTuple):
    """Delete the records of ``partition`` of ``topic`` below ``before_offset`` (Kafka's deleteRecords)."""

    topic: str
    partition: int
    before_offset: int
