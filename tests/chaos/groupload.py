"""Consumer-group members in a chaos run: ``ring.client`` consumers that can be killed, and the group's offsets.

``GroupLoad`` keeps ``members`` consumers of one group on the run's topic,
each an ``AsyncGroupConsumer`` (auto commit: every poll names the token of
the answer it read last) whose broker list starts at a random broker, so
most of its polls are forwarded to the group's coordinator. Members give up
on a request after about a second and a half and retry elsewhere, well
before their session runs out, so a stopped broker leaves behind polls that
the coordinator answers to nobody while the member lives on: what must not
be committed. Every record a member hands to its loop is a ``GroupRead``.
``kill_one`` is a consumer crash: its task is cancelled and its connections
dropped, without a leave or a commit; a new member (a new id) takes its
place at once, and the group rebalances when the dead one's session runs
out. At the end every
member still alive closes cleanly (committing what it handed out, then
leaving), and ``committed`` reads the group's offsets after healing. Every
loop is bounded by a deadline and a count.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Callable

from ring.client import AsyncGroupConsumer
from ring.errors import RingError
from ring.hashing import partition_for_key
from tests.chaos.cluster import ChaosCluster, value_text
from tests.chaos.history import GroupRead, History

GROUP = "chaos-group"
SESSION_TIMEOUT_MS = 10_000  # longer than any stop a scenario makes: members outlive them
POLL_WAIT_MS = 500
REQUEST_TIMEOUT_S = 1.0  # per request beyond the long-poll: a stopped broker is given up on soon
RETRY_BACKOFF_MS = 100.0
CLOSE_TIMEOUT_S = 10.0  # a clean close at the end (commit, leave) under faults still healing
RECORDS_MAX = 1_000_000  # per member: bounds its loop


@dataclass
class _Member:
    consumer: AsyncGroupConsumer
    task: asyncio.Task[None]


class GroupLoad:
    def __init__(self, cluster: ChaosCluster, topic: str, history: History, rng: random.Random,
                 now: Callable[[], float], members: int = 3) -> None:
        self.cluster, self.topic, self.history, self.rng, self.now = cluster, topic, history, rng, now
        self.size = members
        self.members: list[_Member] = []
        self._ids = 0
        self.deadline = 0.0

    def start(self, deadline: float) -> None:
        self.deadline = deadline
        for _ in range(self.size):
            self._spawn()

    def _spawn(self) -> None:
        self._ids += 1
        urls = [self.cluster.url(i) for i in range(self.cluster.size)]
        k = self.rng.randrange(len(urls))
        consumer = AsyncGroupConsumer(urls[k:] + urls[:k], GROUP, [self.topic], consumer_id=f"member-{self._ids}",
                                      session_timeout_ms=SESSION_TIMEOUT_MS, wait_ms=POLL_WAIT_MS,
                                      timeout_s=REQUEST_TIMEOUT_S, retry_backoff_ms=RETRY_BACKOFF_MS)
        self.members.append(_Member(consumer, asyncio.create_task(self._consume(consumer))))

    async def _consume(self, consumer: AsyncGroupConsumer) -> None:
        name = consumer.consumer_id
        for _ in range(RECORDS_MAX):
            if time.monotonic() >= self.deadline:
                return
            try:
                record = await consumer.__anext__()
            except StopAsyncIteration:
                return
            except RingError:  # no broker answered, or the group kept rebalancing: try again
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
                continue
            self.history.group_reads.append(GroupRead(name, record.partition, record.offset,
                                                      value_text(record.value), self.now()))

    async def kill_one(self) -> str:
        """A member crashes (no leave, no commit); a new one joins. Its id, for the event."""
        victim = self.members.pop(self.rng.randrange(len(self.members)))
        victim.task.cancel()
        await asyncio.gather(victim.task, return_exceptions=True)
        transport = victim.consumer._transport  # its connections, dropped as a crash drops them
        if transport is not None:
            await transport.session.close()
        self._spawn()
        return victim.consumer.consumer_id

    async def stop(self) -> None:
        """Members still alive stop reading, commit what they handed out and leave."""
        for m in self.members:
            m.task.cancel()
        await asyncio.gather(*(m.task for m in self.members), return_exceptions=True)
        for m in self.members:
            try:
                await asyncio.wait_for(m.consumer.close(), CLOSE_TIMEOUT_S)
            except (RingError, asyncio.TimeoutError, OSError) as exc:
                self.history.events.append((round(self.now(), 3), f"{m.consumer.consumer_id} did not close: {exc}"))

    async def coordinator(self) -> int | None:
        """The index of the group's coordinator (the leader of its offsets partition), as a broker sees it."""
        for i in range(self.cluster.size):
            if not self.cluster.answering(i):
                continue
            doc = await self.cluster.get_json(i, "/v1/topics/__offsets")
            if doc:
                leader = doc["partitions"][partition_for_key(GROUP.encode(), doc["partition_count"])]["leader"]
                return self.cluster.index(leader) if leader in self.cluster.names else None
        return None

    async def committed(self, timeout_s: float) -> dict[int, int] | None:
        """The group's committed offsets (partition -> offset), from the first broker that describes it."""
        deadline = time.monotonic() + timeout_s
        for _ in range(1_000):
            if time.monotonic() >= deadline:
                return None
            for i in range(self.cluster.size):
                doc = await self.cluster.get_json(i, f"/v1/groups/{GROUP}")
                if doc is not None:
                    return {o["partition"]: o["committed"] for o in doc["offsets"]
                            if o["topic"] == self.topic and o["committed"] is not None}
            await asyncio.sleep(0.5)
        return None

