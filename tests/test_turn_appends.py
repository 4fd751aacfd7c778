"""Produces of one event-loop turn become one log write and one append frame per follower
(``ring.replication.appends``), in the order they arrived, without giving up a guarantee:
an idempotent retry in the same turn as its original is still recognised, nothing is answered
before the acknowledgements its consistency level needs, and a write that fails fails its
produces with the log's error."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from ring.catalog import TopicConfig
from ring.clock import ManualClock
from ring.cluster.node import ClusterBroker
from ring.fetch import Fetch
from ring.http_api.app import make_app
from ring.http_api.server import Front
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.log import segment as segmentmod
from ring.gossip.state import EndpointState
from ring.node.core import NodeCore
from ring.node.members import Members
from ring.node.ready import Appended, AwaitAcks, Flush, FromFollower, LinkUp, PlacementChanged
from ring.produce import Batches, Produce
from ring.replication import protocol
from ring.replication.appends import TurnAppends
from ring.replication.idempotence import ProducerStates
from ring.replication.replica import Replica
from tests.support import lone_broker, until
from tests.test_replication_sender import T0


class Transport:
    def __init__(self) -> None:
        self.out = b""

    def write(self, data: bytes) -> None:
        self.out += data

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _answer(raw: bytes) -> tuple[int, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


@pytest.fixture
async def broker(tmp_path: Path) -> Any:
    b = await lone_broker(tmp_path / "data", "never")
    await b.add_topic(TopicConfig(name="t", partitions=1, replication_factor=1))
    yield b
    await b.close()


async def _one_turn(broker: ClusterBroker, requests: list[bytes]) -> list[bytes]:
    """Each request on its own connection, all read in the same loop turn; the raw answers."""
    front = Front(make_app(broker), 10.0, 10.0, 1000)
    try:
        conns = []
        for raw in requests:
            conn, transport = front.protocol(), Transport()
            conn.connection_made(transport)
            conns.append(transport)
            conn.data_received(raw)
        assert all(t.out == b"" for t in conns), "answered before the turn's write"
        await until("every answer", lambda: all(t.out for t in conns))
        return [t.out for t in conns]
    finally:
        front.stop_sweeping()


def _produce(body: bytes, query: str = "partition=0") -> bytes:
    return (b"POST /v1/topics/t/messages?%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (query.encode(), len(body), body))


async def test_produces_of_one_turn_become_one_write_in_arrival_order(broker: ClusterBroker,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real = segmentmod.write_all

    def counted(fd: int, data: Any) -> None:
        writes.append(len(data))
        real(fd, data)

    monkeypatch.setattr(segmentmod, "write_all", counted)
    answers = await _one_turn(broker, [_produce(b'{"n": %d}' % i) for i in range(40)])
    assert len(writes) == 1, writes
    assert [_answer(a) for a in answers] == [(200, {"topic": "t", "partition": 0, "base_offset": i, "count": 1})
                                            for i in range(40)]
    got = broker.fetch(Fetch("t", 0, 0, 1 << 20))  # answered at once
    records = [r for _, pos in B.scan(got.data) for r in B.decode(got.data, pos)[1]]
    assert [orjson.loads(r.value)["n"] for r in records] == list(range(40))


async def test_an_idempotent_retry_in_the_same_turn_as_its_original_is_recognised(broker: ClusterBroker) -> None:
    # The producer's first request builds its table (the awaited path); later ones join turns.
    first = await _one_turn(broker, [_produce(b'{"first": 1}', "partition=0&producer_id=7&sequence=0")])
    assert _answer(first[0])[1]["base_offset"] == 0
    original = _produce(b'{"once": 1}', "partition=0&producer_id=7&sequence=1")
    answers = await _one_turn(broker, [_produce(b'{"before": 1}'), original, original, _produce(b'{"after": 1}')])
    assert [_answer(a)[1]["base_offset"] for a in answers] == [1, 2, 2, 3]
    assert broker._parts["t"][0].log.end_offset == 4


async def test_a_failed_write_fails_the_produces_of_its_turn(broker: ClusterBroker,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int, data: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segmentmod, "write_all", broken)
    answers = await _one_turn(broker, [_produce(b"1"), _produce(b"2")])
    assert [_answer(a)[0] for a in answers] == [500, 500]
    assert all(_answer(a)[1]["error"] == "storage_error" for a in answers)
    assert broker._parts["t"][0].log.end_offset == 0


QUORUM = Produce("t", Batches([], 0), 0, None, "quorum")  # the produce each turn's batches are of


class _Leader:
    """A leader's node core (ring.node) whose Ready is carried out here."""

    def __init__(self, core: NodeCore) -> None:
        self.core = core
        self.sends: list[tuple[str, Any]] = []

    def carry_out(self, ready: Any) -> None:
        self.sends += ready.sends
        for token, exc in ready.releases:
            token.set_result(None) if exc is None else token.set_exception(exc)


