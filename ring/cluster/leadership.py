"""Leadership of this broker's partition replicas: the async driver of elections, handovers and claims.

Every ``ELECTION_TICK_MS`` the driver runs ``Watch.tick`` (``watch.py``: the
decisions, shared with the simulation) over the replicas this broker holds,
with a ``View`` of the cluster taken from gossip, and carries out what it
returns:

* stand: a pre-vote round, then a real one for epoch+1, each a ``POST
  /peer/v1/vote`` to every other voter (``steps.vote_request``, bounded by
  ``VOTE_REQUEST_TIMEOUT_S``, counted as answers arrive); a majority makes
  this replica leader (``steps.win``), its replication links sync the others,
  and the new claim is gossiped to every live peer at once;
* hand over: stop appending, wait until the target holds the whole log, and
  ask it (``POST /peer/v1/transfer``) to stand at once, skipping the pre-vote;
* changed: relink replication, wake produces waiting for a leader.

Whom this broker leads, and which of its replicas are still catching up after
an unclean shutdown, go into its gossip entry (``ring.cluster.leaders``), so
every broker knows every partition's leader (``leader_of``) and never elects
a replica that has not caught up, nor one on a broker whose clock is out of
bounds (``Membership.clock_usable``): such a broker hands over what it leads. The voter's side (``on_vote``,
``on_transfer``) answers the peer routes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable

import aiohttp
import msgpack

from ring import limits
from ring.cluster import leaders
from ring.cluster.watch import Action, Watch
from ring.errors import BadRequest
from ring.replication import election, steps
from ring.replication.replica import Replica
from ring.cluster.peers import H_BROKER, H_SECRET

if TYPE_CHECKING:
    from ring.cluster.node import ClusterBroker

log = logging.getLogger("ring.cluster")

VOTE_PATH = "/peer/v1/vote"
TRANSFER_PATH = "/peer/v1/transfer"
Key = tuple[str, int]


class Leadership:
    def __init__(self, node: ClusterBroker) -> None:
        self.node = node
        self.name = node.name
        self.clock = node.clock
        self.watch = Watch(self.name, node.rng)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._claims_cache: dict[str, tuple[Any, dict[Key, int]]] = {}
        self._announcing: asyncio.Task[None] | None = None
        self._published: tuple[Any, dict[Key, int], set[Key]] | None = None

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

    # --- what gossip says (the View the watch decides on) ----------------------------------------

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

    def behind(self, name: str) -> set[Key]:
        ms = self.node.membership
        ep = ms.endpoint(name) if ms is not None else None
        return leaders.decode_partitions(ep.extra.get("behind")) if ep is not None else set()

    def alive(self, name: str) -> bool:
        ms = self.node.membership
        return name == self.name or (ms is not None and ms.alive(name))

    def up(self, name: str) -> bool:
        ms = self.node.membership
        return name == self.name or (ms is not None and ms.status(name) == "up")

    def generation(self, name: str | None) -> int | None:
        ms = self.node.membership
        ep = ms.endpoint(name) if ms is not None and name is not None else None
        return ep.generation if ep is not None else None

    def clock_usable(self, name: str) -> bool:
        ms = self.node.membership
        return ms is not None and ms.clock_usable(name)

    def leader_of(self, topic: str, partition: int) -> str | None:
        """The leader as this broker knows it: its own replica's, or the newest live claim in gossip."""
        rep = self.node.replica(topic, partition)
        if rep is not None and rep.leader is not None:
            return rep.leader  # (if a newer one exists, it answers not_leader with the hint)
        best = leaders.leader_from_claims(self.claims(), (topic, partition), self.alive)
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
        self.node.refresh_clock()  # a clock set meanwhile stops this broker's leading in this very tick
        for action in self.watch.tick(self.clock.monotonic(), self.node.replicas(), _TickView(self)):
            self._carry_out(action)
        self.publish()

    def _carry_out(self, action: Action) -> None:
        rep = action.rep
        if action.kind == "stand":
            self._spawn(self._stand(rep), f"stand {rep.topic}/{rep.index}")
        elif action.kind == "hand_off":
            assert action.target is not None
            self._spawn(self._hand_off(rep, action.target), f"hand {rep.topic}/{rep.index} to {action.target}")
        else:
            self.node.leadership_changed(rep)
            if action.target == "voters" and self.node.streams is not None:
                self.node.streams.resync(rep)

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
        """Put what this broker leads (and what it holds that is behind) into its gossip entry,
        encoded again only when it changed."""
        ms = self.node.membership
        if ms is None:
            return
        reps = self.node.replicas()
        leads = {(r.topic, r.index): r.epoch for r in reps if r.is_leader}
        behind = {(r.topic, r.index) for r in reps if not r.caught_up}
        published = (ms, leads, behind)
        if self._published is None or self._published[0] is not ms or self._published[1:] != published[1:]:
            ms.set_extra("leads", leaders.encode_leads(leads))
            ms.set_extra("behind", leaders.encode_partitions(behind))
            self._published = published

    # --- standing for election ------------------------------------------------------------------

    async def _stand(self, rep: Replica, transfer: bool = False) -> None:
        won = ran = False
        try:
            voters = frozenset(rep.voters)
            if self.name not in voters:
                return
            others = sorted(voters - {self.name})
            if not transfer:
                req = steps.vote_request(rep, pre=True)
                tally = election.Tally(self.name, voters, req.epoch, req.pre)
                await self._collect(others, req, tally)
                if self._newer(rep, tally) or not tally.won or self.node.replica(rep.topic, rep.index) is not rep:
                    return
            req = steps.vote_request(rep, pre=False, transfer=transfer)
            ran = True
            self.node.leadership_changed(rep)
            tally = election.Tally(self.name, voters, req.epoch, req.pre)
            await self._collect(others, req, tally)
            if self._newer(rep, tally) or self.node.replica(rep.topic, rep.index) is not rep:
                return
            if tally.won and steps.win(rep, req.epoch):
                won = True
                self.node.leadership_changed(rep)
                if self.node.streams is not None:
                    self.node.streams.resync(rep)
                self.announce()
        finally:
            self.watch.stood(rep, won, self.clock.monotonic())
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
        if url is None or session is None or not self.alive(peer):
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
        before = (rep.leader, rep.epoch)
        reply = steps.on_vote_request(rep, req, self.watch.voter_view(rep, self, now))
        self.watch.voted(rep, reply.granted and not req.pre, now)
        if (rep.leader, rep.epoch) != before:
            self.node.leadership_changed(rep)
        return reply

    # --- handing a partition over ---------------------------------------------------------------

    async def _hand_off(self, rep: Replica, target: str) -> None:
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
            self.watch.handed(rep, self.clock.monotonic())
            if rep.is_leader:
                rep.frozen = False
            self.notify()

    def on_transfer(self, sender: str, topic: str, partition: int, epoch: int) -> bool:
        """``sender`` leads ``epoch`` and asks us to take over: stand now, without a pre-vote."""
        rep = self.node.replica(topic, partition)
        if rep is None or not self.clock_usable(self.name) or \
                not self.watch.may_take_over(rep, sender, epoch, self.clock.monotonic()):
            return False
        self._spawn(self._stand(rep, transfer=True), f"take over {topic}/{partition}")
        return True


