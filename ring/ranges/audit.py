"""Anti-entropy among a range's holders, and each broker's scrub of the copies it holds.

Every ``--repair-interval-s`` a partition's leader asks every live broker on
the ring which ranges of the partition it holds, with their checksums
(``audit``): a holder that lost a copy, or whose copy no longer matches
(its scrub or a read dropped it), leaves the range's holders, and the
leader's next round copies the range to it again from a good holder; a
sound copy of a range short of holders makes its broker a holder (a copy
the catalogue did not hear of); a broker holding a copy the catalogue does
not give it (moved, dropped by retention, an older leader's cut) is told to
drop it once all of its offsets are in safe ranges others hold
(``plan.held_changes``): a new leader's catalogue may not know yet of a
range an older leader cut and copied, whose copies are then the only ones. Every broker also
reads each copy it holds whole once per ``REPAIR_REREAD_ROUNDS`` rounds and
compares its checksum (``_scrub``), and drops the ranges of topics that are
gone (or were created again).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import orjson

from ring import limits
from ring.errors import RingError
from ring.ranges import plan
from ring.ranges.catalogue import Catalogue
from ring.ranges.copier import Copier, ranges_path
from ring.ranges.host import RangesHost
from ring.ranges.store import Key, RangeStore
from ring.replication.replica import Replica

log = logging.getLogger("ring.ranges")


class AuditOwner(Protocol):
    """What ``Audit`` uses of the ranges it audits (``manager.Ranges``)."""

    host: RangesHost
    store: RangeStore
    copier: Copier

    def catalogue(self, rep: Replica) -> Catalogue: ...

    def created_ms(self, topic: str) -> int | None: ...

    def still_leads(self, rep: Replica, epoch: int) -> bool: ...

    def tell(self, rep: Replica, holder: str, method: str, what: str, params: dict[str, str]) -> Any:
        """A request to a holder in the background."""

    def let_go(self, rep: Replica, holder: str, base: int) -> None:
        """``holder`` drops its copy of range ``base``."""

    async def peer(self, method: str, name: str, path: str, *, params: dict[str, str] | None = None,
                   body: bytes | None = None, timeout_s: float = ...) -> bytes: ...


class Audit:
    def __init__(self, ranges: AuditOwner) -> None:
        self.ranges = ranges
        self._scrubbed: dict[tuple[Key, int], float] = {}

    @property
    def host(self) -> RangesHost:
        return self.ranges.host

    @property
    def store(self) -> RangeStore:
        return self.ranges.store

    @property
    def copier(self) -> Copier:
        return self.ranges.copier

    async def loop(self) -> None:
        while True:
            await self.host.clock.sleep(self.host.config.repair_interval_s)
            try:
                self._drop_gone_topics()
                await self._scrub()
                for rep in list(self.host.replicas()):
                    if (rep.is_leader and not rep.deleted and self.ranges.catalogue(rep).ranges
                            and not self.host.closing):
                        await self.audit(rep)
            except (RingError, OSError) as exc:
                log.error("ranges audit: %s", getattr(exc, "message", exc))
            except Exception:
                log.exception("ranges audit failed")

    async def audit(self, rep: Replica) -> None:
        """Ask every live broker on the ring which ranges of ``rep`` it holds: holders that lost or
        spoiled a copy leave the range's holders (it is copied again), others drop what is not theirs."""
        key, epoch = (rep.topic, rep.index), rep.epoch
        start = self.ranges.catalogue(rep).start
        for _, name in self.host.membership.ring.brokers:
            if not self.host.membership.alive(name):
                continue
            if start:
                self.ranges.tell(rep, name, "POST", "/start", {"offset": str(start)})
            held = await self._held_by(name, key)
            if held is None or not self.ranges.still_leads(rep, epoch):
                continue
            cat = self.ranges.catalogue(rep)
            changes = plan.held_changes(cat, name, held, lambda base: self.copier.in_flight(key, base, name))
            for base in changes.spoiled:
                r = cat.get(base)
                log.warning("%s/%d: %s no longer holds a sound copy of range %d-%d; copying it again",
                            key[0], key[1], name, r.base, r.end)
                cat.set_holders(r.base, [h for h in r.holders if h != name], epoch)
            for base in changes.adopted:
                r = cat.get(base)
                log.info("%s/%d: %s holds a sound copy of range %d-%d the catalogue did not name; it is a holder",
                         key[0], key[1], name, r.base, r.end)
                cat.set_holders(r.base, (*r.holders, name), epoch)
            for base in changes.let_go:
                self.ranges.let_go(rep, name, base)

    async def _held_by(self, name: str, key: Key) -> dict[int, tuple[int, str]] | None:
        if name == self.host.name:
            return {m.base: (m.end, m.checksum) for m in self.store.ranges(key)}
        try:
            raw = await self.ranges.peer("GET", name, ranges_path(*key))
            return {int(b): (int(e), str(c)) for b, e, c in orjson.loads(raw)}
        except (RingError, ValueError, TypeError) as exc:
            log.debug("%s/%d: asking %s what it holds: %s", key[0], key[1], name, exc)
            return None

    def _drop_gone_topics(self) -> None:
        for key in self.store.keys():
            created = self.ranges.created_ms(key[0])
            metas = self.store.ranges(key)
            if created is None or any(m.created_ms != created for m in metas):
                if created is None and self.host.membership is not None and not self.host.membership.joined:
                    continue
                self.store.drop_partition(key, "its topic is gone")

    async def _scrub(self) -> None:
        """Read every held copy whole once per REPAIR_REREAD_ROUNDS rounds and compare its checksum."""
        period = limits.REPAIR_REREAD_ROUNDS * self.host.config.repair_interval_s
        now = self.host.clock.monotonic()
        loop = asyncio.get_running_loop()
        for key in self.store.keys():
            for meta in self.store.ranges(key):
                last = self._scrubbed.setdefault((key, meta.base), now)
                if now - last < period:
                    continue
                ok = await loop.run_in_executor(None, self.store.scrub, key, meta.base)
                self._scrubbed[(key, meta.base)] = self.host.clock.monotonic()
                if not ok and self.store.get(key, meta.base) == meta:
                    self.store.drop(key, meta.base, "damaged: its checksum differs from the range's")

