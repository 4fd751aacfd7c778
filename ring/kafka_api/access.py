"""Who may call which Kafka API: the client tokens' grants (``ring.auth``) applied to the listener's requests,
so that a principal gets over Kafka's protocol exactly what it gets on the HTTP port (``http_api.access``).

The listener sets ``auth.CURRENT`` for a client that authenticated; with no tokens configured nothing is
set, ``auth.current()`` is None and every request is let in. A handler reads it once per request
(``principal``), while the listener serves the request, and passes it on; the helpers here take None as
allowed at once. A refusal is a ``Forbidden`` (TOPIC_AUTHORIZATION_FAILED by ``errors.code_of``; its
``kafka_error`` GROUP_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED where a group or the cluster is
refused), answered where the API answers its errors: per partition, per topic, per group or for the request.
Each request's topics are checked before anything is written, created, deleted or committed:

    Produce                         produce on each topic; a refused topic's partitions answer
                                    TOPIC_AUTHORIZATION_FAILED, nothing of them written
    Fetch, ListOffsets,             consume on each topic, per partition
    OffsetForLeaderEpoch
    Metadata                        any principal: every topic, as GET /v1/topics lists every topic with its
                                    settings to any authenticated token (a Kafka client asks for every topic
                                    to subscribe by pattern); a topic the request names is described only
                                    with some permission on it (GET /v1/topics/{topic} is DESCRIBE), else
                                    TOPIC_AUTHORIZATION_FAILED; a missing one is auto-created only with
                                    produce on it (as a produce over HTTP auto-creates), else
                                    TOPIC_AUTHORIZATION_FAILED and not created
    CreateTopics, DeleteTopics      admin on each topic's name; per topic TOPIC_AUTHORIZATION_FAILED
    CreatePartitions, AlterConfigs, admin on each topic; per topic TOPIC_AUTHORIZATION_FAILED
    IncrementalAlterConfigs
    DescribeConfigs                 some permission on each topic (GET /v1/topics/{topic}), else
                                    TOPIC_AUTHORIZATION_FAILED; a broker's defaults: any principal
    InitProducerId                  produce on some topic; else CLUSTER_AUTHORIZATION_FAILED
    FindCoordinator, JoinGroup,     consume on some topic (HTTP's group routes); else
    SyncGroup, Heartbeat,           GROUP_AUTHORIZATION_FAILED
    LeaveGroup
    OffsetCommit, OffsetFetch       that, and consume on each topic: a refused topic's partitions answer
                                    TOPIC_AUTHORIZATION_FAILED, none of them committed; an OffsetFetch of
                                    every committed partition leaves out the topics the principal may not
                                    consume (as Kafka leaves out those it may not describe)
    ListGroups, DescribeGroups      any principal (HTTP's GET /v1/groups and /v1/groups/{group})
    DeleteGroups                    admin on every topic (a grant on '*', HTTP's DELETE /v1/groups/{group});
                                    else per group GROUP_AUTHORIZATION_FAILED
    ApiVersions                     open
"""

from __future__ import annotations

from typing import Iterable

from ring import auth
from ring.errors import Forbidden
from ring.http_api import access as http_access
from ring.kafka_api import errors

Who = auth.Principal | None  # None: no client authenticated (auth off), everything allowed


def principal() -> Who:
    """The principal the listener serves the current request for; read once per request, while it is served."""
    return auth.current()


def refused(who: Who, permission: str, topic: str) -> Forbidden | None:
    """The refusal of ``permission`` on ``topic``, None when allowed."""
    if who is None or who.allows(permission, topic):
        return None
    return Forbidden(f"{who.name} may not {permission} topic {topic!r}"[:300], permission=permission,
                     topic=topic[:300])


def refusals(who: Who, permission: str, topics: Iterable[str]) -> dict[str, Forbidden]:
    """Topic -> its refusal, for each of ``topics`` not allowed (none when ``who`` is None)."""
    if who is None:
        return {}
    out = {}
    for topic in topics:
        if topic not in out and (no := refused(who, permission, topic)) is not None:
            out[topic] = no
    return out


def describe_refused(who: Who, topic: str) -> Forbidden | None:
    """The refusal to describe ``topic`` unless ``who`` holds some permission on it (HTTP's DESCRIBE)."""
    if who is None or who.allows_any(topic):
        return None
    return Forbidden(f"{who.name} holds no permission on topic {topic!r}"[:300], topic=topic[:300])


def group_refused(who: Who) -> Forbidden | None:
    """A group API's refusal unless ``who`` may consume some topic (HTTP's group routes: SOME_CONSUME)."""
    if who is None or http_access.permitted(who, http_access.SOME_CONSUME, None):
        return None
    return Forbidden(f"{who.name} may not use consumer groups: it needs consume on some topic",
                     kafka_error=errors.GROUP_AUTHORIZATION_FAILED)


def may_delete_groups(who: Who) -> bool:
    """Admin on every topic (HTTP's DELETE /v1/groups/{group}: ALL_ADMIN)."""
    return who is None or http_access.permitted(who, http_access.ALL_ADMIN, None)


def may_produce_somewhere(who: Who) -> bool:
    """Produce on some topic: what InitProducerId needs (else CLUSTER_AUTHORIZATION_FAILED)."""
    return who is None or who.allows(auth.PRODUCE)
