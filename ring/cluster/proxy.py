"""Reads a broker does not serve itself, asked of other brokers: ``Proxy``.

``Router`` (``routing.py``) decides where a read goes (this broker's
replica, a live replica, the leader); ``Proxy`` asks there. A replica's
client URLs are those of the live brokers among the partition's placed
replicas and voters; ``first_answer`` asks them in a random order (one that
does not answer, or answers 5xx, passes to the next; a 4xx is the answer). A proxied fetch holds
room for its answer in the broker's budget of fetch answers
(``ring.http_api.answer``) while it arrives, and long-polls there for at
most ``PROXIED_FETCH_WAIT_MS_MAX``.
``Proxy`` is given a ``ProxyHost``, the names it uses of the broker; it
never imports the broker.
"""

from __future__ import annotations

import random
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from ring import limits
from ring.cluster.membership import Membership
from ring.cluster.peers import Relayed
from ring.errors import Unavailable
from ring.answer_budget import AnswerBudget
from ring.replication.reads import StoredRead
from ring.replication.replica import Replica

T = TypeVar("T")


class ClientRequests(Protocol):
    async def fetch(self, url: str, topic: str, partition: int, offset: int | None, max_bytes: int,
                    wait_ms: int) -> tuple[bytes, int]: ...

    async def json(self, method: str, url: str, path: str, params: dict[str, str] | None = None,
                   body: Any = None) -> Any: ...


class ProxyHost(Protocol):
    name: str
    rng: random.Random
    membership: Membership | None  # None until the broker opens
    peers: ClientRequests | None  # None until the broker starts

    def replica(self, topic: str, partition: int) -> Replica | None: ...


class Proxy:
    def __init__(self, host: ProxyHost, budget: Callable[[], AnswerBudget]) -> None:
        self.host = host
        self.budget = budget  # the broker's budget of fetch answers, shared with its client API

    def urls(self, names: list[str], topic: str, partition: int) -> list[str]:
        """The client URLs of the live brokers among ``names`` (this one left out)."""
        members = self.host.membership
        urls = [members.client_url(r) for r in names if r != self.host.name and members.alive(r)]
        urls = [u for u in urls if u]
        if not urls:
            raise Unavailable(f"no other replica of {topic}/{partition} is alive ({', '.join(names)})",
                              topic=topic, partition=partition)
        return urls

    def leader_url(self, leader: str | None) -> str | None:
        """The client URL of ``leader`` when it is another broker and alive, else None."""
        members = self.host.membership
        if leader is None or leader == self.host.name or not members.alive(leader):
            return None
        return members.client_url(leader)

    async def first_answer(self, urls: list[str], ask: Callable[[str], Awaitable[T]]) -> T:
        """The first answer of the brokers at ``urls``, asked in a random order: one that does not
        answer, or answers 5xx, passes to the next; a 4xx is the answer."""
        order = self.host.rng.sample(urls, len(urls))
        for i, url in enumerate(order):
            try:
                return await ask(url)
            except (Unavailable, Relayed) as exc:
                if i == len(order) - 1 or (isinstance(exc, Relayed) and exc.status < 500):
                    raise
        raise AssertionError("unreachable: at least one URL")

    async def ask(self, urls: list[str], method: str, path: str, params: dict[str, str] | None = None) -> Any:
        """A client-API request to the first of ``urls`` that answers (random order)."""
        return await self.first_answer(urls, lambda url: self.host.peers.json(method, url, path, params))

    async def fetch(self, urls: list[str], topic: str, partition: int, offset: int | None, max_bytes: int,
                    wait_ms: int) -> StoredRead:
        """A fetch answered by the first of ``urls`` that answers (random order)."""
        # The replica's answer arrives while other requests run: room for it is held
        # meanwhile (the caller holds what came, from the moment it returns). It may
        # exceed max_bytes by one batch (a read returns one whole batch at least).
        if offset is None:
            # From the start: a replica's earliest offset first. Its stored batches come whole, so
            # the first may hold offsets below the start, and an empty answer's next offset is the start.
            doc = await self.ask(urls, "GET", f"/v1/topics/{topic}/partitions/{partition}/offsets",
                                 {"timestamp": "earliest"})
            offset = doc.get("offset") if isinstance(doc, dict) else None
            if type(offset) is not int or offset < 0:
                raise Unavailable(f"no replica of {topic}/{partition} said where it starts",
                                  topic=topic, partition=partition)
        budget = self.budget()
        max_bytes = budget.grant(max_bytes)
        # A shorter long-poll there than asked (an empty answer is what a long-poll may give)
        # rather than the peer request's own timeout.
        wait_ms = min(wait_ms, limits.PROXIED_FETCH_WAIT_MS_MAX)
        with budget.hold(max_bytes):
            data, hw = await self.first_answer(
                urls, lambda url: self.host.peers.fetch(url, topic, partition, offset, max_bytes, wait_ms))
        rep = self.host.replica(topic, partition)
        if rep is not None and not rep.deleted:
            hw = max(hw, rep.hw)  # a range's holder may know an older one
        return StoredRead(topic, partition, offset, data, hw, -1)
