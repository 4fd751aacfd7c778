"""The OpenAPI 3.1 description of the client API, served at ``GET /v1/openapi.json``.

Built as a plain dict so it costs nothing at import. A test checks that its
paths and methods are exactly the routes of ``app.ROUTES``: a route added
without being described here fails the build.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

from ring import __version__, limits
from ring.http_api import access, admin, cluster_api, groups_openapi, metrics, ranges_api

_ERROR = {"$ref": "#/components/schemas/Error"}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


def _ok(description: str, schema: dict[str, Any] | None = None, content_type: str = "application/json") -> dict[str, Any]:
    out: dict[str, Any] = {"description": description}
    if schema is not None:
        out["content"] = {content_type: {"schema": schema}}
    return out


def _param(name: str, where: str, schema: dict[str, Any], description: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path",
            "schema": schema, "description": description}


_TOPIC = _param("topic", "path", {"type": "string", "pattern": limits.TOPIC_NAME_PATTERN.pattern,
                                  "maxLength": limits.TOPIC_NAME_BYTES_MAX}, "topic name ('.' and '..' refused)")
_PARTITION = _param("partition", "path", {"type": "integer", "minimum": 0}, "partition number")
_BAD = _err("malformed request (bad name, parameter or body)")
_NOT_FOUND = _err("unknown topic or partition")

_TOPIC_CONFIG = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": limits.TOPIC_NAME_PATTERN.pattern},
        "partitions": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": limits.TOPIC_PARTITIONS_MAX},
                                 {"const": "auto"}],
                       "default": limits.TOPIC_PARTITIONS_DEFAULT,
                       "description": f'"auto": start with {limits.AUTO_PARTITIONS_INITIAL} and grow to one partition '
                                      "per consumer of the largest group reading the topic (listed as the current "
                                      "count with auto_partitions true)"},
        "auto_partitions": {"type": "boolean", "default": False,
                            "description": "grow the partitions when a consumer group has more members than "
                                           f"partitions for {limits.AUTO_PARTITIONS_GRACE_MS // 1000} s"},
        "replication_factor": {"type": "integer", "minimum": 1, "default": 3,
                               "description": "replicas of each partition; larger than the brokers in the cluster: "
                                              "400 (left out, the default is capped at their number)"},
        "retention_ms": {"type": "integer", "default": limits.RETENTION_MS_DEFAULT, "description": "-1: forever"},
        "retention_bytes": {"type": "integer", "default": limits.RETENTION_BYTES_DEFAULT,
                            "description": "-1: no size limit"},
        "segment_bytes": {"type": "integer", "minimum": limits.SEGMENT_BYTES_MIN,
                          "maximum": limits.SEGMENT_BYTES_MAX, "default": limits.SEGMENT_BYTES_DEFAULT},
        "compression": {"enum": ["none", "zstd", "lz4"], "default": "none"},
        "consistency": {"enum": ["one", "quorum", "all"], "default": "quorum",
                        "description": "consistency of produces that do not say"},
        "local_retention_bytes": {"type": "integer", "minimum": -1, "default": -1,
                                  "description": "bytes of closed segments each replica keeps once they are safe "
                                                 "as ranges on other brokers (GET .../ranges); -1: everything "
                                                 "local, no ranges"},
        "unclean_leader_election": {"type": "boolean", "default": False,
                                    "description": "a partition whose only voters holding what was acknowledged "
                                                   "lost their state elects its most up-to-date live replica "
                                                   "anyway, losing what only they held (Kafka's "
                                                   "unclean.leader.election.enable); false: it stays without a "
                                                   "leader (503 no_eligible_leader) until one returns"},
    },
}

# A topic as GET /v1/topics lists it: its settings, its id, and whether the cluster keeps it for itself.
_TOPIC_ID = {"type": "string", "pattern": "^[A-Za-z0-9_-]{22}$", "readOnly": True,
             "description": "this incarnation of the name (16 random bytes, unpadded base64url), fixed at "
                            "creation: a topic deleted and created again has a new id, and nothing kept for the "
                            "old one (a group's committed offsets) applies to it"}
_TOPIC_LISTED = {**_TOPIC_CONFIG, "properties": {
    **_TOPIC_CONFIG["properties"],
    "id": _TOPIC_ID,
    "created_ms": {"type": "integer", "readOnly": True, "description": "when the topic was created (wall ms)"},
    "internal": {"type": "boolean", "description": "a topic the cluster keeps for itself (__offsets: consumer "
                                                  "groups' committed offsets): readable, not changeable"}}}

# PATCH /v1/topics/{topic}: the settings catalog.CHANGEABLE names.
_TOPIC_CHANGE = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        "partitions": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": limits.TOPIC_PARTITIONS_MAX},
                                 {"const": "auto"}],
                       "description": "a larger count (it never shrinks), or \"auto\" to grow with the groups"},
        **{k: _TOPIC_CONFIG["properties"][k]
           for k in ("auto_partitions", "retention_ms", "retention_bytes", "compression", "consistency",
                     "local_retention_bytes", "unclean_leader_election")},
    },
}

_CLUSTER = {
    "type": "object",
    "properties": {
        "self": {"type": "string"},
        "protocol_version": {"type": "integer"},
        "brokers": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "token": {"type": ["integer", "null"]},
            "status": {"enum": ["up", "suspect", "down", "joining", "leaving", "removed"]},
            "phi": {"type": "number"}, "client_url": {"type": "string"}, "peer_url": {"type": ["string", "null"]},
            "generation": {"type": ["integer", "null"]}, "incarnation": {"type": ["string", "null"]},
            "load": {"type": "object"},
            "protocol": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
            "host": {"type": ["string", "null"]}, "zone": {"type": ["string", "null"]},
            "clock": {"type": "object", "properties": {
                "state": {"enum": ["unknown", "ok", "warning", "out_of_bounds", None]},
                "offset_ms": {"type": ["integer", "null"]}, "measured_offset_ms": {"type": ["integer", "null"]}}}}}},
    },
}

_CLUSTER_DOC = """Every broker gossip has told this one about, in token order, with its status as this broker
sees it: up, suspect (phi >= 5), down (phi >= 8: about 4-13 s after a broker stops), joining, leaving, removed.
A down broker keeps its place on the ring; its partitions run on their other replicas. clock: the broker's
own judgement of its wall clock against most of its peers' (state ok, warning, out_of_bounds, or unknown before
it has measured; offset_ms its clock minus the cluster's, in steps of 100 ms; null for a broker that gossips
none) and measured_offset_ms, the answering broker's own last measurement of that broker's clock minus its own.
A broker whose clock is out_of_bounds (ring serve --max-clock-offset) leads no partition and stamps no record.
incarnation is the id of the broker's data directory (made when the directory is first used): a broker back
with another one lost its disk, and its replicas count for no vote or acknowledgement until they caught up.
protocol is the [lowest, highest] peer-protocol version the broker speaks ([3, 3]: a broker of the release
before versions were gossiped); protocol_version is the one the cluster speaks, the highest every broker
speaks (raised on its own once the last older broker is upgraded; see docs/OPERATIONS.md, Upgrading)."""

_DESCRIBE_DOC = """The answering broker's own view. On a partition's leader, replica_end_offsets holds each
replica's acknowledged end offset (authoritative); on a follower only its own (others null) and its
high_watermark is the leader's as last told (it may lag a little); where the broker holds no replica of a
partition, the offsets are null. Ask the leader (see leader and GET /v1/cluster) for the authoritative view.
leader is the elected leader as this broker knows it (its own replica's, else the newest claim gossip carries);
null while an election runs. epoch is the leader epoch this replica is in. lost_state names the replicas
known here to have lost their state (an empty or replaced data directory: on the leader, followers still
catching up, which count for nothing until they have); no_eligible_leader is true where the partition has no
leader and cannot elect one holding what was acknowledged (produces get 503 no_eligible_leader)."""

_CHANGE_DOC = """Settings not named stay as they are. A new retention applies at once (records past it go at the
leader's next retention check, and from every follower as the leader's earliest offset reaches it). More partitions: the new ones are placed between the
existing ones, so no existing partition moves, and the answer comes once they have leaders. Keys move as little
as jump hashing allows: from P to P+1 partitions about 1/(P+1) of the keys move, all to the new partition, so a
key's records before the change and after it are in two partitions (docs/OPERATIONS.md, "Growing a topic", on ordering)."""

_HEADERS = {
    "type": "array", "description": "[name, value] pairs in the producer's order; a name may repeat",
    "items": {"type": "array", "items": {"type": ["string", "null"]}, "minItems": 2, "maxItems": 2},
}

_RECORD = {
    "type": "object",
    "properties": {
        "offset": {"type": "integer"},
        "timestamp": {"type": "integer", "description": "ms since the epoch"},
        "key": {"type": ["string", "null"]},
        "key_encoding": {"const": "base64", "description": "present when the key is not UTF-8"},
        "value": {"description": "the JSON event as produced, a UTF-8 string, or base64; absent on a record "
                                 "without a value (a tombstone), which a JSON null value is not"},
        "value_encoding": {"const": "base64", "description": "present when the value is neither JSON nor UTF-8"},
        "headers": _HEADERS,
        "headers_encoding": {"const": "base64", "description": "present when a header value is not UTF-8"},
    },
}

_PRODUCED = {
    "type": "object",
    "properties": {"topic": {"type": "string"}, "partition": {"type": "integer"},
                   "base_offset": {"type": "integer"}, "count": {"type": "integer"},
                   "past_retention": {"type": "integer", "description": "present when some records are older "
                                                                       "than the topic's retention"},
                   "warning": {"type": "string", "description": "present with past_retention: what retention "
                                                                "will do with those records"},
                   "results": {"type": "array", "description": "when per-record keys spread a request over partitions"}},
}

_MSGPACK_RECORD = {
    "type": "object",
    "properties": {"value": {"type": ["string", "null"], "format": "binary",
                             "description": "nil or absent: a record without a value (a tombstone)"},
                   "key": {"type": "string"},
                   "headers": {"description": "[[name, value], ...] pairs (order kept, names may repeat), "
                                              "or a map of name to value"},
                   "timestamp": {"type": "integer"}},
}

_PRODUCE_DOC = f"""Append records. Content-Type decides how the body is read:
application/json: one event, or a top-level array of events (each event is one record's value, stored as compact JSON);
application/x-ndjson: one event per line (blank lines skipped; a line at most {limits.NDJSON_LINE_BYTES_MAX} bytes);
application/msgpack: a map {{value?, key?, headers?, timestamp?}} or an array of them (a nil or absent value is a
record without a value, a tombstone; headers are [name, value] pairs, names may repeat, or a map);
application/vnd.ring.batch: one or more stored record batches (each at most {limits.BATCH_BYTES_MAX} bytes), appended as they are;
text/plain: the body is one raw value.
Placement: ?partition= wins; else a key (?key= or per-record msgpack keys) picks the partition by hash;
a request without either goes whole to one partition, chosen round-robin.
Bodies are limited to {limits.REQUEST_BYTES_MAX} bytes, records to {limits.MESSAGE_BYTES_MAX} bytes,
{limits.RECORDS_PER_REQUEST_MAX} records per request, JSON nesting to {limits.JSON_DEPTH_MAX} levels."""

_FETCH_DOC = """Read records from `offset` (default: the earliest), never at or above the high watermark.
Accept decides the answer: application/json (default), application/x-ndjson (one record per line),
application/msgpack (keys and values as bytes, value nil on a record without one), application/vnd.ring.batches
(stored batches as they are, possibly starting below `offset`: skip records below it). Ring-Next-Offset and
Ring-High-Watermark headers are always set. With wait_ms the request long-polls until a record at or after `offset` is committed."""


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    return access.describe_security(_with_head_bounds(_document()))


@lru_cache(maxsize=1)
def document_bytes() -> bytes:
    """The document as served: serialised once, not per request (it is tens of KB, and the route is open)."""
    return orjson.dumps(document())


def _with_head_bounds(doc: dict[str, Any]) -> dict[str, Any]:
    """Any request may be over the bounds of a request's head, checked before its route is known."""
    for item in doc["paths"].values():
        for method, op in item.items():
            if method in ("get", "put", "post", "delete", "patch"):
                responses = op.setdefault("responses", {})
                responses.setdefault("414", _err(f"request target over {limits.HEADER_LINE_BYTES_MAX} bytes"))
                responses.setdefault("431", _err(f"a header line over {limits.HEADER_LINE_BYTES_MAX} bytes, or "
                                                 f"the request head over {limits.REQUEST_HEAD_BYTES_MAX} or "
                                                 f"{limits.REQUEST_HEADER_FIELDS_MAX} fields"))
    return doc


def _document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "ring", "version": __version__,
                 "description": "A distributed, replicated event log served over plain HTTP."},
        "paths": {
            **admin.OPENAPI_PATHS, **metrics.OPENAPI_PATHS, **groups_openapi.OPENAPI_PATHS,
            **cluster_api.OPENAPI_PATHS, **ranges_api.OPENAPI_PATHS,
            **_broker_paths(), **_topic_paths(), **_produce_path(), **_fetch_path(), **_partition_paths(),
        },
        "components": {"schemas": {"Error": {
            "type": "object", "required": ["error", "message"],
            "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
            "additionalProperties": True}, "Record": _RECORD}},
    }



