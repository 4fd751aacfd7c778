"""What a chaos run saw, as plain values: every write attempt, every record read, every replica compared.

The workload and the final drain fill a ``History``; the checker
(``checker.py``) reads nothing else. Times are seconds since the run started
(the harness's monotonic clock), so a history saved as JSON replays through
the checker exactly. A write is one produce request of one record: a unique
value under its producer's key, with the outcome the client could tell
(``ok`` with the partition and offset the broker gave it; ``fail`` when the
broker said nothing was written, a 503 or a 4xx; ``unknown`` for a 504, a
timeout or a broken connection). A read is one record at one offset as one
source returned it (with the record's timestamp): a consumer during the
run, the final drain of one broker's client API, or one replica's own log
read on the peer port after healing. A ``ReplicaCopy`` is one replica's stored batches of one partition,
by header, for comparing replicas byte for byte without keeping the bytes.
A ``GroupRead`` is one record a consumer-group member handed to its
application (runs with group consumers), and ``group_committed`` the
group's committed offsets read after healing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"
OUTCOMES = (OK, FAIL, UNKNOWN)
CONSUMER, FINAL, REPLICA = "consumer", "final", "replica"
SOURCES = (CONSUMER, FINAL, REPLICA)


@dataclass(frozen=True)
class Write:
    value: str
    key: str
    producer: int
    seq: int
    start_s: float
    end_s: float
    outcome: str
    partition: int | None = None
    offset: int | None = None
    broker: str = ""
    status: int | None = None  # the HTTP status, None when no answer came
    error: str = ""

    def __post_init__(self) -> None:
        assert self.outcome in OUTCOMES, self.outcome
        assert self.end_s >= self.start_s
        assert (self.outcome == OK) == (self.offset is not None and self.partition is not None), self


@dataclass(frozen=True)
class Read:
    source: str
    broker: str
    partition: int
    offset: int
    value: str
    at_s: float = 0.0
    timestamp: int | None = None  # the record's, ms since the epoch (None: not kept)

    def __post_init__(self) -> None:
        assert self.source in SOURCES, self.source


@dataclass(frozen=True)
class GroupRead:
    consumer: str  # the member's id: a killed consumer's successor has another
    partition: int
    offset: int
    value: str
    at_s: float = 0.0


# One stored batch as a replica holds it: (base_offset, leader_epoch, crc, record_count).
BatchId = tuple[int, int, int, int]


@dataclass(frozen=True)
class ReplicaCopy:
    broker: str
    partition: int
    batches: tuple[BatchId, ...] = ()
    end_offset: int | None = None
    error: str = ""  # the replica could not be read whole (damaged, unreachable)


@dataclass
class History:
    writes: list[Write] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    replicas: list[ReplicaCopy] = field(default_factory=list)
    fetches_ok: int = 0  # consumer fetches answered 200 during the run
    fetches_failed: int = 0
    drain_errors: list[str] = field(default_factory=list)  # final reads that failed: broker, partition, why
    group_reads: list[GroupRead] = field(default_factory=list)
    group_committed: dict[int, int] | None = None  # partition -> the group's committed offset after healing
    events: list[tuple[float, str]] = field(default_factory=list)  # faults as they happened
    # (at_s, broker, partition, earliest offset) as brokers reported their replicas' starts; a chaos
    # run never truncates and its topic keeps records for days, so every one must be 0
    starts: list[tuple[float, str, int, int]] = field(default_factory=list)
    # (broker, partition, timestamp, offset before, offset after): a broker's answer for the first offset
    # at or after a timestamp, asked before the faults and again after the drain
    timestamp_answers: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "writes": [asdict(w) for w in self.writes],
            "reads": [[r.source, r.broker, r.partition, r.offset, r.value, r.at_s, r.timestamp] for r in self.reads],
            "replicas": [{**asdict(c), "batches": [list(b) for b in c.batches]} for c in self.replicas],
            "fetches_ok": self.fetches_ok,
            "fetches_failed": self.fetches_failed,
            "drain_errors": self.drain_errors,
            "group_reads": [[r.consumer, r.partition, r.offset, r.value, r.at_s] for r in self.group_reads],
            "group_committed": None if self.group_committed is None else
            {str(p): o for p, o in self.group_committed.items()},
            "events": [list(e) for e in self.events],
            "starts": [list(x) for x in self.starts],
            "timestamp_answers": [list(x) for x in self.timestamp_answers],
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> History:
        return cls(
            writes=[Write(**w) for w in doc.get("writes", [])],
            reads=[Read(*r) for r in doc.get("reads", [])],
            replicas=[ReplicaCopy(c["broker"], c["partition"], tuple(tuple(b) for b in c["batches"]),
                                  c.get("end_offset"), c.get("error", "")) for c in doc.get("replicas", [])],
            fetches_ok=doc.get("fetches_ok", 0),
            fetches_failed=doc.get("fetches_failed", 0),
            drain_errors=list(doc.get("drain_errors", [])),
            group_reads=[GroupRead(*r) for r in doc.get("group_reads", [])],
            group_committed=None if doc.get("group_committed") is None else
            {int(p): int(o) for p, o in doc["group_committed"].items()},
            events=[(float(t), str(what)) for t, what in doc.get("events", [])],
            starts=[tuple(x) for x in doc.get("starts", [])],  # type: ignore[misc]
            timestamp_answers=[tuple(x) for x in doc.get("timestamp_answers", [])],  # type: ignore[misc]
            meta=dict(doc.get("meta", {})),
        )
