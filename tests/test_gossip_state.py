"""The gossiped state merges like a CRDT and survives any bytes a peer sends."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring.errors import BadRequest
from ring.gossip.core import message_from_wire
from ring.gossip.state import STATUSES, ClusterState, Digest, EndpointState, TopicEntry

SETTINGS = settings(max_examples=100, deadline=None)

# Few names and small version ranges, so that states collide often, ties
# (same version, different content) included.
names = st.sampled_from(["b-0", "b-1", "b-2", "b-3"])
topic_names = st.sampled_from(["clicks", "orders", "t.3", "__offsets"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-2, 2, allow_nan=False), st.text(max_size=3))
small_maps = st.dictionaries(st.sampled_from(["disk_bytes", "partitions_led", "x"]), scalars, max_size=3)


@st.composite
def endpoints(draw, name=None):
    n = draw(names) if name is None else name
    return EndpointState(
        name=n,
        token=draw(st.sampled_from([-(2**63), 0, 42, 2**63 - 1])),
        client_addr=f"{n}:8080",
        peer_addr=f"{n}:7070",
        generation=draw(st.integers(0, 2)),
        version=draw(st.integers(0, 3)),
        status=draw(st.sampled_from(STATUSES)),
        load=draw(small_maps),
        extra=draw(small_maps),
    )


topic_entries = st.builds(
    TopicEntry,
    timestamp_ms=st.integers(0, 3),
    writer=names,
    config=st.one_of(st.none(), small_maps),
)


@st.composite
def states(draw):
    eps = draw(st.lists(endpoints(), max_size=5))
    return ClusterState(
        {e.name: e for e in eps},
        draw(st.dictionaries(topic_names, topic_entries, max_size=4)),
    )


@SETTINGS
@given(states(), states())
def test_merge_is_commutative(a, b):
    assert a.merge(b) == b.merge(a)


@SETTINGS
@given(states(), states(), states())
def test_merge_is_associative(a, b, c):
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@SETTINGS
@given(states(), states())
def test_merge_is_idempotent_and_pure(a, b):
    a_before, b_before = a.to_wire(), b.to_wire()
    m = a.merge(b)
    assert a.to_wire() == a_before and b.to_wire() == b_before
    assert a.merge(a) == a
    assert m.merge(b) == m and m.merge(a) == m


@SETTINGS
@given(states(), states())
def test_absorb_equals_merge_and_reports_changes(a, b):
    expected = a.merge(b)
    changes = a.absorb(b)
    assert a == expected
    for old, new in changes.endpoints:
        assert a.endpoints[new.name] is new and (old is None or new.key > old.key)
    assert not a.absorb(b)  # nothing left to change


def push_pull(a: ClusterState, b: ClusterState) -> None:
    """SYN (a's digest) -> ACK (delta + request) -> ACK2, through the wire."""
    syn = Digest.from_wire(msgpack.unpackb(msgpack.packb(a.digest().to_wire())))
    delta = ClusterState.from_wire(msgpack.unpackb(msgpack.packb(b.delta_for(syn).to_wire())))
    request = Digest.from_wire(msgpack.unpackb(msgpack.packb(b.wants(syn).to_wire())))
    a.absorb(delta)
    reply = a.delta_for(request)
    b.absorb(ClusterState.from_wire(msgpack.unpackb(msgpack.packb(reply.to_wire()))))


@SETTINGS
@given(states(), states())
def test_push_pull_leaves_both_equal_to_the_merge(a, b):
    expected = a.merge(b)
    push_pull(a, b)
    assert a == expected
    assert b == expected


@SETTINGS
@given(states(), states())
def test_delta_is_no_bigger_than_needed(a, b):
    delta = b.delta_for(a.digest())
    for n, e in delta.endpoints.items():
        assert n not in a.endpoints or e.key > a.endpoints[n].key
    for n, t in delta.topics.items():
        assert n not in a.topics or t.key > a.topics[n].key
    # Equal states exchange nothing.
    assert not b.delta_for(b.digest()).endpoints and not b.wants(b.digest())


@SETTINGS
@given(states())
def test_wire_round_trip_through_msgpack(a):
    assert ClusterState.from_wire(msgpack.unpackb(msgpack.packb(a.to_wire()))) == a
    assert Digest.from_wire(msgpack.unpackb(msgpack.packb(a.digest().to_wire()))) == a.digest()


def test_tie_on_version_is_broken_by_content_everywhere():
    one = EndpointState("b-0", 0, "c", "p", generation=1, version=5, status="normal")
    two = EndpointState("b-0", 0, "c", "p", generation=1, version=5, status="leaving")
    a, b = ClusterState.of([one]), ClusterState.of([two])
    push_pull(a, b)
    assert a == b and a.endpoints["b-0"] == max(one, two, key=lambda e: e.key)


def test_topic_tombstone_wins_over_older_config():
    a = ClusterState(topics={"clicks": TopicEntry(10, "b-0", {"partitions": 8})})
    b = ClusterState(topics={"clicks": TopicEntry(11, "b-1", None)})
    m = a.merge(b)
    assert m.live_topics() == {} and m.topics["clicks"].deleted
    assert m.purge_tombstones(11) == [] and m.purge_tombstones(12) == ["clicks"]


# -- garbage in, BadRequest out -------------------------------------------------

garbage = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
        st.binary(max_size=8), st.sampled_from(["endpoints", "topics", "complete", "syn", "ack", "ack2"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.sampled_from(
            ["endpoints", "topics", "complete", "type", "sender", "digest", "delta", "request", "name",
             "token", "status", "load", "extra", "generation", "version"])), inner, max_size=5),
    ),
    max_leaves=25,
)


