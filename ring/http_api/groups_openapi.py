"""OpenAPI path items of the consumer-group routes (``groups_api.ROUTES``), merged into ``openapi.document()``."""

from __future__ import annotations

from typing import Any

from ring import limits
from ring.groups.delivery import TOKEN_CHARS

_ERROR = {"$ref": "#/components/schemas/Error"}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


def _ok(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description}
    if schema is not None:
        out["content"] = {"application/json": {"schema": schema}}
    return out


def _param(name: str, where: str, schema: dict[str, Any], description: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path", "schema": schema,
            "description": description}


def _anchored(pattern: str) -> str:
    # JSON Schema patterns match anywhere in the string: anchor them to mean the whole name.
    return f"^(?:{pattern})$"


_NAME = {"type": "string", "pattern": _anchored(limits.GROUP_NAME_PATTERN.pattern)}
_GROUP = _param("group", "path", _NAME, "consumer group name")
_CONSUMER = _param("consumer", "path", _NAME, "consumer (member) id, chosen by the consumer")
_TOPIC = _param("topic", "path", {"type": "string", "pattern": _anchored(limits.TOPIC_NAME_PATTERN.pattern)},
                "topic name")
_BAD = _err("malformed request")
_STALE = _err("stale generation, unknown member or a partition not held: the body has rejoin: true, the "
              "group's generation and a reason (unknown_member, stale_generation, not_assigned); join again. "
              "error topic_recreated: a topic of the member was deleted and created again since it was given "
              "it (the body names topic, topic_id, the topic's id now, and stale_topic_id); joining again "
              "reads the new topic by the reset policy")
_DOWN = _err("the group's coordinator is down or moving, or too few replicas of the offsets partition are "
             "alive, or the coordinator's clock may not be used (clock_unusable); retry after Retry-After")
_TP = {"type": "object", "properties": {"topic": {"type": "string"}, "partition": {"type": "integer"}}}
_OFFSET = {"type": "object", "required": ["topic", "partition", "offset"],
           "properties": {"topic": {"type": "string"}, "partition": {"type": "integer", "minimum": 0},
                          "offset": {"type": "integer", "minimum": 0,
                                     "description": "the next offset to read (one past the last processed)"}}}
# A fetch's record (headers as [name, value] pairs, no value on a tombstone) and where it is from.
_RECORD = {"allOf": [{"$ref": "#/components/schemas/Record"}, {"type": "object", "properties": {
    "topic": {"type": "string"}, "partition": {"type": "integer"}}}]}
_GROUP_DOC = {"type": "object", "properties": {
    "group": {"type": "string"},
    "state": {"enum": ["empty", "stable", "preparing", "completing"],
              "description": "a Kafka group's rebalance: preparing (gathering members), completing (awaiting the "
                             "leader's assignment)"},
    "generation": {"type": "integer"}, "coordinator": {"type": "string"},
    "kafka": {"type": "object", "description": "a group of Kafka consumers (the Kafka listener's classic protocol)",
              "properties": {"protocol_type": {"type": "string"}, "protocol": {"type": "string"},
                             "leader": {"type": "string"}}},
    "members": {"type": "array", "items": {"type": "object", "properties": {
        "member": {"type": "string"}, "client": {"type": ["string", "null"]}, "topics": {"type": "array"},
        "assignment": {"type": "array", "items": _TP}, "session_timeout_ms": {"type": "integer"},
        "idle_ms": {"type": "integer"}}}},
    "offsets": {"type": "array", "items": {"type": "object", "properties": {
        "topic": {"type": "string"}, "partition": {"type": "integer"}, "committed": {"type": ["integer", "null"]},
        "high_watermark": {"type": ["integer", "null"]}, "lag": {"type": ["integer", "null"]},
        "consumer": {"type": ["string", "null"]}}}}}}
_POSITIONS = {"type": "object", "properties": {
    "group": {"type": "string"}, "consumer": {"type": "string"}, "generation": {"type": "integer"},
    "positions": {"type": "array", "items": {"type": "object", "properties": {
        "topic": {"type": "string"}, "partition": {"type": "integer"}, "position": {"type": ["integer", "null"]},
        "committed": {"type": ["integer", "null"]}}}}}}
_TOKEN_SCHEMA = {"type": "string", "pattern": f"^[A-Za-z0-9_-]{{{TOKEN_CHARS}}}$"}
_ACK = ("the token of the last poll answer this consumer received: acknowledges it (the consumer's "
        "positions move past its records). Without it, the answer this connection carried whole before "
        "this request is acknowledged, if any")