def _broker_paths() -> dict[str, Any]:
    """The broker itself: status, cluster view, this document."""
    return {
        "/v1/status": {"get": {
            "summary": "Broker status", "operationId": "status",
            "responses": {"200": _ok("name, version, status, uptime_s, topics, clean_shutdown, retention_sweeps, "
                                     "clock (a clustered broker: state, offset_ms, uncertainty_ms, max_offset_ms, "
                                     "warn_offset_ms, message, and peers: each measured peer's offset), admission (loop_lag_ms, "
                                     "requests_running, refused by reason, throttled per token name), ...",
                                     {"type": "object"}),
                          "503": _ok("the same document while status is joining: the broker has not yet "
                                     "seen the cluster (readiness)", {"type": "object"})}}},
        "/v1/cluster": {"get": {
            "summary": "The brokers this broker knows and their state", "operationId": "cluster",
            "description": _CLUSTER_DOC,
            "responses": {"200": _ok("brokers and this broker's name", _CLUSTER)}}},
        "/v1/openapi.json": {"get": {
            "summary": "This document", "operationId": "openapi",
            "responses": {"200": _ok("OpenAPI 3.1 document", {"type": "object"})}}},
    }


def _topic_paths() -> dict[str, Any]:
    """Topics: list, create, describe, change, delete."""
    return {
        "/v1/topics": {
            "get": {"summary": "List topics with their settings", "operationId": "listTopics",
                    "responses": {"200": _ok("topics", {"type": "object", "properties": {
                        "topics": {"type": "array", "items": _TOPIC_LISTED}}})}},
            "post": {"summary": "Create a topic", "operationId": "createTopic",
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _TOPIC_CONFIG}}},
                     "responses": {"201": _ok("the topic, as described by GET /v1/topics/{topic}", {"type": "object"}),
                                   "400": _BAD, "409": _err("the topic exists"),
                                   "503": _err("a topic of that name is still being deleted (its files, or its "
                                               "leaders' claims in gossip), or clock_unusable (this broker's "
                                               "clock is out of bounds: it stamps no creation time; create "
                                               "through another broker); retry")}},
        },
        "/v1/topics/{topic}": {
            "parameters": [_TOPIC],
            "get": {"summary": "Describe a topic and its partitions", "operationId": "describeTopic",
                    "description": _DESCRIBE_DOC,
                    "responses": {"200": _ok("settings, id, internal, and partitions: [{partition, earliest_offset, "
                                             "local_start_offset (where the replica's own log starts; below "
                                             "it, down to earliest_offset, the offsets are in ranges), "
                                             "end_offset, high_watermark, leader, replicas, epoch, "
                                             "replica_end_offsets, lost_state, no_eligible_leader}]",
                                             {"type": "object", "properties": {"id": _TOPIC_ID}}),
                                  "400": _BAD, "404": _NOT_FOUND}},
            "patch": {"summary": "Change a topic's settings", "operationId": "changeTopic",
                      "description": _CHANGE_DOC,
                      "requestBody": {"required": True, "content": {"application/json": {"schema": _TOPIC_CHANGE}}},
                      "responses": {"200": _ok("the topic, as described by GET /v1/topics/{topic}",
                                               {"type": "object"}),
                                    "400": _BAD, "404": _NOT_FOUND}},
            "delete": {"summary": "Delete a topic and its records", "operationId": "deleteTopic",
                       "responses": {"200": _ok("deleted", {"type": "object"}), "400": _BAD, "404": _NOT_FOUND}},
        },
    }


