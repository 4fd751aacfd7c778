"""The Kafka APIs the listener serves, at which versions, and their request and answer bodies.

``handle`` parses one request's body and answers its body: bytes when it is ready at once, a
coroutine when the broker must be awaited, a ``wire.Quiet`` for a request answered with nothing. Decisions
(placement, leaders, durability, long-polls, offsets) are the broker's, as for the HTTP front:
a produce goes through ``broker.intake`` (``produce.py``), a fetch through ``broker.fetch``, an
offsets lookup through ``broker.offsets``, OffsetForLeaderEpoch through ``broker.epoch_end``
(``epochs.py``). Errors of the broker are answered per partition with
Kafka's codes (``errors.py``). The consumer-group APIs are served by ring's group coordinator
(``groups.py``). InitProducerId hands idempotent producers their ids (``producer_ids.py``). CreateTopics and
DeleteTopics are the broker's own topic create and delete (``topics.py``). SaslHandshake and SaslAuthenticate
are listed here and answered by the connection, whose state they change (``server.py``, ``sasl.py``). Only
non-flexible versions are served, but for ApiVersions v3, Metadata v9, FindCoordinator v3-4, InitProducerId
v2-5, OffsetForLeaderEpoch v4, CreateTopics v5-7, DeleteTopics v4-6, CreatePartitions v2-3, DescribeConfigs v4,
AlterConfigs v2, IncrementalAlterConfigs v1 and SaslAuthenticate v2. DescribeConfigs, the two AlterConfigs and
CreatePartitions read and change a topic's settings (``configs.py``).
"""

from __future__ import annotations

from typing import Any, Callable

from ring.errors import RingError, Unavailable
from ring.kafka_api import (cluster, configs, consume, epochs, group_codec, groups, offsets, produce, producer_ids,
                            sasl, topic_codec, topics)
from ring.kafka_api.errors import UNSUPPORTED_VERSION
from ring.kafka_api.wire import Reader, RequestHeader, Writer

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, INIT_PRODUCER_ID = 0, 1, 2, 3, 18, 22

Answer = Any  # bytes, an awaitable of bytes, or a wire.Quiet
Handler = Callable[[Any, int, Reader], Answer]


class NotServed(RingError):
    """A request for an API or a version this listener does not serve: its connection is closed."""

    code = "kafka_api_not_served"


# The first version at which each API's request is flexible (compact fields, tagged fields, header v2).
FLEXIBLE_FROM = {PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 6, METADATA: cluster.FLEXIBLE_FROM, API_VERSIONS: 3,
                 INIT_PRODUCER_ID: producer_ids.FLEXIBLE_FROM, epochs.OFFSET_FOR_LEADER_EPOCH: epochs.FLEXIBLE_FROM,
                 **group_codec.FLEXIBLE_FROM,
                 **topic_codec.FLEXIBLE_FROM, **sasl.FLEXIBLE_FROM}


def flexible(api_key: int, api_version: int) -> bool:
    return api_version >= FLEXIBLE_FROM.get(api_key, 1 << 15)


def api_versions(broker: Any, version: int, r: Reader) -> bytes:
    if version >= 3:
        r.compact_string()  # client_software_name
        r.compact_string()  # client_software_version
        r.tagged_fields()
    return versions_body(version, 0)


def versions_body(version: int, error: int) -> bytes:
    w = Writer().int16(error)
    served = sorted(SERVED.items())
    if version >= 3:
        w.compact_array_len(len(served))
        for key, (low, high, _) in served:
            w.int16(key).int16(low).int16(high).tagged_fields()
        return bytes(w.int32(0).tagged_fields().buf)
    w.array_len(len(served))
    for key, (low, high, _) in served:
        w.int16(key).int16(low).int16(high)
    if version >= 1:
        w.int32(0)  # throttle_time_ms
    return bytes(w.buf)


SERVED: dict[int, tuple[int, int, Handler | None]] = {
    PRODUCE: (3, 8, produce.handle),
    FETCH: (4, 11, consume.fetch),  # (librdkafka writes RecordBatch v2 only to a broker serving Fetch v4 too)
    LIST_OFFSETS: (1, 5, offsets.list_offsets),
    METADATA: (1, 9, cluster.metadata),
    API_VERSIONS: (0, 3, api_versions),
    INIT_PRODUCER_ID: (*producer_ids.VERSIONS, producer_ids.handle),
    epochs.OFFSET_FOR_LEADER_EPOCH: (*epochs.VERSIONS, epochs.handle),
    **{key: (*group_codec.VERSIONS[key], handler) for key, handler in groups.HANDLERS.items()},
    **{key: (*topic_codec.VERSIONS[key], handler) for key, handler in {**topics.HANDLERS, **configs.HANDLERS}.items()},
    **{key: (*sasl.VERSIONS[key], None) for key in sasl.KEYS},  # the connection's (server.py)
}


def check_served(header: RequestHeader) -> None:
    """NotServed for an API or a version this listener does not serve (ApiVersions: any version)."""
    served = SERVED.get(header.api_key)
    if served is None:
        raise NotServed(f"API key {header.api_key} is not served")
    low, high, _ = served
    if not low <= header.api_version <= high and header.api_key != API_VERSIONS:
        raise NotServed(f"API key {header.api_key} version {header.api_version} is not served ({low}-{high} are)")


def handle(broker: Any, header: RequestHeader, r: Reader, group_service: Any = None) -> Answer:
    """``group_service``: the broker's ``ring.groups.service.Groups``, which the group APIs are served by."""
    check_served(header)
    low, high, handler = SERVED[header.api_key]
    if not low <= header.api_version <= high:  # ApiVersions: answered in v0, which every client reads, so it
        return versions_body(0, UNSUPPORTED_VERSION)  # retries lower
    if handler is None:
        raise NotServed(f"API key {header.api_key} is answered by the connection")
    if header.api_key != API_VERSIONS and broker.membership is None:
        # Listening before the broker opened (``ring serve`` binds first): the client connects again.
        raise Unavailable(f"{broker.config.name} is starting")
    if header.api_key in groups.HANDLERS:
        if group_service is None:
            raise NotServed(f"API key {header.api_key}: this listener serves no groups")
        return handler(group_service, header, r)
    return handler(broker, header.api_version, r)

