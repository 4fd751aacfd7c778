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

from typing import Any, Callable, Mapping, NamedTuple

from ring import limits
from ring.errors import BadRequest
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
    sequences_contiguous: bool = False  # the producer's sequences have no gap (Kafka's): a batch after one is refused

    @property
    def ack_timeout_ms(self) -> int:
        """How long the leader waits for the acknowledgements the level needs before its 504."""
        return self.timeout_ms or limits.REPLICATION_ACK_TIMEOUT_MS


def _timeout_ms(value: object) -> int:
    if type(value) is int and 0 < value <= limits.PRODUCE_TIMEOUT_MS_MAX:
        return value
    raise BadRequest(f"timeout_ms must be an integer in [1, {limits.PRODUCE_TIMEOUT_MS_MAX}]", parameter="timeout_ms")


# A produce's options: what it carries to its partition's leader besides topic, partition, level and
# records, each with the check a leader applies to a value that came over the forward link or the peer
# port (``ring.cluster.forwards`` carries them all by name, so an option added here travels unchanged).
OPTIONS: dict[str, Callable[[object], Any]] = {"timeout_ms": _timeout_ms}


def options(req: Produce) -> dict[str, Any]:
    """``req``'s options that are set, by name."""
    return {name: value for name in OPTIONS if (value := getattr(req, name)) is not None}


def with_options(req: Produce, given: object) -> Produce:
    """``req`` with ``given`` (a map of option name to value, from a peer), each checked; BadRequest for a
    value out of range or a name this broker does not know (a newer release's option, which it would
    otherwise drop unseen)."""
    if not given:
        return req
    if not isinstance(given, Mapping):
        raise BadRequest("a produce's options are a map of name to value")
    unknown = sorted(str(k) for k in given if k not in OPTIONS)
    if unknown:
        raise BadRequest(f"unknown produce options {unknown} (a broker of a newer release sent them?)")
    return req._replace(**{name: OPTIONS[name](value) for name, value in given.items()})