def _produce_path() -> dict[str, Any]:
    """Producing records."""
    return {
        "/v1/topics/{topic}/messages": {"post": {
            "summary": "Produce records", "operationId": "produce", "description": _PRODUCE_DOC,
            "parameters": [
                _TOPIC,
                _param("key", "query", {"type": "string", "maxLength": limits.KEY_BYTES_MAX},
                       "key of every record (UTF-8); picks the partition"),
                _param("partition", "query", {"type": "integer", "minimum": 0}, "explicit partition"),
                _param("consistency", "query", {"enum": ["one", "quorum", "all"]},
                       "replicas that must hold the records before the answer: one (the leader), quorum "
                       "(a majority of the replication factor) or all; default: the topic's consistency "
                       "setting (quorum unless set)"),
                _param("timeout_ms", "query",
                       {"type": "integer", "minimum": 1, "maximum": limits.PRODUCE_TIMEOUT_MS_MAX},
                       "how long the leader waits for the acknowledgements the consistency level needs "
                       f"before its 504 (Kafka's request.timeout.ms); default {limits.REPLICATION_ACK_TIMEOUT_MS}"),
                _param("producer_id", "query", {"type": "integer", "minimum": 0},
                       "an idempotent producer's id (with sequence): a retry of a request already written is "
                       "answered with the original offsets and written once"),
                _param("sequence", "query", {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                       "the sequence of the request's first record, per partition (with producer_id); must "
                       "grow from request to request, gaps allowed; an older one that matches none of the "
                       f"producer's last {limits.PRODUCER_BATCHES_KEPT} batches is refused with 409"),
            ],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {}},
                "application/x-ndjson": {"schema": {"type": "string"}},
                "application/msgpack": {"schema": {"oneOf": [_MSGPACK_RECORD, {"type": "array", "items": _MSGPACK_RECORD}]}},
                "application/vnd.ring.batch": {"schema": {"type": "string", "format": "binary"}},
                "text/plain": {"schema": {"type": "string"}},
            }},
            "responses": {"200": _ok("where the records went", _PRODUCED), "400": _BAD, "404": _NOT_FOUND,
                          "408": _err("body not sent in time"), "409": _err("an idempotent produce whose sequence is not after the producer's last one "
                                      "(and matches none it remembers), or half a retry: nothing was written"),
                          "413": _err("body, line or record too large"),
                          "415": _err("unsupported Content-Type"),
                          "429": _err("overloaded (the broker's loop is late, too many requests are running, "
                                      "or request bodies fill its budget) or quota_exceeded (the token is over "
                                      "its quota; the body's retry_after_ms says how long); nothing was "
                                      "written; retry after Retry-After"),
                          "503": _err("too few live replicas for the consistency level (the body says how many "
                                      "are alive and needed; nothing was written), the partition has no leader "
                                      "(an election runs: about 4-13 s after a leader stops), not_leader (the "
                                      "body names the leader this broker knows), clock_unusable (this broker's "
                                      "clock is out of bounds: it stamps no record; produce through another "
                                      "broker, or send application/vnd.ring.batch stamped by the client), or the "
                                      "broker is joining or shutting down; nothing was written; retry after "
                                      "Retry-After"),
                          "504": _err("the replicas the consistency level needs did not acknowledge in time "
                                      "(timeout_ms), "
                                      "or the leader stepped down first: the outcome is unknown")}}},
    }