async def test_one_turn_is_one_append_frame_per_follower_and_answers_wait_for_a_quorum(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
    rep = Replica("t", 0, log, "a", ["a", "b", "c"])
    rep.lead()
    members = Members(EndpointState("a", 0, "a:1", "a:2", generation=1), [], random.Random(1))
    core = NodeCore("a", lambda topic, p: rep, lambda: [rep], True, random.Random(2), members)
    core.adopt(rep)
    try:
        core.step(0.0, PlacementChanged())
        for name in ("b", "c"):
            core.step(0.0, LinkUp(name))
            cur = core.links.links[name].cursors[("t", 0)]
            cur.next, cur.hw_sent = 0, 0  # in sync, at 0
        core.step(0.0, Flush())
        host = _Leader(core)
        turn = TurnAppends(ProducerStates(ManualClock(T0)))
        pending = [turn.add(rep, [B.encode([(T0, None, b"v%d" % i, None)], now_ms=T0)], 2, QUORUM)
                   for i in range(30)]
        assert all(p is not None for p in pending)
        end, written = turn.write(rep)  # what the router does on the turn's next loop turn
        assert end == rep.log.end_offset == 30 and written == pending
        host.carry_out(core.step(0.0, Appended(rep, end)))
        waiting = turn.release_held(rep, written)
        assert waiting == pending  # the leader alone is not a quorum of three
        for a in waiting:
            host.carry_out(core.step(0.0, AwaitAcks(a, rep, a.base + a.count, a.request.consistency, 5.0)))
        host.carry_out(core.step(0.0, Flush()))
        for name in ("b", "c"):
            frames = [f for dst, f in host.sends if dst == name and isinstance(f, protocol.Append)]
            assert len(frames) == 1 and frames[0].prev_end == 0  # the one frame carries the whole turn
            assert [h.base_offset for h, _ in B.scan(bytes(frames[0].data))] == list(range(30))
        assert not any(p.done() for p in pending)  # the leader alone is not a quorum of three
        host.carry_out(core.step(0.1, FromFollower("c", protocol.FollowerAck("t", 0, rep.epoch, 30))))
        assert all(p.done() for p in pending)
        assert [p.result() for p in pending] == [(i, 1) for i in range(30)]
    finally:
        log.close()


async def test_a_failed_group_commit_fails_its_turns_unanswered_produces_and_acknowledges_none() -> None:
    """Under fsync ``always`` a turn's produces are acknowledged after its group commit: all of them when it
    made them durable; none when it failed or was cancelled, each unanswered one failing with its error."""
    import asyncio

    from ring.errors import StorageError
    from ring.replication.appends import Appending

    loop = asyncio.get_running_loop()

    def turn() -> list[Appending]:
        req = Produce("t", Batches([], 1), 0, None, "quorum")
        return [Appending(None, [], 2, req, False) for _ in range(3)]  # type: ignore[arg-type]

    done, pending = loop.create_future(), turn()
    done.set_result(None)
    assert TurnAppends.synced(pending, done) == pending and not any(a.done() for a in pending)

    failed, pending = loop.create_future(), turn()
    failed.set_exception(StorageError("fsync failed: EIO"))
    pending[1].set_result(None)  # answered already (acknowledged before the sync's outcome): kept
    assert TurnAppends.synced(pending, failed) == []
    assert [a._exc for a in (pending[0], pending[2])] == [failed.exception()] * 2 and pending[1]._exc is None

    cancelled, pending = loop.create_future(), turn()
    cancelled.cancel()
    assert TurnAppends.synced(pending, cancelled) == []
    assert all(isinstance(a._exc, asyncio.CancelledError) for a in pending)
