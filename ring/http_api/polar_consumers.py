"""The PolarStreams consumers a broker knows: which group an id reads in, and which consumer a connection is.

PolarStreams names a consumer two ways. A *stateless* consumer sends its id
(``consumerId``, or the older ``consumer_id``) on every request; registering
it on one broker registers it on every live broker, so any broker can tell
its group from its id. A *connection-bound* consumer registers with a JSON
body (``{id, group, topics}``) and is then known by its connection alone:
requests on that connection need no id. Either is a member of a ring consumer
group (``ring.groups``) with PolarStreams' session timeout; the registry only
maps ids and connections to ``Consumer`` entries, so that a request can find
its group's coordinator.

An id not used on this broker for ``POLAR_SESSION_TIMEOUT_MS`` is forgotten
(PolarStreams drops a consumer after that long without a request), as is the
least recently used one past ``POLAR_CONSUMERS_MAX``; a forgotten consumer
registers again (its next request is answered 409). A connection's binding
goes with the connection object.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from ring import limits

RESET_POLICIES = {"startFromLatest": "latest", "startFromEarliest": "earliest"}  # onNewGroup -> ring's reset


@dataclass(frozen=True)
class Consumer:
    id: str
    group: str
    topics: tuple[str, ...]  # as registered, in order: registering again must name the same
    reset: str  # ring's reset policy: earliest | latest

    def same_as(self, other: Consumer) -> bool:
        return (self.group, self.topics) == (other.group, other.topics)


class Registry:
    def __init__(self, now: Callable[[], float], size_max: int = limits.POLAR_CONSUMERS_MAX,
                 idle_s: float = limits.POLAR_SESSION_TIMEOUT_MS / 1000) -> None:
        self._now = now  # monotonic seconds
        self._size_max = size_max
        self._idle_s = idle_s
        self._by_id: OrderedDict[str, tuple[Consumer, float]] = OrderedDict()  # least recently used first
        self._by_conn: weakref.WeakKeyDictionary[Any, Consumer] = weakref.WeakKeyDictionary()

    def get(self, consumer_id: str) -> Consumer | None:
        """The consumer with this id, touched; None when unknown or idle too long."""
        entry = self._by_id.get(consumer_id)
        if entry is None:
            return None
        now = self._now()
        if now - entry[1] > self._idle_s:
            del self._by_id[consumer_id]
            return None
        self._by_id[consumer_id] = (entry[0], now)
        self._by_id.move_to_end(consumer_id)
        return entry[0]

    def put(self, consumer: Consumer) -> None:
        self._by_id[consumer.id] = (consumer, self._now())
        self._by_id.move_to_end(consumer.id)
        while len(self._by_id) > self._size_max:
            self._by_id.popitem(last=False)

    def forget(self, consumer_id: str) -> None:
        self._by_id.pop(consumer_id, None)

    def bind(self, conn: Any, consumer: Consumer) -> None:
        """``consumer`` is the one requests on ``conn`` (a connection's handler object) come from."""
        self._by_conn[conn] = consumer

    def bound(self, conn: Any) -> Consumer | None:
        try:
            return self._by_conn.get(conn)
        except TypeError:  # an object without weak references is no connection of ours
            return None

    def unbind(self, conn: Any) -> None:
        try:
            self._by_conn.pop(conn, None)
        except TypeError:
            pass
