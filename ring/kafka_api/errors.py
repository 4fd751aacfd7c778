"""Kafka's error codes, and the one mapping from ``ring.errors`` to them.

A client acts on the code: the retriable ones (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT,
NOT_ENOUGH_REPLICAS, LEADER_NOT_AVAILABLE, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH) make it refresh its metadata and send again; the others
fail the records or the read they concern.
"""

from __future__ import annotations

from ring import errors

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
NOT_ENOUGH_REPLICAS = 19
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
KAFKA_STORAGE_ERROR = 56
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
UNSUPPORTED_COMPRESSION_TYPE = 76
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87
UNKNOWN_TOPIC_ID = 100
UNKNOWN_SERVER_ERROR = -1

# Most specific first: the first class an error is an instance of gives its code.
_CODES: list[tuple[type[errors.RingError], int]] = [
    (errors.InvalidTopicName, INVALID_TOPIC_EXCEPTION),
    (errors.CorruptBatch, CORRUPT_MESSAGE),
    (errors.BadRequest, INVALID_RECORD),
    (errors.UnknownTopic, UNKNOWN_TOPIC_OR_PARTITION),
    (errors.UnknownPartition, UNKNOWN_TOPIC_OR_PARTITION),
    (errors.OffsetOutOfRange, OFFSET_OUT_OF_RANGE),
    (errors.PayloadTooLarge, MESSAGE_TOO_LARGE),
    (errors.NotEnoughReplicas, NOT_ENOUGH_REPLICAS),
    (errors.FencedLeaderEpoch, FENCED_LEADER_EPOCH),
    (errors.UnknownLeaderEpoch, UNKNOWN_LEADER_EPOCH),
    (errors.Unavailable, NOT_LEADER_OR_FOLLOWER),  # not leading, no leader yet, shutting down: go elsewhere
    (errors.RequestTimeout, REQUEST_TIMED_OUT),
    (errors.Overloaded, REQUEST_TIMED_OUT),  # retriable: the client backs off and sends again
    (errors.Unauthorized, TOPIC_AUTHORIZATION_FAILED),
    (errors.Forbidden, TOPIC_AUTHORIZATION_FAILED),
    (errors.StorageError, KAFKA_STORAGE_ERROR),
    (errors.InsufficientStorage, KAFKA_STORAGE_ERROR),
]


# ring's idempotence refusing a batch's sequence (``ring.replication.idempotence``).
_SEQUENCE = ("out_of_order_sequence", "partial_duplicate")


def code_of(exc: errors.RingError) -> int:
    """Kafka's code for a ring error; a batch's own code (``records.Unsupported``) when it names one. An
    error another broker answered (a forwarded produce's, passed on by its ``code``) gets the code its
    class would."""
    own = exc.extra.get("kafka_error")
    if isinstance(own, int):
        return own
    if exc.code == errors.Conflict.code and ("producer_id" in exc.extra or exc.extra.get("reason") in _SEQUENCE):
        return OUT_OF_ORDER_SEQUENCE_NUMBER
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return _by_name().get(exc.code, UNKNOWN_SERVER_ERROR)


_BY_NAME: dict[str, int] = {}


def _by_name() -> dict[str, int]:
    """Error code name (``RingError.code``) -> Kafka's code, over every error class with one in ``_CODES``."""
    if not _BY_NAME:
        todo = [errors.RingError]
        while todo:
            cls = todo.pop()
            todo += cls.__subclasses__()
            code = next((c for base, c in _CODES if issubclass(cls, base)), None)
            if code is not None:
                _BY_NAME.setdefault(cls.code, code)
    return _BY_NAME