_TOKEN = _param("token", "query", _TOKEN_SCHEMA, _ACK)
_TOKEN_HEADER = {"Ring-Poll-Token": {"description": "the answer's token", "schema": _TOKEN_SCHEMA}}

_POLL_DOC = """Records from the partitions the group assigned to this consumer, from its positions (past the
last answer it acknowledged; else the committed offset, else its reset policy), at most max_records.
Long-polls up to wait_ms when there is nothing. First acknowledges the answer named by token (or carried
whole on this connection before this request), then, unless auto_commit=false, commits the positions
(at-least-once: poll again only after processing). An answer never acknowledged (lost on the way) moves
nothing: its records are handed out again. Answered only if the group is still at the generation the poll
started in; otherwise 409 (join again)."""

_POLL_OK = _ok("records, the group's generation and this answer's token: name it in the next request to "
               "acknowledge this answer", {"type": "object", "properties": {
                   "records": {"type": "array", "items": _RECORD},
                   "generation": {"type": "integer"}, "token": _TOKEN_SCHEMA,
                   "partitions": {"type": "integer", "description": "with leader: the consumer's partitions that "
                                                                    "broker leads"}}})
_POLL_OK["content"].update({
    "application/msgpack": {"schema": {"type": "object", "description": "as JSON, keys and values as bytes"}},
    "application/vnd.ring.poll-batches": {"schema": {
        "type": "string", "format": "binary",
        "description": 'msgpack {"generation", "token", "batches": [[topic, partition, start, end, batches], ...]}: '
                       "per partition, the stored batches (as a fetch answers with application/vnd.ring.batches) "
                       "that hold the records handed out, those with start <= offset < end"}}})

