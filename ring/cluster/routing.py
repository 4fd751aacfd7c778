"""Where a clustered broker's produces and reads go: to the leader, to a replica, or here.

``Router`` is a ``ClusterBroker``'s router (the broker's ``router``, which
it calls for every produce and read; ``ring.replication.local`` has the
``Routing`` it answers to). It is given a ``RouterHost``, the names it uses of
the broker, and never imports the broker; what it serves here it hands to a
``LocalRouter``, a broker alone's. Where a produce for a partition goes is the
node core's decision (``NodeCore.route``): appended here when this broker
leads, else forwarded to the leader's peer port, as long as that leader is
alive and reachable (its replication links with us not closed for
``LINK_LOSS_GRACE_MS``). While no such leader is known (an election is
running) or a forward comes back ``not_leader`` (leadership just moved;
nothing was written), it waits for leadership to change and tries again, for
up to ``LEADER_WAIT_MS`` in all; a partition that cannot elect (fewer than a
majority of its voters alive and reachable) is refused at once, and a
forward whose leader turns unreachable is given up (504, outcome unknown).
The leader appends only while it leads, is not handing the partition over
and reaches enough voters for the level (``NodeCore.admit``), and answers
once the consistency level's number of voters hold the batches; if it loses
the lead meanwhile the answer is 504 (outcome unknown). Reads are served from
this broker's replica up to its high watermark; a partition held elsewhere,
or whose copy here failed a check (it is being repaired), is read from a live
replica, asked by the broker's ``Proxy`` (``proxy.py``). A follower lags its
leader: offsets it has not received but its leader told it are committed
are waited for (or answered empty), and an offset past all it knows of is
asked of the leader, never called out of range here. A follower that has not
taken its leader's sync since this broker started asks the leader too (or
answers 503): the partition's start may have moved meanwhile, and so does a
new leader whose voters hold a later start than its own log, below that start,
until its log moves up. A truncate is answered once a majority of the voters
hold its start (``_start_held``): a failover cannot undo it then.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Protocol

from ring import limits
from ring.catalog import Catalog, TopicConfig, validate_topic_name
from ring.clock import Clock
from ring.cluster.membership import Membership
from ring.cluster.peers import PeerClient, Relayed, answer_json
from ring.cluster.proxy import Proxy
from ring.cluster.pump import NodePump
from ring.errors import NoEligibleLeader, NotLeader, RequestTimeout, RingError, StorageError, Unavailable
from ring.fetch import Fetch
from ring.offsets import EpochEnd, OffsetsAt, Truncate
from ring.node.core import NodeCore
from ring.node.ready import AwaitAcks, AwaitStart, Ready
from ring.produce import Produce
from ring.ranges.manager import Ranges
from ring.replication import protocol, reads
from ring.replication.appends import Appending
from ring.replication.intake import ProduceResult, result_of
from ring.replication.local import LocalHost, LocalRouter, append_awaited, join_turn
from ring.replication.reads import Fetched, StoredRead, settled
from ring.replication.replica import Replica

# A forwarded produce checks this often whether its leader became unreachable.
log = logging.getLogger("ring.cluster")

FORWARD_CHECK_S = 0.25


class RouterHost(LocalHost, Protocol):
    """What a ``Router`` uses of its broker, besides what its ``LocalRouter`` does."""

    name: str
    clock: Clock
    catalog: Catalog
    core: NodeCore | None  # None until the broker opens
    membership: Membership | None  # None until the broker opens
    pump: NodePump | None  # None until the broker starts
    peers: PeerClient | None  # None until the broker starts
    ranges: Ranges  # the ranges below the local logs (ring.ranges)
    proxy: Proxy  # what asks other brokers for the reads not served here

    def check_joined(self) -> None:
        """Raise ``Unavailable`` while the broker shuts down or has not joined the cluster yet."""

    def replica(self, topic: str, partition: int) -> Replica | None: ...

    def preference_list(self, cfg: TopicConfig, p: int) -> list[str]:
        """The brokers placement puts partition ``p`` of ``cfg`` on."""

    def leader_of(self, topic: str, partition: int) -> str | None: ...

    def step(self, message: object) -> Ready: ...

    def damaged(self, rep: Replica, offset: int) -> None:
        """A stored batch of ``rep`` failed its check: never serve it, repair it."""


class Forwarding:
    """A produce sent on to its partition's leader (``Router._forward``), answered from the leader's
    answer with no task of its own: a future as ``Appending`` is (``done``, ``add_done_callback``,
    ``result`` the (base offset, count)), so the front's ``Later`` waits on either alike. When it is to
    ``follow``, a leader that answers it does not lead (nothing was written) sends it the awaited way,
    which follows the new leader; else that answer is its outcome, for the awaited way to follow. The
    router gives it up, outcome unknown, once its leader turns unreachable or its deadline passes
    (``Router._check_forwards``)."""

    __slots__ = ("router", "leader", "request", "cfg", "partition", "batches", "sent", "deadline", "follow",
                 "base", "count", "_done", "_exc", "_callbacks")

    def __init__(self, router: Router, leader: str, request: Produce, cfg: TopicConfig, partition: int,
                 batches: list[bytearray], sent: asyncio.Future, deadline: float, follow: bool) -> None:
        self.router, self.leader, self.request, self.cfg = router, leader, request, cfg
        self.partition, self.batches, self.sent, self.deadline = partition, batches, sent, deadline
        self.follow = follow
        self.base = -1
        self.count = 0
        self._done = False
        self._exc: BaseException | None = None
        self._callbacks: list[Any] = []
        sent.add_done_callback(self._answered)

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def add_done_callback(self, fn: Any) -> None:
        if self._done:
            fn(self)
        else:
            self._callbacks.append(fn)

    def result(self) -> tuple[int, int]:
        if self._exc is not None:
            raise self._exc
        return self.base, self.count

    def finish(self, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done, self._exc = True, exc
        self.router._forwarding.pop(self, None)
        if not self.sent.done():
            self.sent.cancel()
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("a forwarded produce's callback failed")

    def _answered(self, sent: asyncio.Future) -> None:
        if self._done or sent.cancelled():
            return
        exc = sent.exception()
        if exc is None:
            got = sent.result()
            try:  # the link's answer, or the leader's JSON document when it was posted
                doc = got if type(got) is dict else answer_json(got, self.leader)
                base, count = doc["base_offset"], doc["count"]
            except Relayed as relayed:
                exc = relayed
            except (KeyError, TypeError, ValueError) as unreadable:
                exc = RequestTimeout(f"leader {self.leader} answered the forwarded produce unreadably "
                                     f"({unreadable!r}); the outcome is unknown", topic=self.request.topic,
                                     partition=self.partition, leader=self.leader)
            else:
                self.base, self.count = base, count
                return self.finish(None)
        if self.follow and isinstance(exc, Relayed) and exc.code == NotLeader.code:
            return self._again()
        self.finish(exc)

    async def answered(self) -> ProduceResult:
        """The result, awaited (``result_of``); a waiter cancelled gives the produce up (outcome unknown)."""
        try:
            return await result_of(self.request.topic, self)
        except asyncio.CancelledError:
            self.finish(Unavailable("the broker is stopping; retry"))
            raise

    def _again(self) -> None:
        self.router._forwarding.pop(self, None)  # the awaited way bounds itself
        task = asyncio.ensure_future(self.router._produce_awaited(self.request, self.cfg, self.partition,
                                                                  self.batches))
        task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return self.finish(Unavailable("the broker is stopping; retry"))
        exc = task.exception()
        if exc is None:
            got = task.result()
            self.base, self.count = got.base_offset, got.count
        self.finish(exc)


class Router:
    def __init__(self, host: RouterHost) -> None:
        self.host = host
        self.local = LocalRouter(host)  # what is served here
        # Sent at once on a forward link, not yet answered; given up in the order they were sent.
        self._forwarding: dict[Forwarding, None] = {}
        self._forward_check: asyncio.TimerHandle | None = None

    # --- produce -------------------------------------------------------------------------

    def check_accepting(self) -> None:
        self.host.check_joined()

    def accepting_at_once(self) -> bool:
        host = self.host
        return not host.closing and host.membership is not None and host.membership.joined

    def produce_partition(self, req: Produce, cfg: TopicConfig, p: int,
                          batches: list[bytearray]) -> Appending | Forwarding | Awaitable[ProduceResult]:
        """``batches`` of ``req`` (its consistency resolved) on their way into partition ``p``: with no task
        of its own, this turn's write when this broker leads the partition now (``append_soon``), or
        sent on to the leader this broker knows alive and reachable (``Forwarding``), each a future of
        (base offset, count); else the awaited way (``_produce_awaited``), which waits for a leader and
        follows it."""
        pending = self.append_soon(req, cfg, p, batches)
        if pending is not None:
            return pending
        host = self.host
        leader = host.leader_of(cfg.name, p)
        if (leader is not None and leader != host.name and host.peers is not None
                and host.membership.peer_url(leader) is not None
                and host.core.reachable(host.clock.monotonic(), leader)):
            return self._forward(leader, req, cfg, p, batches, follow=True)
        return self._produce_awaited(req, cfg, p, batches)

    def append_soon(self, req: Produce, cfg: TopicConfig, p: int, batches: list[bytearray]) -> Appending | None:
        """This turn's write when this broker leads the partition now (not handing it over), else None."""
        host = self.host
        rep = host.replica(cfg.name, p)
        if rep is None or not rep.is_leader or rep.frozen:
            return None
        needed = host.core.admit(host.clock.monotonic(), rep, cfg.name, p, req.consistency)
        if needed is None:
            return None
        return join_turn(host, rep, batches, needed, req, self._refused, self._acknowledge)

    def _acknowledge(self, rep: Replica, pending: list[Appending]) -> None:
        """Each produce, durable here, is answered once its level's voters hold it: at once when they do
        already, else by the node core's ack waiter, counted against the voter set as it is when they do."""
        host = self.host
        for a in host.turn.release_held(rep, pending):
            req = a.request
            host.step(AwaitAcks(a, rep, a.base + a.count, req.consistency, req.ack_timeout_ms / 1000))

    def _forward(self, leader: str, req: Produce, cfg: TopicConfig, p: int, batches: list[bytearray],
                 follow: bool) -> Forwarding:
        """Forward to the leader's peer port: sent at once on the open forward link, else once one is
        open. Given up (outcome unknown: it may have appended) once the leader turns unreachable, so a
        client is not held for a stopped or cut-off leader's full request timeout, or once
        ``PEER_REQUEST_TIMEOUT_S`` has passed without an answer (``_check_forwards``)."""
        host = self.host
        url = host.membership.peer_url(leader)
        if url is None:
            raise Unavailable(f"leader {leader} of {cfg.name}/{p} has no known peer address; retry",
                              topic=cfg.name, partition=p, leader=leader)
        sent = host.peers.forward(leader, url, req, p, batches)
        forwarding = Forwarding(self, leader, req, cfg, p, batches, sent,
                                host.clock.monotonic() + limits.PEER_REQUEST_TIMEOUT_S, follow)
        self._forwarding[forwarding] = None
        if self._forward_check is None:
            self._forward_check = asyncio.get_running_loop().call_later(FORWARD_CHECK_S, self._check_forwards)
        return forwarding

    def _check_forwards(self) -> None:
        """Give up (outcome unknown) the forwards whose leader turned unreachable or that have waited
        ``PEER_REQUEST_TIMEOUT_S``: every ``FORWARD_CHECK_S`` while any waits."""
        self._forward_check = None
        host = self.host
        now = host.clock.monotonic()
        for f in list(self._forwarding):
            exc = self._given_up(now, f.leader, f.request.topic, f.partition, f.deadline)
            if exc is not None:
                f.finish(exc)
        if self._forwarding:
            self._forward_check = asyncio.get_running_loop().call_later(FORWARD_CHECK_S, self._check_forwards)

    def _given_up(self, now: float, leader: str, topic: str, p: int, deadline: float) -> RequestTimeout | None:
        """Why a produce forwarded to ``leader`` is given up, outcome unknown (it may have appended), or None
        while it may wait on: the leader turned unreachable, or ``deadline`` passed without an answer."""
        if not self.host.core.reachable(now, leader):
            return RequestTimeout(f"leader {leader} of {topic}/{p} became unreachable while it had the "
                                  "produce; the outcome is unknown", topic=topic, partition=p, leader=leader)
        if now >= deadline:
            return RequestTimeout(f"leader {leader} of {topic}/{p} did not answer the produce within "
                                  f"{limits.PEER_REQUEST_TIMEOUT_S:g} s; the outcome is unknown",
                                  topic=topic, partition=p, leader=leader)
        return None

    def _refused(self, pending: Appending, exc: RingError) -> None:
        """A produce whose partition would not take its turn's write: nothing was written. Leadership
        moved: it goes the awaited way, which follows the new leader (as a produce that found it so at
        once would); else it fails with the error the awaited path gives."""
        rep = pending.part
        catalog = self.host.catalog
        if not isinstance(exc, NotLeader) or rep.topic not in catalog:
            return pending.set_exception(exc)
        cfg = catalog.get(rep.topic)

        async def again() -> None:
            result = await self._produce_awaited(pending.request, cfg, rep.index, pending.batches)
            pending.base, pending.count = result.base_offset, result.count

        def settle(task: asyncio.Task) -> None:
            if pending.done():
                if not task.cancelled():
                    task.exception()  # (retrieved: the produce was answered otherwise)
                return
            if task.cancelled():
                pending.set_exception(Unavailable("the broker is stopping; retry"))
            else:
                exc = task.exception()
                pending.set_exception(exc) if exc is not None else pending.set_result(None)

        asyncio.ensure_future(again()).add_done_callback(settle)

    def forget(self, topic: str) -> None:
        self.local.forget(topic)

    def unkeyed_partition(self, cfg: TopicConfig) -> int:
        led = sorted(p for p, r in self.host.partitions_held(cfg.name).items() if r.is_leader and not r.frozen)
        n = self.local.next_unkeyed(cfg.name)
        return led[n % len(led)] if led else n % cfg.partitions

    def _voters(self, cfg: TopicConfig, p: int) -> list[str]:
        rep = self.host.replica(cfg.name, p)
        return rep.voters if rep is not None else self.host.preference_list(cfg, p)

    async def _produce_awaited(self, req: Produce, cfg: TopicConfig, p: int,
                               batches: list[bytearray]) -> ProduceResult:
        host = self.host
        level = req.consistency
        deadline = host.clock.monotonic() + limits.LEADER_WAIT_MS / 1000
        hint: str | None = None
        while True:
            leader = hint or host.leader_of(cfg.name, p)
            hint = None
            try:
                to = host.core.route(host.clock.monotonic(), cfg.name, p, self._voters(cfg, p), level, leader)
                if to == host.name:
                    return await self.produce_as_leader(req, p, batches)
                if to is not None and host.membership.peer_url(to) is not None:
                    return await self._forward(to, req, cfg, p, batches, follow=False).answered()
                why = (f"{cfg.name}/{p} has no leader" if not leader else f"leader {leader} of {cfg.name}/{p} is down"
                       if to is None else f"leader {to} of {cfg.name}/{p} has no known peer address yet")
            except (NotLeader, Relayed) as exc:
                if isinstance(exc, Relayed) and exc.code != NotLeader.code:
                    raise
                hint = exc.extra.get("leader") if isinstance(exc.extra.get("leader"), str) else None
                hint = hint if hint != leader else None
                why = exc.message
            remaining = deadline - host.clock.monotonic()
            self._check_eligible(cfg.name, p, to is None and hint is None, remaining <= 0)
            if remaining <= 0:
                raise Unavailable(f"{why} (an election may be running); retry", topic=cfg.name, partition=p,
                                  leader=leader)
            if hint is None:
                await host.pump.changed(min(remaining, limits.ELECTION_TICK_MS / 1000))

    def _check_eligible(self, topic: str, p: int, leaderless: bool, waited: bool) -> None:
        """NoEligibleLeader for a produce to a partition that has no leader and cannot elect one: an
        election here found voters that lost their state (at once), or this replica lost its own and no
        leader came within the wait (another majority could still elect one meanwhile)."""
        rep = self.host.replica(topic, p)
        if not leaderless or rep is None or rep.is_leader:
            return
        lost = rep.lost_voters()
        if rep.lost_state or lost and waited:
            raise NoEligibleLeader(
                f"{topic}/{p} has no eligible leader: {', '.join(lost)} lost their state (a new data directory), "
                "and no majority of the voters that hold what was acknowledged is alive; it waits for one of "
                "them to return", topic=topic, partition=p, lost_state=lost)

    async def produce_as_leader(self, req: Produce, p: int, batches: list[bytearray]) -> ProduceResult:
        """Append as the leader once it may (not handing the partition over, enough voters reachable
        for the level): into the partition's turn write, as a produce that joins it at once, waiting first
        for the partition's idempotent producers when they are not ready (``append_awaited``); answered
        once enough voters hold the batches."""
        host, topic, level = self.host, req.topic, req.consistency
        host.check_joined()
        rep = host.replica(topic, p)
        deadline = host.clock.monotonic() + limits.HANDOFF_CATCHUP_MS / 1000 + 1
        while (needed := host.core.admit(host.clock.monotonic(), rep, topic, p, level)) is None:
            if host.clock.monotonic() >= deadline:  # the hand-off outlived its own bound: a bug; say not leader
                host.core.check_leading(None, topic, p)
            await host.pump.changed(0.02)  # handing over: wait for the new leader (or for it to fail)
            rep = host.replica(topic, p)
        assert rep is not None
        return await append_awaited(host, rep, batches, needed, req, self._refused, self._acknowledge)

    def check_writable(self, part: Replica) -> None:
        """The leader's append path: still leading (no await from here to the append)."""
        self.host.core.check_leading(part, part.topic, part.index)

    # --- reads ---------------------------------------------------------------------------

    def remote_partition(self, topic: str, partition: int) -> list[str] | None:
        """None when this broker serves the partition; else the client URLs of live replicas to ask."""
        host = self.host
        host.check_joined()
        cfg = host.catalog.get(validate_topic_name(topic))
        cfg.check_partition(partition)
        rep = host.replica(topic, partition)
        if rep is not None and rep.damaged_at is None:
            return None
        return self._replica_urls(cfg, partition, topic)

    def _replica_urls(self, cfg: TopicConfig, partition: int, topic: str) -> list[str]:
        names = list(dict.fromkeys(self.host.preference_list(cfg, partition) + self._voters(cfg, partition)))
        return self.host.proxy.urls(names, topic, partition)

    def fetch(self, req: Fetch) -> Fetched:
        """A read of this broker's replica at once when it can answer it (records there, or a long poll
        on it, awaitable); anything else (the earliest offset, one below the local log, another replica
        to ask, a damaged copy) is an awaitable of the answer."""
        if self.remote_partition(req.topic, req.partition) is None:
            rep = self.host.replica(req.topic, req.partition)
            assert rep is not None
            offset = req.offset
            if offset is not None and offset >= rep.serves_from and self._leader_if_unheard_of(rep, offset) is None:
                try:
                    got = self.local.read(rep, req)
                except StorageError:
                    return self._fetch(req)  # reads it again, says where
                return got if isinstance(got, StoredRead) else self._waited(got, req)
        return self._fetch(req)

    async def _waited(self, waiting: Awaitable[StoredRead], req: Fetch) -> StoredRead:
        """A long poll on this broker's replica; a damaged copy found after it is read from another."""
        try:
            return await waiting
        except StorageError as exc:
            return await self._elsewhere(exc, req)

    async def _fetch(self, req: Fetch) -> StoredRead:
        host = self.host
        topic, partition, offset = req.topic, req.partition, req.offset
        remote = self.remote_partition(topic, partition)
        if remote is None:
            rep = host.replica(topic, partition)
            assert rep is not None
            if offset is None or offset < rep.log.start_offset:  # below the local log: in ranges (ring.ranges)
                below = host.ranges.reads.route(rep, offset, req.max_bytes)
                if isinstance(below, StoredRead):
                    return below
                if below is not None:
                    remote, offset = below
            if remote is None:
                remote = self._leader_if_unheard_of(rep, offset)
        elif offset is not None:
            held = host.ranges.reads.held(topic, partition, offset, req.max_bytes)  # a range held here, for a reader
            if held is not None:
                return held
        if offset != req.offset:
            req = req._replace(offset=offset)
        if remote is None:
            try:
                return await settled(self.local.read(rep, req))
            except StorageError as exc:
                return await self._elsewhere(exc, req)
        return await host.proxy.fetch(remote, topic, partition, offset, req.max_bytes, req.wait_ms)

    async def _elsewhere(self, exc: StorageError, req: Fetch) -> StoredRead:
        """This broker's copy is damaged where ``exc`` says: noted, and the read goes to the other replicas."""
        host = self.host
        rep = host.replica(req.topic, req.partition)
        if rep is not None:
            host.damaged(rep, exc.extra.get("offset", req.offset or 0))
        remote = self._replica_urls(host.catalog.get(req.topic), req.partition, req.topic)
        return await host.proxy.fetch(remote, req.topic, req.partition, req.offset, req.max_bytes, req.wait_ms)

    def _leader_if_unheard_of(self, rep: Replica, offset: int | None) -> list[str] | None:
        """A follower asked for an offset past all it knows of (its log end, and the high
        watermark its leader last told it), or one that has not heard from its leader since
        this broker started: the leader's client URL, to ask instead.

        A consumer that read the leader up to its high watermark may ask a follower that
        lags for the next offset: the partition committed everything below it, so it is
        not out of range, and only the leader can tell that offset from one beyond the
        partition's end (its answer: records, a long-poll, or 416). A follower that was
        down may have missed a move of the partition's log start (a truncation, retention):
        until its leader's sync brings the start, only the leader knows what is still there.
        """
        name = self.host.name
        if rep.is_leader and rep.serves_from > rep.log.start_offset and (offset is None or offset < rep.serves_from):
            raise Unavailable(f"{rep.topic}/{rep.index}: its new leader {name} moves its log start up to "
                              f"{rep.serves_from}, which a replica holds (offsets below are deleted); retry",
                              topic=rep.topic, partition=rep.index, leader=name)
        lost = [] if rep.is_leader or rep.leader is not None or offset is None or offset < rep.hw \
            else rep.lost_voters()
        if lost:  # at or past what is committed here, where no leader can be elected to tell the rest
            raise NoEligibleLeader(
                f"{rep.topic}/{rep.index} has no eligible leader: {', '.join(lost)} lost their state (a new data "
                f"directory); this replica serves what was committed below offset {rep.hw}, and only a returning "
                "replica that kept its state can tell what lies beyond", topic=rep.topic, partition=rep.index,
                lost_state=lost)
        if rep.is_leader or (rep.synced and (offset is None or offset <= max(rep.log.end_offset, rep.leader_hw))):
            return None
        leader = self.host.leader_of(rep.topic, rep.index)
        url = self.host.proxy.leader_url(leader)
        if not url:
            why = (f"here ends at offset {rep.log.end_offset} and no live leader is known to tell whether offset "
                   f"{offset} is committed" if rep.synced else "here has not heard from its leader since this "
                   "broker started, and no live leader is known to tell where the partition starts")
            raise Unavailable(f"{rep.topic}/{rep.index} {why} (an election may be running); retry",
                              topic=rep.topic, partition=rep.index, leader=leader)
        return [url]

    async def offsets(self, req: OffsetsAt) -> dict[str, Any]:
        topic, partition = req.topic, req.partition
        remote = self.remote_partition(topic, partition)
        if remote is None:
            rep = self.host.replica(topic, partition)
            assert rep is not None
            remote = self._leader_if_unheard_of(rep, None)
            if remote is None:
                in_ranges = await self.host.ranges.reads.offsets(rep, req.at)
                return in_ranges if in_ranges is not None else self.local.offset_for_timestamp(req)
        return await self.host.proxy.ask(remote, "GET", f"/v1/topics/{topic}/partitions/{partition}/offsets",
                                         {"timestamp": str(req.at)})

    def epoch_end(self, req: EpochEnd) -> tuple[int, int]:
        """On the partition's leader only, as Kafka answers it: a follower's epoch history may hold what
        its leader cut, and a client asking here was told by Metadata that this broker leads."""
        host = self.host
        host.check_joined()
        host.catalog.get(validate_topic_name(req.topic)).check_partition(req.partition)
        rep = host.replica(req.topic, req.partition)
        if rep is None:
            leader = host.leader_of(req.topic, req.partition)
            raise NotLeader(f"{host.name} holds no replica of {req.topic}/{req.partition} (leader: {leader})",
                            topic=req.topic, partition=req.partition, leader=leader)
        return reads.epoch_end(rep, req)

    async def describe_ranges(self, topic: str, partition: int) -> dict[str, Any]:
        """GET .../ranges: this broker's replica's catalogue, else a replica's."""
        remote = self.remote_partition(topic, partition)
        if remote is None:
            rep = self.host.replica(topic, partition)
            assert rep is not None
            return self.host.ranges.describe(rep)
        return await self.host.proxy.ask(remote, "GET", f"/v1/topics/{topic}/partitions/{partition}/ranges")

    # --- truncate ------------------------------------------------------------------------

    async def truncate(self, req: Truncate) -> dict[str, Any]:
        """On the leader's log (any broker forwards it there); replication carries the new start to the
        followers."""
        topic, partition, before_offset = req
        host = self.host
        host.check_joined()
        host.catalog.get(validate_topic_name(topic))
        leader = host.leader_of(topic, partition)
        if leader == host.name:
            rep = host.replica(topic, partition)
            # Not leading (yet, or any more), or fewer than a majority of the voters up: change nothing.
            host.core.check_leading(rep, topic, partition)
            assert rep is not None
            host.core.admit(host.clock.monotonic(), rep, topic, partition, "quorum")
            doc = await self.local.truncate(req)
            # The ranges below go too, and the earliest offset may be in one.
            doc["earliest_offset"] = await host.ranges.reads.truncated(rep, before_offset)
            await self._start_held(rep, before_offset)
            return doc
        url = host.proxy.leader_url(leader)
        if url is None:
            raise Unavailable(f"the leader ({leader}) of {topic}/{partition} is not reachable; retry",
                              topic=topic, partition=partition)
        return await host.peers.json("POST", url, f"/v1/topics/{topic}/partitions/{partition}/truncate",
                                     body={"before_offset": before_offset})

    async def _start_held(self, rep: Replica, start: int) -> None:
        """Return once a majority of ``rep``'s voters hold a log start of at least ``start``: before
        that, a failover could elect a replica that still serves what was deleted. 504 after
        REPLICATION_ACK_TIMEOUT_MS, or when this broker stops leading first (the leader's log has
        moved; the same truncate again is harmless)."""
        held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.host.step(AwaitStart(held, rep, start, limits.REPLICATION_ACK_TIMEOUT_MS / 1000))
        try:
            await held
        except (TimeoutError, RequestTimeout):  # run out, or this leader stepped down meanwhile
            needed = protocol.needed_acks("quorum", rep.rf)
            raise RequestTimeout(
                f"{rep.topic}/{rep.index} starts at {rep.log.start_offset} on its leader {self.host.name}, but "
                f"{needed} of its {len(rep.voters)} replicas must hold the new start before a failover cannot "
                f"undo it, and only {rep.voters_starting_at(start)} did while it waited (at most "
                f"{limits.REPLICATION_ACK_TIMEOUT_MS} ms, and only while it leads); truncating again is safe",
                topic=rep.topic, partition=rep.index, before_offset=start, applied_on_leader=True,
                confirmed=rep.voters_starting_at(start), needed=needed) from None

