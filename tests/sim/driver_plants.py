"""Bugs planted one at a time in the shipped broker's driver code (not the node core), to show the
shipped-broker simulation's workload finds them (docs/RELIABILITY.md).

Each plant is a context manager that patches ring's own code for the
duration of one run and nothing else: there is no switch for them in
``ring/``. ``tests/test_sim_shipped_plants.py`` runs, for each, the seed of
``tests.sim.shipped_workload`` that the table names with the plant (the
checker reports the problem) and without it (it reports none).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest

from ring.cluster import forwards, node
from ring.cluster import pump
from ring.groups import poller
from ring.replication import appends, idempotence, reads


@contextlib.contextmanager
def turn_answers_before_acks() -> Iterator[None]:
    """The turn writer (``replication/appends.py``) answers every produce of the turn once its batches are
    durable on the leader, without waiting for the acknowledgements its consistency level needs."""
    def release_held(self: appends.TurnAppends, part: Any, pending: list[appends.Appending]) -> list[appends.Appending]:
        for a in pending:
            if not a.done():
                a.set_result(None)
        return []

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(appends.TurnAppends, "release_held", release_held)
        yield


class _OldestFirst(dict):
    """The produces waiting on a forward link, handing out the oldest still waiting for any id."""

    def get(self, rid: Any, default: Any = None) -> Any:
        return next((w for w in self.values() if not w.done()), default)


@contextlib.contextmanager
def forward_answer_to_oldest() -> Iterator[None]:
    """Forwarding (``cluster/forwards.py``) matches an answer from the leader to the oldest produce waiting
    on the link instead of the one its request id names (answers come back in any order)."""
    real = forwards._Link.__init__

    def init(self: forwards._Link, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        self.pending = _OldestFirst(self.pending)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(forwards._Link, "__init__", init)
        yield


@contextlib.contextmanager
def idempotent_retry_written_again() -> Iterator[None]:
    """Idempotence (``replication/idempotence.py``) never recognises a retry: a produce retried with the
    same producer id and sequence after its answer was lost is appended a second time."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(idempotence.ProducerStates, "check", lambda self, part, batches: None)
        yield


@contextlib.contextmanager
def follower_acks_before_fsync() -> Iterator[None]:
    """The broker's effects (``cluster/pump.py``) start a follower's fsync but hand its acknowledgement of
    appended batches to the leader's answer link without the fsync's future: it leaves without waiting."""
    def persist(self: pump.BrokerEffects, rep: Any, end: int) -> None:
        self.pump.sync_soon(rep)  # (still synced, later: the answer does not wait for it)
        return None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pump.BrokerEffects, "persist", persist)
        yield


@contextlib.contextmanager
def fetch_reads_past_high_watermark() -> Iterator[None]:
    """A fetch (``replication/reads.py``) reads up to the end of the replica's log instead of its high
    watermark: records no quorum holds yet are handed to readers."""
    def read(part: Any, offset: int, max_bytes: int, max_records: int | None = None) -> Any:
        end = part.log.end_offset
        upto = end if max_records is None else min(end, offset + max_records)
        data = b"" if offset >= end else part.log.read(offset, max_bytes, upto=upto)
        return reads.StoredRead(part.topic, part.index, offset, bytes(data), end, part.log.start_offset)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reads, "read", read)
        yield


@contextlib.contextmanager
def poll_acknowledged_when_answered() -> Iterator[None]:
    """The group poller (``groups/poller.py``) moves a member's positions past a poll's records when it
    answers the poll, not when the member's next request names the answer: an answer lost on its way
    is committed by the next poll all the same."""
    real = poller.Poller._poll

    async def poll(self: poller.Poller, slot: Any, req: Any) -> Any:
        polled = await real(self, slot, req)
        g, m = await self._member(req.group, req.consumer, polled.generation)
        g.acknowledge(m, polled.token)
        return polled

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(poller.Poller, "_poll", poll)
        yield


@contextlib.contextmanager
def places_partitions_not_knowing_the_ring() -> Iterator[None]:
    """A broker that starts with its topics but no saved ring (``cluster/node.py``'s ``_ring_unknown``)
    places and opens its partitions at once, on a ring of itself alone, instead of waiting to hear of
    the others."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(node.ClusterBroker, "_ring_unknown", lambda self: False)
        yield


PLANTS = {
    "turn_answers_before_acks": turn_answers_before_acks,
    "forward_answer_to_oldest": forward_answer_to_oldest,
    "idempotent_retry_written_again": idempotent_retry_written_again,
    "follower_acks_before_fsync": follower_acks_before_fsync,
    "fetch_reads_past_high_watermark": fetch_reads_past_high_watermark,
    "poll_acknowledged_when_answered": poll_acknowledged_when_answered,
    "places_partitions_not_knowing_the_ring": places_partitions_not_knowing_the_ring,
}
