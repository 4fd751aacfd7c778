"""One fetch request as one value: ``Fetch``.

Every front that reads a partition (the client port's ``ring.http_api.app``,
the Kafka listener's fetch, the group poller) parses and bounds its
parameters once and builds a ``Fetch``; the broker, its router
(``ring.cluster.routing``, ``ring.replication.local``) and the replica's read
(``ring.replication.reads``) take it as it is. It sits beside ``ring.produce``,
below every layer that carries it.
"""

from __future__ import annotations

from typing import NamedTuple


class Fetch(NamedTuple):  # a tuple: made per request, and a frozen dataclass costs a microsecond to make
    """A read of ``partition`` of ``topic`` from ``offset`` (None: the partition's earliest): whole
    stored batches up to ``max_bytes`` (at least one batch), waiting up to ``wait_ms`` for records
    when there are none yet, and no more batches than hold ``max_records`` records from ``offset``
    (None: as many as ``max_bytes`` holds)."""

    topic: str
    partition: int
    offset: int | None
    max_bytes: int
    wait_ms: int = 0
    max_records: int | None = None
