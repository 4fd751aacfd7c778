"""A group member's poll and a commit of a group's offsets, each as one value: ``GroupPoll`` and
``CommitOffsets``.

Every front that takes a poll (the client port's group routes, ``ring.http_api.groups_api``, and
PolarStreams' consumer port, ``ring.http_api.polar_consumer``) or a commit (those two, and the Kafka
listener's OffsetCommit, ``ring.kafka_api.groups``) builds the value once from what it parsed. The
HTTP fronts check it first (group and member names by ``validate_name``, topic names, partitions and
offsets by ``checked_offsets``, bounds from ``ring.limits``) and answer 400 for what fails; Kafka's
OffsetCommit answers per partition, so its values go to Kafka's membership as parsed, which takes
the partitions and offsets it can and answers a code for each other one. The group operations (``ring.groups.service``),
the poller (``ring.groups.poller``) and Kafka's membership (``ring.groups.membership``) take it as
it is, checking only what it names against the coordinator's state (a topic's partition count, the
member's generation and assignment). A request forwarded to the group's coordinator arrives at its
client port as any request does, and that front parses it. The values sit beside ``ring.fetch`` and
``ring.offsets``, below every layer that carries them.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from ring import limits
from ring.catalog import validate_topic_name
from ring.errors import BadRequest

Offsets = tuple[tuple[str, int, int], ...]  # (topic, partition, next offset to read)


class GroupPoll(NamedTuple):  # a tuple: made per request (see ``ring.fetch``)
    """A poll by member ``consumer`` of ``group``: up to ``max_records`` records of the partitions it
    holds, waiting up to ``wait_ms`` when there are none.

    ``generation`` (None: any) is the generation the member believes current; ``auto_commit`` commits
    the positions it acknowledged; ``token`` names the answer it acknowledges (``ring.groups.delivery``:
    the one the request names, else the one its connection carried whole); ``leader`` limits the read
    to the partitions that broker leads (PolarStreams' consumers poll every broker); ``batches`` asks
    for stored batches rather than decoded records."""

    group: str
    consumer: str
    generation: int | None
    max_records: int  # 1..FETCH_RECORDS_MAX
    wait_ms: int = 0  # 0..LONG_POLL_WAIT_MS_MAX
    auto_commit: bool = True
    token: str | None = None
    leader: str | None = None
    batches: bool = False


class CommitOffsets(NamedTuple):  # a tuple, as GroupPoll
    """A commit into ``group``: ``offsets``, or (None) the member's positions, what it acknowledged
    receiving, after acknowledging the answer ``token`` names.

    ``consumer`` is the committing member (None: a commit from outside the membership, which only a
    group without members takes); ``generation`` the generation it commits under (None: the current
    one, or for Kafka's commit from outside the membership its -1)."""

    group: str
    consumer: str | None
    generation: int | None
    offsets: Offsets | None
    token: str | None = None


def validate_name(value: object, what: str) -> str:
    """A group or member name: 1-249 of ``limits.GROUP_NAME_PATTERN``'s characters, not "." or ".."."""
    if not isinstance(value, str) or not limits.GROUP_NAME_PATTERN.fullmatch(value) or value in (".", ".."):
        shown = repr(value)[:60] if isinstance(value, str) else type(value).__name__
        raise BadRequest(f"invalid {what} {shown}: use 1-249 of A-Z a-z 0-9 . _ - : @", field=what)
    return value


def checked_offsets(offsets: Iterable[tuple[str, int, int]], what: str) -> Offsets:
    """``offsets`` of a commit or a seek (``what`` names them in the 400): at least one, topic names
    valid; each partition and offset a non-negative integer as a front's parse made them."""
    items = tuple(offsets)
    if not items:
        raise BadRequest(f"{what} must list at least one {{topic, partition, offset}}")
    for t, p, o in items:
        validate_topic_name(t)
        assert type(p) is int and p >= 0 and type(o) is int and o >= 0, (t, p, o)
    return items
