"""The coordinator's driver of Kafka's classic group membership: what the Kafka listener's group APIs call.

``KafkaMembers`` runs the ``classic.ClassicGroup`` of each group in the shard
that holds the group's ring state (``Shard.classic``, beside ``Shard.groups``),
so the coordinator of a Kafka group is the coordinator of the ring group of
that name, found as ring's groups find it (``Coordinator.locate``), and a
broker that does not lead the group's offsets partition refuses with
``Unavailable`` (NOT_COORDINATOR on the wire). A join or sync that must wait
for others waits on a future, answered from the core's outbox after each
step; a timer (``GROUP_TICK_MS``) steps the cores' deadlines, and answers
``not_coordinator`` to requests waiting on a shard no longer led here.

Offsets are ring's: a commit goes through ``Coordinator.change`` as a
``Commit`` of the ring group (``Group.propose_commit`` without a member, so
quorum-written to ``__offsets`` before it is answered), after the core says
the member and generation may commit; a fetch reads ``Group.committed_at``.
So ``ring groups describe`` shows a Kafka group's offsets, and ``ring groups
reset`` moves them (and fences the membership: ``fence``). A name is either a
ring group with ring members or a Kafka group with Kafka members, never both
at once: a Kafka join finds ring members and is refused
(``inconsistent_group_protocol``), and ``Groups.join`` refuses a ring member
while Kafka members are in (409).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, NamedTuple

from ring import limits
from ring.errors import BadRequest, Overloaded, RingError, UnknownPartition, UnknownTopic
from ring.group_requests import CommitOffsets
from ring.groups import classic
from ring.groups.classic import ClassicGroup, JoinAnswer, SyncAnswer
from ring.groups.driver import Coordinator
from ring.groups.shard import Shard

log = logging.getLogger("ring.groups")

NOT_COORDINATOR = "not_coordinator"
UNKNOWN_PARTITION = "unknown_topic_or_partition"
DEAD = "dead"  # a group's state when there is no such group (or it was deleted)
RING_PROTOCOL_TYPE = "ring"  # the protocol type a group of ring's own (HTTP) members is listed with


class GroupView(NamedTuple):
    """A group as Kafka's ListGroups and DescribeGroups show it. ``state``: one of ``classic``'s states or
    ``DEAD``; ``protocol_type``: the Kafka members' ("consumer"), ``RING_PROTOCOL_TYPE`` while ring's own
    members are in it, "" for a group with committed offsets and no members (as Kafka lists a group
    that only commits)."""

    name: str
    state: str
    protocol_type: str
    protocol: str
    members: list[tuple[str, str, str, bytes, bytes]]  # (member id, client id, client host, metadata, assignment)


class KafkaMembers:
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.clock = coord.clock
        self._waiting: dict[tuple[str, str, str], tuple[ClassicGroup, asyncio.Future[Any]]] = {}
        self._timer: asyncio.Task[None] | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def _start(self) -> None:
        self.coord.start()
        if self._timer is None:
            self._timer = asyncio.create_task(self._tick_loop(), name="kafka groups timer")

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
            self._timer = None
        for _, fut in self._waiting.values():
            if not fut.done():
                fut.cancel()

    async def _tick_loop(self) -> None:
        while True:
            await self.clock.sleep(limits.GROUP_TICK_MS / 1000)
            try:
                self.tick()
            except Exception:
                log.exception("kafka groups timer failed")

    def tick(self) -> None:
        now = self.clock.monotonic()
        live: set[int] = set()
        for shard in self.coord.loaded_shards():
            for name, cg in list(shard.classic.items()):
                gone = cg.tick(now)
                if gone:
                    log.info("group %s: %s dropped (session or rebalance timeout)", name, ", ".join(gone))
                self._deliver(cg)
                if cg.idle():
                    del shard.classic[name]
                else:
                    live.add(id(cg))
        for key, (cg, fut) in list(self._waiting.items()):
            if id(cg) not in live and not fut.done():  # its shard was reloaded or moved away
                answer = JoinAnswer(NOT_COORDINATOR) if key[2] == "join" else SyncAnswer(NOT_COORDINATOR)
                fut.set_result(answer)

    # --- waiting ----------------------------------------------------------------------------

    def _deliver(self, cg: ClassicGroup) -> None:
        for member_id, answer in cg.outbox:
            kind = "join" if isinstance(answer, JoinAnswer) else "sync"
            waiting = self._waiting.get((cg.name, member_id, kind))
            if waiting is not None and not waiting[1].done():
                waiting[1].set_result(answer)
        cg.outbox.clear()

    async def _wait(self, cg: ClassicGroup, member_id: str, kind: str) -> Any:
        key = (cg.name, member_id, kind)
        old = self._waiting.get(key)
        if old is not None and not old[1].done():  # (the core answered it already; defensive)
            old[1].set_result(JoinAnswer(classic.REBALANCE_IN_PROGRESS) if kind == "join"
                              else SyncAnswer(classic.REBALANCE_IN_PROGRESS))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[key] = (cg, fut)
        try:
            return await fut
        finally:
            if self._waiting.get(key, (None, None))[1] is fut:
                del self._waiting[key]

    # --- the group's state ------------------------------------------------------------------

    async def _classic(self, group: str, create: bool) -> tuple[Shard, ClassicGroup | None, Any]:
        """The shard, the Kafka membership (made with ``create``) and the ring group; ``Unavailable`` when
        this broker does not coordinate ``group``."""
        _, shard, g = await self.coord.group(group)
        cg = shard.classic.get(group)
        if cg is None and create:
            if len(shard.classic) >= limits.GROUPS_PER_PARTITION_MAX:
                raise Overloaded(f"offsets partition {shard.partition} already holds "
                                 f"{limits.GROUPS_PER_PARTITION_MAX} Kafka groups")
            cg = shard.classic[group] = ClassicGroup(group)
        return shard, cg, g

    def _new_member_id(self, client_id: str) -> str:
        rng = self.coord.broker.rng
        return f"{client_id[:limits.KAFKA_GROUP_CLIENT_ID_IN_MEMBER_ID_MAX]}-" \
               f"{uuid.UUID(int=rng.getrandbits(128), version=4)}"

    # --- the APIs ---------------------------------------------------------------------------

    async def join(self, group: str, member_id: str, require_id: bool, client_id: str, session_timeout_ms: int,
                   rebalance_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
                   client_host: str = "") -> JoinAnswer:
        self._start()
        if classic.check_protocols(protocols) is not None:  # refused before anything is made for it
            return JoinAnswer(classic.INVALID_REQUEST)
        shard, cg, g = await self._classic(group, True)
        assert cg is not None
        if g is not None and g.members:
            answer = JoinAnswer(classic.INCONSISTENT_PROTOCOL)
        else:
            answer = cg.join(member_id, self._new_member_id(client_id), require_id, client_id,
                             session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols,
                             self.clock.monotonic(), client_host)
        self._deliver(cg)
        if cg.idle():
            shard.classic.pop(group, None)
        if answer.outcome != classic.WAIT:
            return answer
        return await self._wait(cg, answer.member_id, "join")

    async def sync(self, group: str, generation: int, member_id: str,
                   assignments: list[tuple[str, bytes]]) -> SyncAnswer:
        _, cg, _ = await self._classic(group, False)
        if cg is None:
            return SyncAnswer(classic.UNKNOWN_MEMBER)
        answer = cg.sync(member_id, generation, assignments, self.clock.monotonic())
        self._deliver(cg)
        if answer.outcome != classic.WAIT:
            return answer
        return await self._wait(cg, member_id, "sync")

    async def heartbeat(self, group: str, generation: int, member_id: str) -> str:
        _, cg, _ = await self._classic(group, False)
        return classic.UNKNOWN_MEMBER if cg is None else cg.heartbeat(member_id, generation, self.clock.monotonic())

    async def leave(self, group: str, member_ids: list[str]) -> list[str]:
        _, cg, _ = await self._classic(group, False)
        if cg is None:
            return [classic.UNKNOWN_MEMBER for _ in member_ids]
        now = self.clock.monotonic()
        outcomes = [cg.leave(m, now) for m in member_ids]
        self._deliver(cg)
        return outcomes

    async def fence(self, group: str) -> None:
        """The group's offsets were reset: its Kafka members' generation ends (``ClassicGroup.fence``)."""
        _, cg, _ = await self._classic(group, False)
        if cg is not None:
            cg.fence(self.clock.monotonic())
            self._deliver(cg)

    async def commit(self, req: CommitOffsets) -> dict[tuple[str, int], str]:
        """Commit ``req.offsets`` into ring's group, by Kafka member ``req.consumer`` (None: from outside
        the membership, Kafka's member id "") of generation ``req.generation`` (None: Kafka's -1); the
        outcome per partition."""
        group, offsets = req.group, req.offsets
        assert offsets is not None, req
        _, cg, _ = await self._classic(group, False)
        now = self.clock.monotonic()
        if cg is not None:
            outcome = cg.check_commit(req.consumer or "", -1 if req.generation is None else req.generation, now)
        else:
            outcome = classic.OK if req.generation is None else classic.UNKNOWN_MEMBER
        outcomes = {(t, p): outcome for t, p, _ in offsets}
        if outcome != classic.OK:
            return outcomes
        take = []
        catalog = self.coord.broker.catalog
        for t, p, o in offsets:
            try:
                if not 0 <= p < catalog.get(t).partitions:
                    raise UnknownPartition(f"{t}/{p}")
            except (UnknownTopic, UnknownPartition, BadRequest):
                outcomes[(t, p)] = UNKNOWN_PARTITION
                continue
            if o < 0:
                outcomes[(t, p)] = classic.INVALID_REQUEST
                continue
            take.append((t, p, o))
        if take:
            wall = self.clock.wall_ms()
            try:
                await self.coord.change(group, lambda g: g.propose_commit(None, None, take, now, wall),
                                        {t for t, _, _ in take})
            except RingError as exc:
                if exc.extra.get("reason") != "group_active":
                    raise
                for t, p, _ in take:  # ring members joined meanwhile: the name is theirs
                    outcomes[(t, p)] = classic.INCONSISTENT_PROTOCOL
        return outcomes

    async def committed(self, group: str,
                        topics: list[tuple[str, list[int]]] | None) -> list[tuple[str, list[tuple[int, int]]]]:
        """The committed offsets (-1: none) of the partitions asked for, or of every partition with one."""
        _, _, g = await self.coord.group(group)
        if g is not None and g.dropped:
            g = None
        if topics is None:
            held: dict[str, list[int]] = {}
            for t, p in sorted(g.committed if g is not None else ()):
                if g.committed_at((t, p)) is not None:
                    held.setdefault(t, []).append(p)
            topics = sorted(held.items())
        out = []
        for t, parts in topics:
            at = [(p, -1 if g is None or (o := g.committed_at((t, p))) is None else o) for p in parts]
            out.append((t, at))
        return out

    # --- views ------------------------------------------------------------------------------

    async def listed(self) -> list[GroupView]:
        """Every group this broker coordinates (the shards of the offsets partitions it leads), members left
        out: what ListGroups answers."""
        out: dict[str, GroupView] = {}
        for shard, g in await self.coord.local_groups():
            out[g.name] = self._view(g.name, g, shard.classic.get(g.name), False)
        for shard in self.coord.loaded_shards():  # Kafka groups that have committed nothing yet
            for name, cg in shard.classic.items():
                if name not in out and cg.members:
                    out[name] = self._view(name, None, cg, False)
        return [out[name] for name in sorted(out)]

    async def described(self, group: str) -> GroupView:
        """One group with its members; ``DEAD`` for a group there is none of (as Kafka answers); ``Unavailable``
        when this broker does not coordinate it."""
        _, shard, g = await self.coord.group(group)
        return self._view(group, g, shard.classic.get(group), True)

    @staticmethod
    def _view(name: str, g: Any, cg: ClassicGroup | None, with_members: bool) -> GroupView:
        if cg is not None and cg.members:
            members = [(m.id, m.client_id, m.client_host, dict(m.protocols).get(cg.protocol, b""), m.assignment)
                       for m in cg.members.values()] if with_members else []
            return GroupView(name, cg.state, cg.protocol_type, cg.protocol, members)
        if g is None or g.dropped:
            return GroupView(name, DEAD, "", "", [])
        if g.members:
            members = [(m.id, m.spec.client or "", "", b"", b"")
                       for m in sorted(g.members.values(), key=lambda m: m.id)]
            return GroupView(name, classic.STABLE, RING_PROTOCOL_TYPE, "", members if with_members else [])
        return GroupView(name, classic.EMPTY, "", "", [])

    def describe(self, cg: ClassicGroup) -> dict[str, Any]:
        """The Kafka membership as ``GET /v1/groups/{group}`` shows it, members as ring's are shown."""
        now = self.clock.monotonic()
        members = []
        for m in cg.members.values():
            meta = dict(m.protocols).get(cg.protocol, m.protocols[0][1] if m.protocols else b"")
            topics = classic.subscription_topics(meta) if cg.protocol_type == "consumer" else []
            assigned = classic.assignment_partitions(m.assignment) if cg.protocol_type == "consumer" else []
            members.append({"member": m.id, "consumer": m.id, "client": m.client_id, "topics": topics,
                            "assignment": [{"topic": t, "partition": p} for t, p in assigned],
                            "session_timeout_ms": m.session_timeout_ms,
                            "idle_ms": int((now - m.last_seen) * 1000), "reset": None})
        return {"state": cg.state, "generation": cg.generation, "members": members,
                "kafka": {"protocol_type": cg.protocol_type, "protocol": cg.protocol, "leader": cg.leader}}