class _TickView:
    """The View for one tick: what gossip says about each broker, worked out once per tick
    rather than once per replica (a tick runs without an await, so gossip cannot change
    meanwhile). With hundreds of partitions, per-replica phi and decode work would be most of
    an idle broker's CPU."""

    def __init__(self, source: Leadership) -> None:
        self._source = source
        self._alive: dict[str, bool] = {}
        self._up: dict[str, bool] = {}
        self._generation: dict[str | None, int | None] = {}
        self._behind: dict[str, set[Key]] = {}
        self._clock_usable: dict[str, bool] = {}
        self._claims: dict[str, dict[Key, int]] | None = None

    @staticmethod
    def _once(table: dict[Any, Any], name: Any, compute: Callable[[Any], Any]) -> Any:
        if name not in table:
            table[name] = compute(name)
        return table[name]

    def alive(self, name: str) -> bool:
        return self._once(self._alive, name, self._source.alive)

    def up(self, name: str) -> bool:
        return self._once(self._up, name, self._source.up)

    def generation(self, name: str | None) -> int | None:
        return self._once(self._generation, name, self._source.generation)

    def behind(self, name: str) -> set[Key]:
        return self._once(self._behind, name, self._source.behind)

    def clock_usable(self, name: str) -> bool:
        return self._once(self._clock_usable, name, self._source.clock_usable)

    def claims(self) -> dict[str, dict[Key, int]]:
        if self._claims is None:
            self._claims = self._source.claims()
        return self._claims