def _mutate(data, wire):
    """Replace one random node of a valid wire form with garbage."""
    if isinstance(wire, dict) and wire and data.draw(st.booleans()):
        k = data.draw(st.sampled_from(sorted(wire, key=repr)))
        return {**wire, k: _mutate(data, wire[k])}
    if isinstance(wire, list) and wire and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(wire) - 1))
        return wire[:i] + [_mutate(data, wire[i])] + wire[i + 1:]
    return data.draw(garbage)


def _only_bad_request(fn, w):
    try:
        fn(w)
    except BadRequest:
        pass


@SETTINGS
@given(garbage)
def test_from_wire_on_garbage_raises_only_bad_request(w):
    for fn in (ClusterState.from_wire, Digest.from_wire, EndpointState.from_wire, TopicEntry.from_wire,
               message_from_wire):
        _only_bad_request(fn, w)


@SETTINGS
@given(states(), st.data())
def test_from_wire_on_damaged_valid_input_raises_only_bad_request(a, data):
    syn = {"type": "syn", "sender": "b-0", "digest": a.digest().to_wire()}
    ack = {"type": "ack", "sender": "b-0", "delta": a.to_wire(), "request": a.wants(a.digest()).to_wire()}
    _only_bad_request(ClusterState.from_wire, _mutate(data, a.to_wire()))
    _only_bad_request(Digest.from_wire, _mutate(data, a.digest().to_wire()))
    _only_bad_request(message_from_wire, _mutate(data, syn))
    _only_bad_request(message_from_wire, _mutate(data, ack))


@pytest.mark.parametrize(
    "w",
    [
        {"endpoints": [], "topics": {"../etc": [0, "b", None]}},
        {"endpoints": [], "topics": {"t": [0, "b", {"x": float("nan")}]}},
        {"endpoints": [], "topics": {"t": [-1, "b", None]}},
        {"endpoints": [], "topics": {"t": [2**64, "b", None]}},
        {"endpoints": [], "topics": {"t": [0, "b", {"x": [[[[[[[[[[1]]]]]]]]]]}]}},
        {"endpoints": [], "topics": {"t": [0, "\ud800", None]}},
        {"endpoints": [{"name": "x"}], "topics": {}},
        {"endpoints": [], "topics": {}, "more": 1},
        {"endpoints": [], "topics": {"t": [True, "b", None]}},
    ],
)
def test_specific_bad_inputs_are_refused(w):
    with pytest.raises(BadRequest):
        ClusterState.from_wire(w)


def test_duplicate_endpoint_is_refused():
    e = EndpointState("b-0", 0, "c", "p", generation=1).to_wire()
    with pytest.raises(BadRequest):
        ClusterState.from_wire({"endpoints": [e, e], "topics": {}})