def _fetch_path() -> dict[str, Any]:
    """Fetching records."""
    return {
        "/v1/topics/{topic}/partitions/{partition}/messages": {"get": {
            "summary": "Fetch records (long-poll)", "operationId": "fetch", "description": _FETCH_DOC,
            "parameters": [
                _TOPIC, _PARTITION,
                _param("offset", "query", {"type": "integer", "minimum": 0}, "first offset; default: earliest"),
                _param("max_records", "query", {"type": "integer", "minimum": 1, "maximum": limits.FETCH_RECORDS_MAX,
                                                "default": limits.FETCH_RECORDS_DEFAULT}, "records at most"),
                _param("max_bytes", "query", {"type": "integer", "minimum": 1, "maximum": limits.FETCH_BYTES_MAX,
                                              "default": limits.FETCH_BYTES_DEFAULT},
                       "stored bytes to read (at least one batch is returned)"),
                _param("wait_ms", "query", {"type": "integer", "minimum": 0, "maximum": limits.LONG_POLL_WAIT_MS_MAX,
                                            "default": 0}, "long-poll this long for new records"),
            ],
            "responses": {
                "200": {"description": "records", "content": {
                    "application/json": {"schema": {"type": "object", "properties": {
                        "topic": {"type": "string"}, "partition": {"type": "integer"},
                        "records": {"type": "array", "items": _RECORD},
                        "next_offset": {"type": "integer"}, "high_watermark": {"type": "integer"}}}},
                    "application/x-ndjson": {"schema": {"type": "string"}},
                    "application/msgpack": {"schema": {"type": "object"}},
                    "application/vnd.ring.batches": {"schema": {"type": "string", "format": "binary"}},
                }},
                "400": _BAD, "404": _NOT_FOUND,
                "416": _err("offset out of range; the body names earliest and latest"),
                "429": _err("too many long-polls open, too many fetch answers not yet taken by their "
                            "clients, the broker overloaded, or the token over its quota (quota_exceeded); "
                            "retry after Retry-After")}}},
    }


