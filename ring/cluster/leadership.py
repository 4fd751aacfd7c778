"""Leadership of this broker's partition replicas: elections, step-downs, handovers and gossiped claims.

The async driver of ``ring.replication.election``. Every ``ELECTION_TICK_MS``
it looks at each replica this broker holds:

* a follower whose leader is lost (``election.leader_lost``: gossip reports
  it down, it restarted, or it stopped claiming the partition) waits its
  turn (``election.stand_delay_s``) and stands: a pre-vote round, then a real
  one for epoch+1, each a ``POST /peer/v1/vote`` to every other voter
  (``steps.vote_request``, bounded by ``VOTE_REQUEST_TIMEOUT_S``); a majority
  makes it leader (``steps.win``), and its replication links sync the others;
* a leader steps down when a live broker claims the partition at a newer
  epoch, moves the voter set one step toward the preference list
  (``placement.next_voters``), and hands the partition to its natural leader
  once that one is back and caught up (``election.transfer_target``): it
  stops appending, waits until the target holds its whole log, and asks it
  (``POST /peer/v1/transfer``) to stand at once, skipping the pre-vote.

Whom this broker leads, and which of its replicas are still catching up after
an unclean shutdown, go into its gossip entry (``ring.cluster.leaders``), so
every broker knows every partition's leader (``leader_of``) and never elects
a replica that has not caught up. The decisions are all in the pure modules;
this one keeps timers and does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import aiohttp
import msgpack

from ring import limits
from ring.cluster import leaders, placement
from ring.errors import BadRequest
from ring.replication import election, steps
from ring.replication.replica import Replica

if TYPE_CHECKING:
    from ring.cluster.node import ClusterBroker

log = logging.getLogger("ring.cluster")

H_SECRET = "Ring-Cluster-Secret"
H_BROKER = "Ring-Broker"
VOTE_PATH = "/peer/v1/vote"
TRANSFER_PATH = "/peer/v1/transfer"
Key = tuple[str, int]


@dataclass
class _Timers:
    """What the driver remembers about one replica between ticks (seconds on the broker's clock)."""

    leader: str | None = None  # the leader as last seen, to notice a change
    generation: int | None = None  # that leader's gossip generation then
    unclaimed_since: float | None = None
    leaderless_since: float | None = None
    next_try: float = 0.0
    retry_s: float = limits.ELECTION_RETRY_MS / 1000
    led_since: float = 0.0
    standing: bool = False
    handing: bool = False
    handoff_next: float = 0.0


class Leadership:
    def __init__(self, node: ClusterBroker) -> None:
        self.node = node
        self.name = node.name
        self.clock = node.clock
        self._timers: dict[Key, _Timers] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._claims_cache: dict[str, tuple[Any, dict[Key, int]]] = {}
        self._announcing: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="leadership")

    async def close(self) -> None:
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a bug: say so, and keep electing
                log.exception("leadership tick failed")
            await asyncio.sleep(limits.ELECTION_TICK_MS / 1000)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- what gossip says --------------------------------------------------------------------

    def claims(self) -> dict[str, dict[Key, int]]:
        """Broker -> the partitions it says it leads, with their epochs (decoded once per change)."""
        ms = self.node.membership
        assert ms is not None
        out: dict[str, dict[Key, int]] = {}
        for name, ep in ms.core.state.endpoints.items():
            if name == self.name:
                continue
            raw = ep.extra.get("leads")
            cached = self._claims_cache.get(name)
            if cached is None or cached[0] is not raw:
                cached = self._claims_cache[name] = (raw, leaders.decode_leads(raw))
            out[name] = cached[1]
        return out

    def _behind(self, name: str) -> set[Key]:
        ms = self.node.membership
        ep = ms.endpoint(name) if ms is not None else None
        return leaders.decode_partitions(ep.extra.get("behind")) if ep is not None else set()

    def _alive(self, name: str) -> bool:
        ms = self.node.membership
        return name == self.name or (ms is not None and ms.alive(name))

    def _up(self, name: str) -> bool:
        ms = self.node.membership
        return name == self.name or (ms is not None and ms.status(name) == "up")

    def _generation(self, name: str | None) -> int | None:
        ms = self.node.membership
        ep = ms.endpoint(name) if ms is not None and name is not None else None
        return ep.generation if ep is not None else None

    def _eligible(self, rep: Replica, name: str) -> bool:
        if name == self.name:
            return rep.caught_up and rep.damaged_at is None
        return (rep.topic, rep.index) not in self._behind(name)

    def leader_of(self, topic: str, partition: int) -> str | None:
        """The leader as this broker knows it: its own replica's, or the newest live claim in gossip."""
        rep = self.node.replica(topic, partition)
        best = leaders.leader_from_claims(self.claims(), (topic, partition), self._alive)
        if rep is not None and rep.leader is not None and (best is None or best[1] <= rep.epoch):
            return rep.leader
        return best[0] if best is not None else None

    async def changed(self, timeout_s: float) -> None:
        """Return when leadership of any partition changed here, or after ``timeout_s``."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- the tick ------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock.monotonic()
        claims = self.claims()
        held: set[Key] = set()
        for rep in self.node.replicas():
            key = (rep.topic, rep.index)
            held.add(key)
            t = self._timers.setdefault(key, _Timers(led_since=now))
            if rep.is_leader:
                self._as_leader(rep, t, claims, now)
            else:
                self._as_follower(rep, t, claims, now)
        for key in [k for k in self._timers if k not in held]:
            del self._timers[key]
        self.publish()

    def lost(self, rep: Replica, t: _Timers, claims: dict[str, dict[Key, int]], now: float) -> bool:
        """Whether ``rep`` has no live leader (updating the timers that tell)."""
        if rep.leader != t.leader:
            t.leader, t.generation, t.unclaimed_since = rep.leader, self._generation(rep.leader), now
        key = (rep.topic, rep.index)
        claimed = rep.leader is not None and claims.get(rep.leader, {}).get(key, -1) >= rep.epoch
        if claimed:
            t.unclaimed_since = None
        elif t.unclaimed_since is None:
            t.unclaimed_since = now
        restarted = t.generation is not None and self._generation(rep.leader) != t.generation
        lost = election.leader_lost(rep.leader, self.name, rep.leader is not None and self._alive(rep.leader),
                                    restarted, claimed, now - (t.unclaimed_since or now),
                                    limits.LEADER_CLAIM_GRACE_MS / 1000)
        if lost:
            best = leaders.leader_from_claims(claims, key, self._alive)
            if best is not None and best[1] >= rep.epoch and best[0] != rep.leader:
                return False  # a newer leader exists: its link will sync us
        return lost

    def _as_follower(self, rep: Replica, t: _Timers, claims: dict[str, dict[Key, int]], now: float) -> None:
        if not self.lost(rep, t, claims, now):
            t.leaderless_since = None
            return
        if t.leaderless_since is None:
            t.leaderless_since = now
            if rep.leader is not None:
                log.info("%s/%d: leader %s of epoch %d is lost", rep.topic, rep.index, rep.leader, rep.epoch)
        if t.standing or now < t.next_try or self.name not in rep.voters:
            return
        delay = election.stand_delay_s(self.name, rep.replicas, rep.voters, self._alive,
                                       lambda n: self._eligible(rep, n), limits.ELECTION_RANK_STEP_MS / 1000,
                                       limits.ELECTION_UNCLEAN_FALLBACK_MS / 1000)
        if delay is None or now - t.leaderless_since < delay:
            return
        if sum(1 for v in rep.voters if self._alive(v)) < election.majority(len(rep.voters)):
            return  # no majority can answer: no election (committed reads still work)
        t.standing = True
        self._spawn(self._stand(rep, t), f"stand {rep.topic}/{rep.index}")

    def _as_leader(self, rep: Replica, t: _Timers, claims: dict[str, dict[Key, int]], now: float) -> None:
        if t.leader != self.name:
            t.leader, t.led_since, t.leaderless_since = self.name, now, None
        best = leaders.leader_from_claims(claims, (rep.topic, rep.index), self._alive)
        if best is not None and best[1] > rep.epoch:
            steps.adopt_epoch(rep, best[1])
            self.node.leadership_changed(rep)
            return
        filled_to = max(rep.hw, rep.epoch_start)
        voters = placement.next_voters(rep.voters, rep.replicas, self.name,
                                       lambda r: self._alive(r) and rep.follower_ends.get(r, -1) >= filled_to)
        if voters != rep.voters:
            log.info("%s/%d: voters %s -> %s", rep.topic, rep.index, ",".join(rep.voters), ",".join(voters))
            rep.set_voters(voters)
            steps.save_state(rep)
            self.node.leadership_changed(rep)
            if self.node.streams is not None:
                self.node.streams.resync(rep)
        if t.handing or now < t.handoff_next:
            return
        target = self._handoff_target(rep, t, now)
        if target is not None:
            t.handing = True
            self._spawn(self._hand_off(rep, t, target), f"hand {rep.topic}/{rep.index} to {target}")

    def _handoff_target(self, rep: Replica, t: _Timers, now: float) -> str | None:
        acked = rep.follower_ends.get
        if rep.damaged_at is not None:  # our copy is damaged: any caught-up voter will do
            return next((r for r in election.candidate_order(rep.replicas, rep.voters)
                         if r != self.name and self._up(r) and self._eligible(rep, r)
                         and (acked(r) or 0) >= rep.log.end_offset), None)
        return election.transfer_target(self.name, rep.replicas, rep.voters, self._up,
                                        lambda n: self._eligible(rep, n), acked, max(rep.hw, rep.epoch_start),
                                        now - t.led_since, limits.HANDOFF_MIN_LEAD_MS / 1000)

    def announce(self) -> None:
        """Tell every live peer our claims now, not in a gossip round or two (at most one at a time)."""
        ms = self.node.membership
        if ms is None or (self._announcing is not None and not self._announcing.done()):
            return
        self.publish()

        async def run() -> None:
            await asyncio.sleep(0.02)  # let the other partitions won in this burst ride along
            self.publish()
            await ms.announce()

        self._announcing = asyncio.create_task(run(), name="announce leaders")
        self._tasks.add(self._announcing)
        self._announcing.add_done_callback(self._tasks.discard)

    async def wait_for_leaders(self, topic: str, partitions: int, timeout_s: float) -> None:
        """Return once every partition of ``topic`` has a known leader, or after ``timeout_s``."""
        deadline = self.clock.monotonic() + timeout_s
        while any(self.leader_of(topic, p) is None for p in range(partitions)):
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return
            await self.changed(min(remaining, limits.ELECTION_TICK_MS / 1000))

    def publish(self) -> None:
        ms = self.node.membership
        if ms is None:
            return
        reps = self.node.replicas()
        ms.set_extra("leads", leaders.encode_leads({(r.topic, r.index): r.epoch for r in reps if r.is_leader}))
        ms.set_extra("behind", leaders.encode_partitions((r.topic, r.index) for r in reps if not r.caught_up))

    # --- standing for election ------------------------------------------------------------------

    async def _stand(self, rep: Replica, t: _Timers, transfer: bool = False) -> None:
        t.standing = True
        won = ran = False
        try:
            voters = frozenset(rep.voters)
            if self.name not in voters:
                return
            others = sorted(voters - {self.name})
            if not transfer:
                req = steps.vote_request(rep, pre=True)
                tally = election.Tally(self.name, voters, req.epoch)
                await self._collect(others, req, tally)
                if self._newer(rep, tally) or not tally.won or self.node.replica(rep.topic, rep.index) is not rep:
                    return
            req = steps.vote_request(rep, pre=False, transfer=transfer)
            ran = True
            self.node.leadership_changed(rep)
            tally = election.Tally(self.name, voters, req.epoch)
            await self._collect(others, req, tally)
            if self._newer(rep, tally) or self.node.replica(rep.topic, rep.index) is not rep:
                return
            if tally.won and steps.win(rep, req.epoch):
                won = True
                t.leader, t.led_since = self.name, self.clock.monotonic()
                self.node.leadership_changed(rep)
                if self.node.streams is not None:
                    self.node.streams.resync(rep)
                self.announce()
        finally:
            t.standing = False
            now = self.clock.monotonic()
            if won:
                t.retry_s = limits.ELECTION_RETRY_MS / 1000
            else:
                t.next_try = now + t.retry_s * (0.5 + self.node.rng.random())
                t.retry_s = min(t.retry_s * 2, limits.ELECTION_RETRY_MS_MAX / 1000)
            if self.node.metrics is not None and ran:
                self.node.metrics.election("won" if won else "lost")

    def _newer(self, rep: Replica, tally: election.Tally) -> bool:
        if tally.newest_epoch > rep.epoch:
            steps.adopt_epoch(rep, tally.newest_epoch)
            self.node.leadership_changed(rep)
            return True
        return False

    async def _collect(self, others: Iterable[str], req: election.VoteRequest, tally: election.Tally) -> None:
        pending = {asyncio.ensure_future(self._ask(peer, req)) for peer in others}
        try:
            while pending and not tally.won and not tally.lost:
                done, pending = await asyncio.wait(pending, timeout=limits.VOTE_REQUEST_TIMEOUT_S,
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                for fut in done:
                    reply = fut.result()
                    if reply is not None and (reply.topic, reply.partition) == (req.topic, req.partition):
                        tally.add(reply)
        finally:
            for fut in pending:
                fut.cancel()

    async def _post(self, peer: str, path: str, body: bytes, params: dict[str, str] | None = None) -> bytes | None:
        ms, session = self.node.membership, self.node.session
        url = ms.peer_url(peer) if ms is not None else None
        if url is None or session is None or not self._alive(peer):
            return None
        headers = {H_SECRET: self.node.config.cluster_secret or "", H_BROKER: self.name,
                   "Content-Type": "application/msgpack"}
        try:
            async with session.post(url + path, data=body, headers=headers, params=params,
                                    timeout=aiohttp.ClientTimeout(total=limits.VOTE_REQUEST_TIMEOUT_S)) as resp:
                raw = await resp.content.read(64 * 1024)
                return raw if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("%s %s: %r", peer, path, exc)
            return None

    async def _ask(self, peer: str, req: election.VoteRequest) -> election.VoteReply | None:
        raw = await self._post(peer, VOTE_PATH, msgpack.packb(req.to_wire(), use_bin_type=True))
        if raw is None:
            return None
        try:
            return election.reply_from_wire(msgpack.unpackb(raw, raw=False))
        except (BadRequest, ValueError, TypeError, msgpack.UnpackException) as exc:
            log.warning("a malformed vote reply from %s: %s", peer, exc)
            return None

    # --- the voter's side -------------------------------------------------------------------------

    def on_vote(self, req: election.VoteRequest) -> election.VoteReply:
        rep = self.node.replica(req.topic, req.partition)
        if rep is None or rep.deleted:
            return election.VoteReply(req.topic, req.partition, 0, self.name, False, election.NOT_A_VOTER)
        now = self.clock.monotonic()
        t = self._timers.setdefault((rep.topic, rep.index), _Timers(led_since=now))
        before = (rep.leader, rep.epoch)
        leader_alive = rep.is_leader or not self.lost(rep, t, self.claims(), now)
        reply = steps.on_vote_request(rep, req, leader_alive)
        if reply.granted and not req.pre:
            t.leaderless_since = now  # give the candidate we voted for time to win before standing ourselves
        if (rep.leader, rep.epoch) != before:
            self.node.leadership_changed(rep)
        return reply

    # --- handing a partition over ---------------------------------------------------------------

    async def _hand_off(self, rep: Replica, t: _Timers, target: str) -> None:
        epoch = rep.epoch
        rep.frozen = True
        log.info("%s/%d: handing leadership of epoch %d over to %s", rep.topic, rep.index, epoch, target)
        try:
            deadline = self.clock.monotonic() + limits.HANDOFF_CATCHUP_MS / 1000
            while rep.is_leader and rep.epoch == epoch and rep.follower_ends.get(target, -1) < rep.log.end_offset:
                if self.clock.monotonic() >= deadline:
                    log.info("%s/%d: %s did not catch up in time; keeping the lead", rep.topic, rep.index, target)
                    return
                await asyncio.sleep(0.01)
            if not rep.is_leader or rep.epoch != epoch:
                return
            params = {"topic": rep.topic, "partition": str(rep.index), "epoch": str(epoch)}
            if await self._post(target, TRANSFER_PATH, b"", params) is None:
                return
            deadline = self.clock.monotonic() + 2 * limits.VOTE_REQUEST_TIMEOUT_S
            while rep.is_leader and rep.epoch == epoch and self.clock.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            t.handing = False
            t.handoff_next = self.clock.monotonic() + limits.HANDOFF_RETRY_MS / 1000
            if rep.is_leader:
                rep.frozen = False
            self.notify()

    def on_transfer(self, sender: str, topic: str, partition: int, epoch: int) -> bool:
        """``sender`` leads ``epoch`` and asks us to take over: stand now, without a pre-vote."""
        rep = self.node.replica(topic, partition)
        if rep is None or rep.leader != sender or rep.epoch != epoch or not rep.aligned or not rep.caught_up:
            return False
        t = self._timers.setdefault((topic, partition), _Timers(led_since=self.clock.monotonic()))
        if t.standing:
            return False
        t.standing = True
        self._spawn(self._stand(rep, t, transfer=True), f"take over {topic}/{partition}")
        return True

