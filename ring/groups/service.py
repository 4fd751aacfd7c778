"""Consumer-group operations on the coordinator, as JSON-ready answers: join, leave, poll, commit, reset, describe.

``Groups`` is what the HTTP layer calls once it knows this broker coordinates
the group (``Coordinator.locate``). A poll and a commit come as the values
their front built and checked (``ring.group_requests``); each operation checks
what it names against the coordinator's state, makes its change through
``Coordinator.change`` (persisted before it is applied or answered) and
describes the result. Lag is the partition's high watermark
minus the committed offset, read from this broker's replica or, where it
holds none, from a replica (``Broker.offsets``).
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from ring import limits
from ring.catalog import validate_topic_name
from ring.errors import BadRequest, Conflict, NotFound, RingError, TopicRecreated, UnknownPartition
from ring.group_requests import CommitOffsets, GroupPoll, Offsets, validate_name
from ring.groups.driver import Coordinator
from ring.groups.group import RESET_POLICIES, Commit, Group
from ring.groups.membership import KafkaMembers
from ring.groups.poller import Polled, Poller
from ring.offsets import EARLIEST, LATEST, OffsetsAt

RESET_TARGETS = ("earliest", "latest", "offset", "timestamp")


def _tps(items: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in items]



class GroupLag(NamedTuple):
    """One (group, topic, partition) as the group coordinator sees it."""

    group: str
    topic: str
    partition: int
    committed: int | None  # None: nothing committed yet
    end_offset: int  # the partition's high watermark
    members: int

class Groups:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.coord = Coordinator(broker)
        self.poller = Poller(self.coord)
        self.membership = KafkaMembers(self.coord)  # Kafka's classic members (the Kafka listener's group APIs)

    # --- membership ---------------------------------------------------------------------

    async def join(self, group: str, consumer: str, topics: list[str], session_timeout_ms: int,
                   client: str | None, reset: str) -> dict[str, Any]:
        if not topics or len(topics) > limits.GROUP_MEMBER_TOPICS_MAX:
            raise BadRequest(f"topics must list 1-{limits.GROUP_MEMBER_TOPICS_MAX} topic names")
        topics = sorted({validate_topic_name(t) for t in topics})
        if reset not in RESET_POLICIES:
            raise BadRequest(f"reset must be one of {', '.join(RESET_POLICIES)}")
        _, shard, _ = await self.coord.group(group)
        kafka = shard.classic.get(group)
        if kafka is not None and kafka.members:
            raise Conflict(f"group {group!r} has Kafka consumers ({len(kafka.members)}): a group's members are "
                           "all Kafka consumers or all ring consumers; use another group name",
                           group=group, reason="kafka_group")
        clock = self.coord.clock
        await self.coord.change(group, lambda g: g.propose_join(
            consumer, topics, session_timeout_ms, client, reset, self.coord.partitions_of(topics),
            clock.monotonic(), clock.wall_ms()), topics)  # the assignment is made for the topics' ids now
        g = await self.coord.existing(group)
        m = g.members.get(consumer)
        if m is not None:
            g.rejoined(m)
        m = g.member(consumer, None, clock.monotonic())
        doc: dict[str, Any] = {"group": group, "consumer": consumer, "generation": g.generation,
                               "assignment": _tps(m.spec.assignment), "members": len(g.members),
                               "session_timeout_ms": m.spec.session_timeout_ms, "topic_ids": dict(m.ids)}
        if not m.spec.assignment:
            total = sum(self.coord.partitions_of(topics).values())
            doc["idle"] = True
            doc["message"] = (f"group {group!r} has {len(g.members)} consumers for {total} partitions of "
                              f"{', '.join(topics)}: {consumer} gets none until a rebalance gives it some")
        return doc

    async def leave(self, group: str, consumer: str, commit: bool, token: str | None = None) -> dict[str, Any]:
        """With ``commit``, first commit what the member acknowledged (``token`` names an answer it got)."""
        clock = self.coord.clock
        _, _, g = await self.coord.group(group)
        try:
            (g or Group(group)).member(consumer, None, clock.monotonic())  # 409 when not a member
        except TopicRecreated:
            commit = False  # what it read was of the old topic: nothing of it is committed for the new one
        committed: list[Any] = []
        if commit:
            committed = await self._commit_positions(group, consumer, None, token)
        await self.coord.change(group, lambda g: g.propose_leave(
            consumer, clock.wall_ms(), self.coord.partitions_of(g.subscribed())))
        g = await self.coord.existing(group)
        return {"group": group, "consumer": consumer, "left": True, "generation": g.generation,
                "committed": [{"topic": t, "partition": p, "offset": o} for t, p, o in committed]}

    # --- records and offsets ----------------------------------------------------------------

    async def delete(self, group: str) -> None:
        """Delete a group and its committed offsets (a persisted ``Drop``), as Kafka's DeleteGroups does: 404
        when there is no such group, 409 ``group_not_empty`` while ring's or Kafka's members are in it."""
        validate_name(group, "group")
        _, shard, _ = await self.coord.group(group)

        def propose(g: Group) -> Any:
            kafka = shard.classic.get(group)
            if kafka is not None and kafka.members:
                raise Conflict(f"group {group!r} has Kafka members ({len(kafka.members)}); it can be deleted "
                               "once they have left", group=group, reason="group_not_empty")
            return g.propose_drop(self.coord.clock.wall_ms())
        if not await self.coord.change(group, propose):
            raise NotFound(f"no consumer group {group!r}", group=group)

    async def member_topics(self, group: str, consumer: str) -> tuple[str, ...]:
        """The topics a member subscribes to (none for an unknown one: its request gets 409 next)."""
        _, _, g = await self.coord.group(group)
        m = None if g is None else g.members.get(consumer)
        return () if m is None else m.spec.topics

    async def poll(self, req: GroupPoll) -> Polled:
        got = await self.poller.poll(req)
        metrics = getattr(self.broker, "metrics", None)
        if metrics is not None and (got.records or got.batches):  # records out, per topic (GET /metrics, admin)
            metrics.delivered(got.topics())
        return got

    async def commit(self, req: CommitOffsets) -> dict[str, Any]:
        """Commit ``req.offsets`` (partitions the member holds), or the member's positions."""
        group, consumer, generation, offsets = req.group, req.consumer, req.generation, req.offsets
        if offsets is None:
            assert consumer is not None, req
            done = await self._commit_positions(group, consumer, generation, req.token)
            return {"group": group, "committed": [{"topic": t, "partition": p, "offset": o} for t, p, o in done]}
        for t, p, _ in offsets:
            self._check_partition(t, p)
        clock = self.coord.clock
        await self.coord.change(group, lambda g: g.propose_commit(consumer, generation, offsets,
                                                                  clock.monotonic(), clock.wall_ms()),
                                {t for t, _, _ in offsets})  # committed for the topics' ids now
        g = await self.coord.existing(group)
        return {"group": group, "generation": g.generation,
                "committed": [{"topic": t, "partition": p, "offset": g.committed[(t, p)]} for t, p, _ in offsets]}

    async def _commit_positions(self, group: str, consumer: str, generation: int | None,
                                token: str | None) -> list[tuple[str, int, int]]:
        """Commit the member's positions, after acknowledging the answer ``token`` names (a poll's implicit
        commit, on its own)."""
        clock = self.coord.clock
        await self.poller.acknowledge(group, consumer, generation, token)  # 409 before anything else
        events = await self.coord.change(group, lambda g: g.propose_poll_commit(
            g.member(consumer, generation, clock.monotonic()), clock.wall_ms()))
        return [o for e in events if isinstance(e, Commit) for o in e.offsets]

    async def seek(self, group: str, consumer: str, generation: int | None, positions: Offsets) -> dict[str, Any]:
        """Move where a member's next poll reads (partitions it holds); committed offsets stay.
        ``positions`` are as ``checked_offsets`` passed them."""
        for t, p, _ in positions:
            self._check_partition(t, p)
        _, _, g = await self.coord.group(group)
        g = g or Group(group)
        g.seek(consumer, generation, positions, self.coord.clock.monotonic())
        return await self.positions(group, consumer)

    async def positions(self, group: str, consumer: str) -> dict[str, Any]:
        """Where the member's next poll reads each partition it holds (null: its reset policy decides)."""
        _, _, g = await self.coord.group(group)
        g = g or Group(group)
        m = g.member(consumer, None, self.coord.clock.monotonic())
        return {"group": group, "consumer": consumer, "generation": g.generation, "positions": [
            {"topic": t, "partition": p, "position": g.start_offset(m, (t, p)), "committed": g.committed_at((t, p))}
            for t, p in m.spec.assignment]}

    def _check_partition(self, topic: str, partition: int) -> int:
        cfg = self.broker.catalog.get(topic)
        if type(partition) is not int or not 0 <= partition < cfg.partitions:
            raise UnknownPartition(f"topic {topic!r} has partitions 0..{cfg.partitions - 1}, not {partition!r}",
                                   topic=topic, partition=partition)
        return cfg.partitions

    async def reset(self, group: str, topic: str, to: str, value: int | None,
                    partition: int | None) -> dict[str, Any]:
        """Move the group's committed offsets of ``topic`` (one partition or all) and drop read positions."""
        if to not in RESET_TARGETS:
            raise BadRequest(f"to must be one of {', '.join(RESET_TARGETS)}")
        if to in ("offset", "timestamp") and (type(value) is not int or value < 0):
            raise BadRequest(f"reset to {to} needs a non-negative integer value")
        count = self.broker.catalog.get(validate_topic_name(topic)).partitions
        parts = range(count) if partition is None else [partition]
        if partition is not None:
            self._check_partition(topic, partition)
        offsets = []
        for p in parts:
            if to == "offset":
                offsets.append((topic, p, value))
                continue
            doc = await self.broker.offsets(OffsetsAt(topic, p, to if to in (EARLIEST, LATEST) else value))
            offsets.append((topic, p, int(doc["offset"])))
        clock = self.coord.clock
        await self.coord.change(group, lambda g: g.propose_reset(offsets, clock.wall_ms()), [topic])
        await self.membership.fence(group)  # Kafka members join again and read from the reset offsets
        return {"group": group, "topic": topic, "to": to,
                "offsets": [{"partition": p, "offset": o} for _, p, o in offsets]}

    # --- views -------------------------------------------------------------------------------

    async def _high_watermark(self, topic: str, partition: int) -> int | None:
        rep = getattr(self.broker, "replica", lambda t, p: None)(topic, partition)
        if rep is not None:
            return rep.hw
        try:
            return int((await self.broker.offsets(OffsetsAt(topic, partition, LATEST)))["offset"])
        except (RingError, KeyError, ValueError, TypeError):
            return None

    async def describe_group(self, g: Group) -> dict[str, Any]:
        now = self.coord.clock.monotonic()
        self.coord.see_topics(g)
        members = [{"member": m.id, "consumer": m.id, "client": m.spec.client, "topics": list(m.spec.topics),
                    "assignment": _tps(m.spec.assignment), "session_timeout_ms": m.spec.session_timeout_ms,
                    "idle_ms": int((now - m.last_seen) * 1000), "reset": m.spec.reset}
                   for m in sorted(g.members.values(), key=lambda m: m.id)]
        tps = self._partitions_read(g)
        owners = {tp: m.id for m in g.members.values() for tp in m.spec.assignment}
        offsets = []
        for t, p in sorted(tps):
            committed = g.committed_at((t, p))  # none for an offset of an older topic of that name
            hw = await self._high_watermark(t, p) if t in self.broker.catalog else None
            lag = None if hw is None else max(0, hw - (committed or 0))
            offsets.append({"topic": t, "partition": p, "committed": committed, "high_watermark": hw,
                            "lag": lag, "consumer": owners.get((t, p))})
        return {"group": g.name, "state": g.state(), "generation": g.generation,
                "coordinator": self.broker.config.name, "members": members, "offsets": offsets}

    def _partitions_read(self, g: Group) -> set[tuple[str, int]]:
        """Every partition of the topics a group's members subscribe to or it has committed offsets in:
        a group with no members still lags on the partitions it never committed."""
        topics = g.subscribed() | {t for t, _ in g.committed}
        tps = set(g.committed)
        for t, n in self.coord.partitions_of(topics).items():
            tps.update((t, p) for p in range(n))
        return tps

    async def describe(self, group: str) -> dict[str, Any]:
        _, shard, g = await self.coord.group(group)
        kafka = shard.classic.get(group)
        if g is None or g.dropped:
            if kafka is None or not kafka.members:
                raise NotFound(f"no consumer group {group!r}", group=group)
            g = Group(group)
        return await self._with_kafka(await self.describe_group(g), kafka)

    async def _with_kafka(self, doc: dict[str, Any], kafka: Any) -> dict[str, Any]:
        """A group's view with its Kafka members in it, when it has any."""
        if kafka is None or not kafka.members:
            return doc
        view = self.membership.describe(kafka)
        owners = {(a["topic"], a["partition"]): m["member"] for m in view["members"] for a in m["assignment"]}
        for o in doc["offsets"]:
            o["consumer"] = owners.get((o["topic"], o["partition"]), o["consumer"])
        known = {(o["topic"], o["partition"]) for o in doc["offsets"]}
        for tp in sorted(set(owners) - known):  # assigned, nothing committed yet
            hw = await self._high_watermark(*tp) if tp[0] in self.broker.catalog else None
            doc["offsets"].append({"topic": tp[0], "partition": tp[1], "committed": None, "high_watermark": hw,
                                   "lag": hw, "consumer": owners[tp]})
        doc.update(view)
        return doc

    def lag_rows(self) -> list[Any]:
        """(group, topic, partition, committed, high watermark, members) for the metrics scrape: the
        groups this broker coordinates, partitions it holds a replica of (no I/O)."""
        rows = []
        replica = getattr(self.broker, "replica", lambda t, p: None)
        for shard in self.coord.loaded_shards():
            for g in shard.groups.values():
                self.coord.see_topics(g)
                for t, p in sorted(self._partitions_read(g)):
                    rep = replica(t, p)
                    if rep is not None:
                        rows.append(GroupLag(g.name, t, p, g.committed_at((t, p)), rep.hw, len(g.members)))
        return rows

    async def list_local(self) -> list[dict[str, Any]]:
        out, seen = [], set()
        for shard, g in await self.coord.local_groups():
            seen.add(g.name)
            out.append(await self._with_kafka(await self.describe_group(g), shard.classic.get(g.name)))
        for shard in self.coord.loaded_shards():  # Kafka groups that have committed nothing yet
            for name, kafka in sorted(shard.classic.items()):
                if name not in seen and kafka.members:
                    out.append(await self._with_kafka(await self.describe_group(Group(name)), kafka))
        return out
