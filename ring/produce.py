"""One produce request as one value: ``Produce``, and the decoded bodies it carries.

Every front that takes a produce (the client port's ``ring.http_api.app``,
PolarStreams' producer port, the peer port's forwarded produces, the group
coordinator's offset commits) parses and validates its parameters once and
builds a ``Produce``; the intake (``ring.replication.intake``), the routing
(``ring.cluster.routing``, ``ring.replication.local``), the forward link
(``ring.cluster.forwards``, which encodes and decodes it) and the leader's
write and wait (``ring.replication.appends``) take it as it is, so an option a
produce gains is parsed where the request is and read where it is used. It
sits beside the consistency levels (``ring.catalog``), below every layer that
carries it.
"""

from __future__ import annotations

from typing import NamedTuple

from ring import limits
from ring.log.batch import RecordIn


class Records(NamedTuple):  # a tuple: made per request, and a frozen dataclass costs a microsecond to make
    """Decoded records for the broker to frame; ``keyed`` if keys differ per record."""

    records: list[RecordIn]
    sizes: list[int]  # stored bytes of each record, for cutting batches
    values_are_json: bool
    keyed: bool


class Batches(NamedTuple):
    """Stored batches built by a client (or framed by the broker that forwards them), validated, to append
    as they are."""

    batches: list[bytearray]
    record_count: int


class Produce(NamedTuple):  # immutable, and a tuple for the reason Records is one
    """One produce: where its records go, the records, and how it is acknowledged.

    ``consistency`` is a level of ``ring.catalog.CONSISTENCY_LEVELS`` or None for the topic's default,
    which the intake puts in before the request goes to a partition; ``timeout_ms`` is how long the
    leader waits for the acknowledgements it needs (Kafka's request.timeout.ms). ``producer`` is (producer id,
    sequence of the first record) of an idempotent produce of ``Records``; ``Batches`` carry theirs in
    their headers.
    """

    topic: str
    records: Records | Batches
    partition: int | None = None  # None: by key, producer id or round-robin
    key: bytes | None = None
    consistency: str | None = None
    producer: tuple[int, int] | None = None
    timeout_ms: int | None = None  # 1..PRODUCE_TIMEOUT_MS_MAX; None: REPLICATION_ACK_TIMEOUT_MS

    @property
    def ack_timeout_ms(self) -> int:
        """How long the leader waits for the acknowledgements the level needs before its 504."""
        return self.timeout_ms or limits.REPLICATION_ACK_TIMEOUT_MS
