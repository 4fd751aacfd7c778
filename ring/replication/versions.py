"""Peer-protocol versions: what a broker speaks, what its cluster speaks, and the forms of each.

A rolling upgrade runs brokers of two releases side by side, so every peer
exchange names a version. Each broker speaks a range of versions
(``PROTOCOL_MIN``..``PROTOCOL_MAX``) and gossips it in its endpoint's extra
(``EXTRA_KEY``, "min-max"); a broker that gossips none is of a release before
versions were advertised and speaks ``PROTOCOL_MIN`` only. The cluster's
version (``cluster_version``) is the highest every member the ring knows
speaks, live or down: it rises on its own once the last member of the older
release is upgraded (its gossip entry then names the new range), and falls
back if one is downgraded again.

Replication links negotiate their own version too: the leader offers every
version it speaks up to the cluster's, highest first, as websocket
subprotocols (``offered``), and the follower answers the first of them it
speaks; each side then writes the frames of that version (``encode``).

What each version changes:

* 3 -- the previous release's frames: syncs without the voters'
  incarnations, acks without the follower's, 9-field vote replies, topic
  configs without ``id``. A replica then learns no incarnation from its
  peers, as with state written by that release, so the guard against a
  voter that lost its disk has nothing to compare and stays out of the way;
  a blank replica refuses a vote as ``not_a_voter`` (an older broker does not
  know ``lost_state``). Topics created while the cluster speaks 3 get the id
  a release without ids derives from name and creation time, which every
  broker derives alike before and after the upgrade: an older broker drops
  an ``id`` it reads, so a config it writes back (a change made on it) would
  otherwise come back with another id, a new incarnation of the topic.
* 4 -- syncs and acks carry incarnations, vote replies the voter's
  incarnation and ``lost_state``, topic configs their random ``id``.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Any, Iterable

import msgpack

from ring.catalog import TOPIC_ID_BYTES, TopicConfig, derived_id, encode_id
from ring.replication import election, protocol

PROTOCOL_MIN = 3  # the previous release's: it speaks this one only
PROTOCOL_MAX = 4
EXTRA_KEY = "protocol"  # gossip endpoint extra: the range a broker speaks, "min-max"
SUBPROTOCOL_PREFIX = "ring-replication."
assert protocol.SUBPROTOCOL == f"{SUBPROTOCOL_PREFIX}{PROTOCOL_MAX}", protocol.SUBPROTOCOL
_RANGE = re.compile(r"([0-9]{1,4})-([0-9]{1,4})")


def advertised() -> str:
    """This broker's range, as gossiped."""
    return f"{PROTOCOL_MIN}-{PROTOCOL_MAX}"


def parse_range(raw: object) -> tuple[int, int]:
    """A peer's gossiped range; nothing (or nothing readable) is a broker of the release before ranges."""
    match = _RANGE.fullmatch(raw) if isinstance(raw, str) else None
    if match is None or int(match.group(1)) > int(match.group(2)):
        return (PROTOCOL_MIN, PROTOCOL_MIN)
    return (int(match.group(1)), int(match.group(2)))


def cluster_version(ranges: Iterable[tuple[int, int]]) -> int:
    """The highest version every member speaks (within ours; ours alone: our highest)."""
    highest = min((hi for _, hi in ranges), default=PROTOCOL_MAX)
    return max(PROTOCOL_MIN, min(PROTOCOL_MAX, highest))


def subprotocol(version: int) -> str:
    return f"{SUBPROTOCOL_PREFIX}{version}"


def offered(cluster: int) -> tuple[str, ...]:
    """A leader's subprotocols: every version it speaks up to the cluster's, highest first."""
    top = max(PROTOCOL_MIN, min(PROTOCOL_MAX, cluster))
    return tuple(subprotocol(v) for v in range(top, PROTOCOL_MIN - 1, -1))


def spoken() -> tuple[str, ...]:
    """A follower's subprotocols (it answers the first the leader offers that is among them)."""
    return offered(PROTOCOL_MAX)


def version_of(sub: str | None) -> int | None:
    """The version a link's negotiated subprotocol names (None: not one this broker speaks)."""
    return {subprotocol(v): v for v in range(PROTOCOL_MIN, PROTOCOL_MAX + 1)}.get(sub or "")


def encode(frame: protocol.Frame, version: int) -> bytes:
    """A replication frame in ``version``'s form."""
    if version < 4 and isinstance(frame, (protocol.Sync, protocol.FollowerAck)):
        return msgpack.packb(frame.to_wire()[:-1], use_bin_type=True)  # without incarnations
    return protocol.encode(frame)


def vote_reply_wire(reply: election.VoteReply, version: int) -> list[Any]:
    if version >= 4:
        return reply.to_wire()
    reason = election.NOT_A_VOTER if reply.reason == election.LOST_STATE else reply.reason
    return replace(reply, reason=reason).to_wire()[:9]


# Topic settings a version-3 broker does not know (and would refuse the config for).
_NEWER_TOPIC_FIELDS = ("id", "unclean_leader_election")


def topic_wire(config: dict[str, Any], version: int) -> dict[str, Any]:
    """A topic config as gossiped: without the settings a member would refuse it for (``id``, and
    ``unclean_leader_election``, which version 3 does not have: there a topic elects cleanly)."""
    if version >= 4 or not any(k in config for k in _NEWER_TOPIC_FIELDS):
        return config
    return {k: v for k, v in config.items() if k not in _NEWER_TOPIC_FIELDS}


def new_topic(cfg: TopicConfig, version: int, rng: random.Random) -> TopicConfig:
    """A topic being created gets its id: random once every member speaks ids, else the one every
    broker derives from its name and creation time (and keeps after the upgrade)."""
    if version >= 4:
        return replace(cfg, id=encode_id(rng.randbytes(TOPIC_ID_BYTES)))
    return replace(cfg, id=derived_id(cfg.name, cfg.created_ms))
