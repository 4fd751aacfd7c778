"""What a client connection vouches for: the group poll answer it wrote whole before a request began.

A group poll commits its member's previous answer only once the client shows
it got that answer (``ring.groups.delivery``). The connection can show it: an
HTTP/1.1 client that does not pipeline sends its next request on a
connection only after reading the whole previous answer. So when a poll
answer's last byte was handed to the socket and the next request on that
connection began to arrive after that, the client read the answer.

Any server front provides this with two obligations and nothing else:

* a ``ClientLink`` per client connection, and for each request a ``Via`` made when
  the request's *first byte* arrived: ``Via(link, link.written)``. A front
  that cannot tell exactly when a request began may make it earlier, never
  later (an early Via only vouches for less);
* a group poll's answer runs what ``answering`` returns right before its
  last byte is handed to the transport, in the same synchronous step, so no
  request can be stamped in between (``web.Response.before_last``, called by
  the client port's front).

``acknowledged`` turns a request's Via into the token of the answer it
acknowledges. A request forwarded to the group's coordinator carries no Via
of the client's connection: the broker holding that connection names the
answer in the forwarded request's token (``groups_api``), and the
coordinator never mistakes the forwarding broker's connection for the
client's. A link
remembers one answer, the last poll answer it carried: a token covers
clients that interleave members on one connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Mark:
    """A group poll answer: the member it went to, and its token."""

    group: str
    consumer: str
    token: str


class ClientLink:
    """One client connection, as group polls see it."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written: Mark | None = None  # the last poll answer handed to the socket whole

    def wrote(self, mark: Mark) -> None:
        self.written = mark


@dataclass(frozen=True)
class Via:
    """A request's connection, and the poll answer that connection had written whole when the request began."""

    link: ClientLink
    seen: Mark | None

    def token_for(self, group: str, consumer: str) -> str | None:
        """The token of that answer, if it went to this member."""
        seen = self.seen
        if seen is None or seen.group != group or seen.consumer != consumer:
            return None
        return seen.token


def acknowledged(via: Via | None, group: str, consumer: str, named: str | None) -> str | None:
    """The token of the answer a group request acknowledges: the one it names, else the poll answer of
    this member its connection wrote whole before it began. ``via`` is None for a forwarded request."""
    if named is not None or via is None:
        return named
    return via.token_for(group, consumer)


def answering(via: Via | None, group: str, consumer: str, token: str | None) -> Callable[[], None] | None:
    """A poll answer goes out on ``via``'s connection: until its last byte does, the connection vouches
    for no answer. What to call right before that last byte is handed over (None: nothing to mark)."""
    if via is None:
        return None
    via.link.written = None
    if token is None:
        return None
    mark, conn = Mark(group, consumer, token), via.link
    return lambda: conn.wrote(mark)


def via_of(request: Any) -> Via | None:
    """The request's Via, None when its front made none (or it is not a request of a client connection)."""
    return getattr(request, "via", None)