def _partition_paths() -> dict[str, Any]:
    """A partition's offsets: by timestamp, and truncation."""
    return {
        "/v1/topics/{topic}/partitions/{partition}/offsets": {"get": {
            "summary": "Offset by timestamp", "operationId": "offsetForTimestamp",
            "parameters": [_TOPIC, _PARTITION,
                           _param("timestamp", "query", {"type": "string"},
                                  "ms since the epoch, or earliest / latest", required=True)],
            "responses": {"200": _ok("first offset with a timestamp at or after it (offset); the high "
                                     "watermark when every record is older; leader_epoch: the leader epoch "
                                     "of the batch holding it (the latest for the log end), -1 where the "
                                     "answer comes from ranges below the local log", {"type": "object"}),
                          "400": _BAD, "404": _NOT_FOUND}}},
        "/v1/topics/{topic}/partitions/{partition}/truncate": {"post": {
            "summary": "Delete records below an offset", "operationId": "truncate",
            "parameters": [_TOPIC, _PARTITION],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["before_offset"],
                "properties": {"before_offset": {"type": "integer", "minimum": 0}}}}}},
            "description": "On the partition's leader (any broker forwards it there); the followers take "
                           "the new earliest offset through replication, as they take the high watermark, "
                           "and serve nothing below it from then on. Answered once a majority of the "
                           "partition's replicas hold the new start, so no failover undoes it.",
            "responses": {"200": _ok("the new earliest offset", {"type": "object"}), "400": _BAD,
                          "404": _NOT_FOUND, "416": _err("before_offset beyond the high watermark"),
                          "503": _err("fewer than a majority of the partition's replicas are up, or its leader "
                                      "is not reachable; nothing changed"),
                          "504": _err("the leader's log starts at the new offset (applied_on_leader), but a "
                                      "majority of the replicas did not confirm it in time (confirmed, needed); "
                                      "the same truncate again is safe")}}},
        "/v1/topics/{topic}/partitions/{partition}/unclean-election": {"post": {
            "summary": "Elect a leader that may not hold everything acknowledged", "operationId": "uncleanElection",
            "parameters": [_TOPIC, _PARTITION],
            "description": "For a partition without a leader because the only voters holding what was "
                           "acknowledged lost their state (no_eligible_leader): its live replicas stand once "
                           "counting the votes of voters that lost their state, and the most up-to-date one "
                           "wins. Records only the lost voters held are gone; the winner records from which "
                           "offset (unclean_elections in GET /v1/topics/{topic}). The topic setting "
                           "unclean_leader_election does the same whenever it is needed.",
            "responses": {"200": _ok("the leader elected and the partition as it describes it",
                                     {"type": "object"}),
                          "400": _BAD, "404": _NOT_FOUND,
                          "409": _err("the partition has a leader: no election is needed"),
                          "503": _err("no live replica was asked, or none was elected in time (the asked "
                                      "replicas go on standing)")}}},
    }
