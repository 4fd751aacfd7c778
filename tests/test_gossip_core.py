"""GossipCore step by step: scripted exchanges between real cores."""

from __future__ import annotations

import dataclasses
import random

import msgpack
import pytest

from ring.errors import BadRequest, InvalidTopicName, NotFound, UnknownTopic
from ring.gossip.core import Ack, Ack2, GossipCore, Outgoing, Syn, message_from_wire
from ring.gossip.state import ClusterState, EndpointState


def ep(name: str, generation: int = 1000, status: str = "normal") -> EndpointState:
    return EndpointState(name, 0, f"{name}:8080", f"{name}:7070", generation, status=status)


def core(name: str, seeds=("a:7070",), seed: int = 0, **kw) -> GossipCore:
    return GossipCore(ep(name, **kw), seeds, random.Random(seed))


def wire(msg):
    return message_from_wire(msgpack.unpackb(msgpack.packb(msg.to_wire())))


def exchange(a: GossipCore, b: GossipCore, now: float) -> None:
    """One full push-pull started by a, through the wire."""
    syn = Syn(a.name, a.state.digest())
    (ack,) = b.on_message(now, a.self_state.peer_addr, wire(syn))
    assert ack.to_addr == a.self_state.peer_addr and isinstance(ack.message, Ack)
    for out in a.on_message(now, b.self_state.peer_addr, wire(ack.message)):
        assert out.to_addr == b.self_state.peer_addr and isinstance(out.message, Ack2)
        assert b.on_message(now, a.self_state.peer_addr, wire(out.message)) == []


def test_lonely_core_gossips_to_a_seed_and_not_to_itself():
    a = core("a")
    assert a.seeds == []  # its own address is not a seed for it
    assert a.tick(0.0) == []
    b = core("b")
    outs = b.tick(0.0)
    assert [o.to_addr for o in outs] == ["a:7070"] and isinstance(outs[0].message, Syn)
    assert b.self_state.version == 1


def test_exchange_spreads_state_and_heartbeats_both_ways():
    a, b = core("a"), core("b")
    a.put_topic("clicks", {"partitions": 8}, 5)
    exchange(b, a, 0.0)
    assert set(a.state.endpoints) == set(b.state.endpoints) == {"a", "b"}
    assert b.topics() == {"clicks": {"partitions": 8}}
    assert a.status_of("b", 0.0) == b.status_of("a", 0.0) == "up"
    assert a.detector.detector("b").last_arrival_s == 0.0


def test_silent_peer_goes_suspect_then_down_and_comes_back():
    a, b = core("a"), core("b")
    for t in range(30):
        a.tick(float(t))
        b.tick(float(t))
        exchange(b, a, float(t))
    statuses = {}
    for i in range(100):  # b stops after t=29
        t = 29.0 + i * 0.1
        a.tick(t)
        statuses.setdefault(a.status_of("b", t), t)
    assert list(statuses) == ["up", "suspect", "down"]
    assert 5.0 < statuses["down"] - 29.0 < 6.0 and statuses["down"] > statuses["suspect"]
    live, down = a._live_and_down(39.0)
    assert (live, down) == ([], ["b"])
    b.tick(39.0)
    exchange(b, a, 39.0)
    assert a.status_of("b", 39.0) == "up"


def test_down_peer_is_still_gossiped_to_sometimes():
    a = core("a", seed=7)
    b = core("b")
    exchange(b, a, 0.0)
    targets = [o.to_addr for t in range(20, 220) for o in a.tick(float(t))]
    assert a.status_of("b", 220.0) == "down"
    # With no live peer, prob down/(live+1) = 1: every round tries b.
    assert targets.count("b:7070") == 200


def test_restart_with_new_generation_gets_a_fresh_detector():
    a, b = core("a"), core("b")
    for t in range(10):
        b.tick(float(t))
        exchange(b, a, float(t))
    old = a.detector.detector("b")
    b2 = core("b", generation=2000)  # restarted: version back to 0, generation up
    b2.tick(100.0)
    exchange(b2, a, 100.0)
    assert a.state.endpoints["b"].generation == 2000
    assert a.detector.detector("b") is not old and a.status_of("b", 100.0) == "up"


def test_own_entry_is_never_taken_from_a_peer():
    a, b = core("a"), core("b")
    exchange(b, a, 0.0)
    # A stale incarnation of "a" with a higher version is around.
    forged = dataclasses.replace(a.self_state, version=50, status="removed")
    a.on_message(1.0, "b:7070", Ack("b", ClusterState.of([forged]), ClusterState().wants(ClusterState().digest())))
    assert a.self_state.status == "normal" and a.self_state.version == 51
    # ... and the next exchange makes everyone see ours.
    b.state.absorb(ClusterState.of([forged]))
    exchange(a, b, 2.0)
    assert b.state.endpoints["a"] == a.self_state


def test_removed_broker_is_reported_and_not_gossiped_to():
    a, b = core("a"), core("b")
    b.set_status("removed")
    exchange(b, a, 0.0)
    assert a.status_of("b", 100.0) == "removed"
    assert a._live_and_down(100.0) == ([], [])
    assert a.detector.detector("b") is None


def test_status_mapping_and_unknown_broker():
    a, b = core("a"), core("b", status="joining")
    exchange(b, a, 0.0)
    assert a.status_of("b", 0.0) == "joining"
    b.set_status("leaving")
    exchange(b, a, 1.0)
    assert a.status_of("b", 1.0) == "leaving"
    assert a.status_of("a", 1e9) == "up"  # never suspects itself
    with pytest.raises(NotFound):
        a.status_of("nobody", 0.0)


def test_topic_writes_always_move_forward():
    a = core("a")
    first = a.put_topic("t", {"p": 1}, 100)
    again = a.put_topic("t", {"p": 2}, 50)  # our clock went back
    assert again.timestamp_ms == 101 and again.key > first.key
    gone = a.delete_topic("t", 50)
    assert gone.timestamp_ms == 102 and a.topics() == {}
    with pytest.raises(UnknownTopic):
        a.delete_topic("t", 200)
    with pytest.raises(InvalidTopicName):
        a.put_topic("../x", {}, 1)
    with pytest.raises(BadRequest):
        a.set_load({"x": float("nan")})


def test_messages_round_trip_and_misrouted_ones_are_ignored():
    a, b = core("a"), core("b")
    st = a.state
    for msg in (Syn("a", st.digest()), Ack("a", st, st.wants(st.digest())), Ack2("a", st)):
        assert wire(msg) == msg
        assert a.on_message(0.0, "x:1", msg) == []
    assert isinstance(b.on_message(0.0, "a:7070", Syn("a", st.digest()))[0], Outgoing)