OPENAPI_PATHS: dict[str, Any] = {
    "/v1/groups": {"get": {
        "summary": "Consumer groups of the cluster", "operationId": "listGroups",
        "description": "Every group, asked of every live broker (each answers for the groups it coordinates); "
                       "brokers that did not answer are listed in unreachable.",
        "parameters": [_param("local", "query", {"type": "boolean"},
                              "only the groups this broker coordinates")],
        "responses": {"200": _ok("groups", {"type": "object", "properties": {
            "groups": {"type": "array", "items": _GROUP_DOC}, "unreachable": {"type": "array"}}}),
            "400": _BAD}}},
    "/v1/groups/{group}": {"get": {
        "summary": "Describe a group: members, assignment, committed offsets and lag per partition",
        "operationId": "describeGroup", "parameters": [_GROUP],
        "responses": {"200": _ok("the group", _GROUP_DOC), "400": _BAD, "404": _err("no such group"),
                      "503": _DOWN}},
        "delete": {
            "summary": "Delete a group with no members, and its committed offsets",
            "operationId": "deleteGroup", "parameters": [_GROUP],
            "description": "A consumer joining the group's name later starts from its reset policy. The same "
                           "delete as the Kafka listener's DeleteGroups.",
            "responses": {"200": _ok("the group deleted", {"type": "object", "properties": {"deleted": _NAME}}),
                          "400": _BAD, "404": _err("no such group"),
                          "409": _err("the group has members (reason group_not_empty)"), "503": _DOWN}}},
    "/v1/groups/{group}/members": {"post": {
        "summary": "Join a group (or heartbeat: joining again with the same topics changes nothing)",
        "operationId": "joinGroup", "parameters": [_GROUP],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["consumer", "topics"], "properties": {
                "consumer": _NAME, "topics": {"type": "array", "items": {"type": "string"},
                                              "maxItems": limits.GROUP_MEMBER_TOPICS_MAX},
                "session_timeout_ms": {"type": "integer", "minimum": limits.GROUP_SESSION_TIMEOUT_MS_MIN,
                                       "maximum": limits.GROUP_SESSION_TIMEOUT_MS_MAX,
                                       "default": limits.GROUP_SESSION_TIMEOUT_MS_DEFAULT},
                "reset": {"enum": ["earliest", "latest"], "default": "earliest",
                          "description": "where partitions without a committed offset start"},
                "client": {"type": "string", "description": "a label shown in describe"}}}}}},
        "responses": {"200": _ok("the consumer's generation and assignment; idle: true and a message when the "
                                 "group has more consumers than partitions", {"type": "object", "properties": {
                                     "generation": {"type": "integer"},
                                     "assignment": {"type": "array", "items": _TP},
                                     "topic_ids": {"type": "object", "additionalProperties": {"type": "string"},
                                                   "description": "the id of each topic the consumer reads: "
                                                                  "one that changes was created again"},
                                     "idle": {"type": "boolean"}, "message": {"type": "string"}}}),
                      "400": _BAD, "429": _err("the group is full"), "503": _DOWN}}},
    "/v1/groups/{group}/members/{consumer}/poll": {"post": {
        "summary": "Poll the consumer's partitions (long-poll)", "operationId": "pollGroup",
        "description": _POLL_DOC, "parameters": [
            _GROUP, _CONSUMER,
            _param("max_records", "query", {"type": "integer", "minimum": 1, "maximum": limits.FETCH_RECORDS_MAX,
                                            "default": limits.FETCH_RECORDS_DEFAULT}, "records at most"),
            _param("wait_ms", "query", {"type": "integer", "minimum": 0, "maximum": limits.LONG_POLL_WAIT_MS_MAX,
                                        "default": 0}, "long-poll this long when there is nothing"),
            _param("generation", "query", {"type": "integer"}, "the generation the consumer joined in: a "
                                                               "stale one is refused with 409"),
            _param("auto_commit", "query", {"type": "boolean", "default": True},
                   "commit the positions (what was acknowledged) first"),
            _TOKEN,
            _param("leader", "query", _NAME, "read only the consumer's partitions this broker leads (as the "
                                             "coordinator knows their leaders); the answer then says how many "
                                             "that is in partitions")],
        "responses": {"200": {**_POLL_OK, "headers": _TOKEN_HEADER},
                      "400": _BAD, "409": _STALE, "503": _DOWN}}},
    "/v1/groups/{group}/members/{consumer}": {"delete": {
        "summary": "Leave a group (a rebalance)", "operationId": "leaveGroup",
        "parameters": [_GROUP, _CONSUMER, _param("commit", "query", {"type": "boolean", "default": True},
                                                 "commit the positions (what was acknowledged) first"),
                       _TOKEN],
        "responses": {"200": _ok("left, and what was committed", {"type": "object"}), "400": _BAD,
                      "409": _STALE, "503": _DOWN}}},
    "/v1/groups/{group}/members/{consumer}/positions": {
        "get": {"summary": "Where the member's next poll reads each partition it holds",
                "operationId": "memberPositions", "parameters": [_GROUP, _CONSUMER],
                "responses": {"200": _ok("per partition held: position (null: the reset policy decides) and "
                                         "committed offset", _POSITIONS), "400": _BAD, "409": _STALE,
                              "503": _DOWN}},
        "put": {"summary": "Seek: move where the member's next poll reads partitions it holds",
                "operationId": "seekMember", "parameters": [_GROUP, _CONSUMER],
                "description": "Committed offsets stay; positions are not persisted (a new coordinator starts "
                               "from the committed offsets). A stale generation is accepted for partitions "
                               "the member has held since.",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["positions"], "properties": {
                        "generation": {"type": "integer"}, "positions": {"type": "array", "items": _OFFSET}}}}}},
                "responses": {"200": _ok("the member's positions after the seek", _POSITIONS), "400": _BAD,
                              "404": _err("unknown topic or partition"), "409": _STALE, "503": _DOWN}}},
    "/v1/groups/{group}/offsets": {"post": {
        "summary": "Commit offsets", "operationId": "commitOffsets", "parameters": [_GROUP],
        "description": "A member commits partitions it holds (generation optional; a stale one is refused "
                       "unless the member has held the partitions since that generation). Without offsets, "
                       "commits the consumer's positions (what it acknowledged, token acknowledging one more "
                       "answer). Without a consumer, only a group with no members accepts a commit.",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object", "properties": {
            "consumer": _NAME, "generation": {"type": "integer"},
            "offsets": {"type": "array", "items": _OFFSET},
            "token": {**_TOKEN_SCHEMA, "description": "without offsets: " + _ACK}}}}}},
        "responses": {"200": _ok("the committed offsets", {"type": "object"}), "400": _BAD,
                      "404": _err("unknown topic or partition"), "409": _STALE, "503": _DOWN,
                      "504": _err("the offsets partition's replicas did not acknowledge in time")}}},
    "/v1/groups/{group}/offsets/{topic}": {"put": {
        "summary": "Reset a group's offsets of a topic", "operationId": "resetOffsets",
        "parameters": [_GROUP, _TOPIC],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["to"], "properties": {
                "to": {"enum": ["earliest", "latest", "offset", "timestamp"]},
                "value": {"type": "integer", "description": "the offset, or ms since the epoch"},
                "partition": {"type": "integer", "description": "one partition; default every partition"}}}}}},
        "responses": {"200": _ok("the new committed offsets; members read from them on their next poll",
                                 {"type": "object"}), "400": _BAD, "404": _err("unknown topic or partition"),
                      "503": _DOWN}}},
}
