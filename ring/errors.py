"""The one error hierarchy of ring, and the HTTP status each error maps to.

Every failure a client, a peer, or a disk can cause is one of these. They
become ``{"error": CODE, "message": TEXT, ...}`` with ``status`` in one place
(``ring.http_api.web.ring_error``: the client port's front answers with it,
and the peer port's aiohttp middleware, ring/http_api/middleware.py, too);
nothing else in the code base builds error responses, but for PolarStreams'
ports (ring/http_api/polar_api.py), which answer these errors as PolarStreams
does: plain text, with its status for each. Programmer errors are ``assert``s, not these.

    RingError                       500  internal (never for bad input)
    +-- BadRequest                  400  malformed input (remote's fault)
    |   +-- InvalidTopicName        400
    |   +-- CorruptBatch            400  CRC or framing failure in a batch
    |   +-- BodyTimeout             408  request body not sent in time
    |   +-- UnsupportedMediaType    415  a Content-Type the endpoint does not speak
    +-- Unauthorized                401
    +-- Forbidden                   403
    +-- NotFound                    404
    |   +-- UnknownTopic            404
    |   +-- UnknownPartition        404
    +-- Conflict                    409  (topic exists, stale generation ...)
    |   +-- TopicRecreated          409  a group member's topic was deleted and created again
    |   +-- FencedLeaderEpoch       409  a client names a leader epoch older than the partition's
    +-- PayloadTooLarge             413  a record, a line or a request over a limit
    +-- OffsetOutOfRange            416  names earliest/latest offsets
    +-- Overloaded                  429  a bounded queue is full, or the loop is late (Retry-After)
    |   +-- QuotaExceeded           429  the client's token is over its quota (Retry-After: the wait)
    +-- NotEnoughReplicas           503  too few live replicas (Retry-After)
    +-- Unavailable                 503  generic: shutting down, no leader ...
    |   +-- ClockUnusable           503  this broker's clock is off: it stamps no record
    |   +-- NotLeader               503  this broker does not lead the partition (now); names the leader
    |   +-- UnknownLeaderEpoch      503  a client names a leader epoch newer than this broker knows of
    |   +-- NoEligibleLeader        503  no live replica may lead: the ones holding what was acknowledged
    |                                    are gone; names the replicas that lost their state
    +-- RequestTimeout              504  outcome unknown
    +-- StorageError                500  the local disk failed (local's fault)
    +-- InsufficientStorage         507  a broker low on disk takes no new range

``CorruptBatch`` is also raised by the log reader on a damaged segment; the
log catches it to cut a torn tail during recovery, so it never reaches a
client from a read.
"""

from __future__ import annotations

from typing import Any


class RingError(Exception):
    """Base of every handled error. ``extra`` fields go into the JSON body."""

    status = 500
    code = "internal"
    retry_after_s: float | None = None

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        body.update(self.extra)
        return body


class BadRequest(RingError):
    status = 400
    code = "bad_request"


class InvalidTopicName(BadRequest):
    code = "invalid_topic_name"


class CorruptBatch(BadRequest):
    code = "corrupt_batch"


class BodyTimeout(BadRequest):
    status = 408
    code = "request_timeout"


class UnsupportedMediaType(BadRequest):
    status = 415
    code = "unsupported_media_type"


class Unauthorized(RingError):
    status = 401
    code = "unauthorized"


class Forbidden(RingError):
    status = 403
    code = "forbidden"


class NotFound(RingError):
    status = 404
    code = "not_found"


class UnknownTopic(NotFound):
    code = "unknown_topic"


class UnknownPartition(NotFound):
    code = "unknown_partition"


class Conflict(RingError):
    status = 409
    code = "conflict"


class TopicRecreated(Conflict):
    """A consumer-group member reads a topic that was deleted and created again since it was assigned
    it: names the topic, its id now (``topic_id``) and the one the member had (``stale_topic_id``)."""

    code = "topic_recreated"


class FencedLeaderEpoch(Conflict):
    """A request naming a leader epoch older than the partition's current one: its sender's metadata is
    stale (Kafka's FENCED_LEADER_EPOCH)."""

    code = "fenced_leader_epoch"


class PayloadTooLarge(RingError):
    status = 413
    code = "payload_too_large"


class OffsetOutOfRange(RingError):
    status = 416
    code = "offset_out_of_range"


class Overloaded(RingError):
    status = 429
    code = "overloaded"
    retry_after_s = 1.0


class QuotaExceeded(Overloaded):
    """The token is over one of its quotas (``ring.quotas``): retry after ``retry_after_s``."""

    code = "quota_exceeded"

    def __init__(self, message: str, retry_after_s: float, **extra: Any) -> None:
        super().__init__(message, retry_after_ms=max(1, round(retry_after_s * 1000)), **extra)
        self.retry_after_s = retry_after_s


class NotEnoughReplicas(RingError):
    status = 503
    code = "not_enough_replicas"
    retry_after_s = 1.0


class Unavailable(RingError):
    status = 503
    code = "unavailable"
    retry_after_s = 1.0


class ClockUnusable(Unavailable):
    """This broker's wall clock is too far from its peers' (or not compared yet) to stamp records with."""

    code = "clock_unusable"


class NotLeader(Unavailable):
    """This broker does not lead the partition (now): nothing was written; ``leader`` hints where to go."""

    code = "not_leader"


class UnknownLeaderEpoch(Unavailable):
    """A request naming a leader epoch newer than this broker knows of: it has not heard of that
    election yet, and the sender retries (Kafka's UNKNOWN_LEADER_EPOCH)."""

    code = "unknown_leader_epoch"


class NoEligibleLeader(Unavailable):
    """A partition whose only voters holding what was acknowledged are gone (down, or their disks lost)
    elects nobody rather than a replica missing acknowledged records; ``lost_state`` names the
    replicas known to have lost their state."""
    code = "no_eligible_leader"


class RequestTimeout(RingError):
    status = 504
    code = "timeout"


class StorageError(RingError):
    status = 500
    code = "storage_error"


class UnsupportedFormat(StorageError):
    """A data directory written by a newer release, in a format this one cannot read: it is not opened
    (``ring serve`` exits with code 2), never misread."""

    code = "unsupported_format"


class InsufficientStorage(RingError):
    """This broker's free disk is below its floor: it takes no new range (appends go on)."""

    status = 507
    code = "storage_full"
