"""Poll answers a member may not have received: what each handed out, the token naming it, and acknowledging one.

Theory of operation. A member's *position* in a partition (``Member.positions``)
is where its next poll reads from, and it moves only with what the client
acknowledged. A poll reads from the positions and hands out an ``Answer``:
per partition, the offset it read from and the offset after its last record.
The answer is remembered, not applied. The client acknowledges it by naming
its token on its next poll (or on a commit of its positions, or on leaving),
or by sending that request on the connection that carried the whole answer
(``ring.http_api.link``: the broker holding the connection names the token
for it). Acknowledging applies the answer's ends to the positions, and a
poll's implicit commit (and a commit of positions) commits positions only.
An answer that is never acknowledged changes nothing: the next poll reads
from the same positions, so its records go out again, to this member or,
after a rebalance, to the next owner of the partition. Nothing the client
did not see is committed, however the answer was lost (a broken connection,
a forwarding broker stopped mid-answer, a client that timed out and retried
elsewhere).

Acknowledging works partition by partition: an answer's end is applied only
where the member still reads from that answer's start, not where a reset, a
rebalance or another answer moved the position since. Several answers may
be out at once (a client polling through several connections, retries, a
PolarStreams consumer polling every broker): at most
``GROUP_POLL_ANSWERS_UNACKED_MAX`` reading one partition, the oldest
forgotten there first (its records there are read again).

A token names content: a hash of the group generation, the group's reset
count and the (topic, partition, start, end) the answer handed out. Two
answers with one token handed out the same offsets from the same state, so
acknowledging one is true of the other; a token echoed to a new coordinator
after a failover can only match an answer of the same records. Positions and
answers live in the coordinator's memory (not the offsets topic): a
coordinator that reloads its state starts every member from its committed
offsets.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Iterable

from ring.errors import BadRequest

TOKEN_CHARS = 22  # 16 bytes of BLAKE2b, unpadded base64url: collisions are out of reach
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{%d}" % TOKEN_CHARS)


@dataclass(frozen=True)
class Answer:
    """What one poll answer handed out: (topic, partition, start, end) where it moved a position."""

    token: str
    reads: tuple[tuple[str, int, int, int], ...]


def answer(generation: int, resets: int, reads: Iterable[tuple[str, int, int, int]]) -> Answer:
    """The answer of a poll that read ``reads``; partitions it did not move are left out."""
    moved = tuple(sorted((t, p, s, e) for t, p, s, e in reads if s != e))
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{generation}\x00{resets}".encode())
    for t, p, s, e in moved:
        digest.update(f"\x00{t}\x00{p}\x00{s}\x00{e}".encode())
    token = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    assert len(token) == TOKEN_CHARS
    return Answer(token, moved)


def parse_token(raw: object) -> str | None:
    """A token a client sent (None or "" when it sent none); 400 for anything that cannot be one."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or not TOKEN_PATTERN.fullmatch(raw):
        raise BadRequest(f"token must be the {TOKEN_CHARS}-character token of a poll answer", parameter="token")
    return raw
