"""Hostile bytes on the peer port: gossip messages and replication frames.

Gossip bodies are msgpack-decoded the way the membership driver does it and
handed to ``ring.gossip.core.message_from_wire`` (and the ``from_wire`` of each
state type); replication frames go to ``ring.replication.protocol.decode``.
Random bytes, hand-made msgpack (non-UTF-8 strings, duplicate and non-string
keys, extension types, lying lengths) and valid messages with one part
replaced by structured garbage must raise ``BadRequest`` and nothing else.

A message that *is* accepted must be harmless: a real ``GossipCore`` absorbs
it, and everything the core says afterwards (its answers, its next round, its
own topic writes) must still be a message every peer accepts. Otherwise one
odd value from one peer would make a broker's gossip unreadable to everyone.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ring import limits
from ring.errors import BadRequest
from ring.gossip.core import Ack, Ack2, GossipCore, Syn, message_from_wire
from ring.gossip.state import STATUSES, ClusterState, Digest, EndpointState, TopicEntry
from ring.replication import election, protocol

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64_MAX = 2**63 - 1
INT_EDGES = [0, 1, -1, 2**31 - 1, 2**31, 2**62, INT64_MAX, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1]
NOW_S = 100.0
NOW_MS = 1_700_000_000_000


def refused_or(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except BadRequest:
        return None


def pack(v: Any) -> bytes | None:
    """msgpack bytes of ``v``, or None when msgpack cannot carry it (ints past 64 bits, lone surrogates)."""
    try:
        return msgpack.packb(v, use_bin_type=True)
    except (OverflowError, UnicodeEncodeError, TypeError, ValueError):
        return None


def packed(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return strategy.map(pack).filter(lambda b: b is not None)


def unpack_variants(raw: bytes) -> list[Any]:
    """What a driver could get from these bytes with the usual unpack options (undecodable: none)."""
    out = []
    for kw in ({"raw": False}, {"raw": False, "strict_map_key": False}, {"raw": False, "use_list": False},
               {"raw": True, "strict_map_key": False}):
        try:
            out.append(msgpack.unpackb(raw, **kw))
        except (ValueError, TypeError, msgpack.UnpackException):
            pass
    return out


# --- strategies --------------------------------------------------------------------

leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64) | st.sampled_from(INT_EDGES),
    st.floats() | st.sampled_from([math.nan, math.inf, -math.inf]), st.text(max_size=6),
    st.sampled_from(["\ud800", "a\udfff", "", "x" * (limits.BROKER_NAME_BYTES_MAX + 1), "..", "me", "syn"]),
    st.binary(max_size=6), st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=3)),
)
garbage = st.recursive(
    leaf,
    lambda kids: st.lists(kids, max_size=4) | st.tuples(kids, kids)
    | st.dictionaries(st.text(max_size=6) | st.integers() | st.binary(max_size=3), kids, max_size=4),
    max_leaves=16,
)


def _deep(n: int) -> Any:
    v: Any = 1
    for i in range(n):
        v = [v] if i % 2 else {"k": v}
    return v


names = st.sampled_from(["me", "b-1", "b-2"])
topic_names = st.sampled_from(["clicks", "t.1", "__offsets"])
big_ints = st.sampled_from([0, 1, 5, 2**31, 2**62, INT64_MAX - 1, INT64_MAX])
plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), INT64_MAX) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3),
    max_leaves=8,
)
plain_maps = st.dictionaries(st.text(max_size=4), plain_values, max_size=3)


@st.composite
def endpoints(draw: st.DrawFn) -> EndpointState:
    n = draw(names)
    return EndpointState(n, draw(st.sampled_from([-(2**63), 0, INT64_MAX])), f"{n}:8080", f"{n}:7070",
                         draw(big_ints), draw(big_ints), draw(st.sampled_from(STATUSES)), draw(plain_maps),
                         draw(plain_maps))


topic_entries = st.builds(TopicEntry, big_ints, names, st.none() | plain_maps)
states = st.builds(
    lambda eps, tops: ClusterState({e.name: e for e in eps}, tops),
    st.lists(endpoints(), max_size=3), st.dictionaries(topic_names, topic_entries, max_size=2),
)


@st.composite
def messages(draw: st.DrawFn, over: st.SearchStrategy[ClusterState] = states,
             senders: tuple[str, ...] = ("b-1", "b-2")) -> dict[str, Any]:
    """The wire form of a valid gossip message over arbitrary states (``over``), versions and timestamps up to
    2**63-1."""
    a, b = draw(over), draw(over)
    sender = draw(st.sampled_from(senders))
    kind = draw(st.sampled_from(["syn", "ack", "ack2"]))
    if kind == "syn":
        return Syn(sender, a.digest()).to_wire()
    if kind == "ack":
        return Ack(sender, a, b.wants(a.digest())).to_wire()
    return Ack2(sender, a).to_wire()


def mutate(data: st.DataObject, wire: Any) -> Any:
    """Replace one node of a wire form with garbage (or with deep nesting)."""
    if isinstance(wire, dict) and wire and data.draw(st.booleans()):
        k = data.draw(st.sampled_from(sorted(wire, key=repr)))
        return {**wire, k: mutate(data, wire[k])}
    if isinstance(wire, list) and wire and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(wire) - 1))
        return wire[:i] + [mutate(data, wire[i])] + wire[i + 1 :]
    return data.draw(garbage | st.sampled_from([_deep(12), _deep(300)]))


def _fixstr(payload: bytes) -> bytes:
    return bytes([0xA0 | len(payload)]) + payload


@st.composite
def hand_made_msgpack(draw: st.DrawFn) -> bytes:
    """A syn-shaped map built byte by byte: duplicate keys, non-UTF-8 strings, lying container sizes."""
    parts = [
        (msgpack.packb("type"), msgpack.packb("syn")),
        (msgpack.packb("sender"), draw(st.sampled_from([msgpack.packb("b-1"), _fixstr(b"\xff\xfe"), b"\xc1"]))),
        (msgpack.packb("digest"), msgpack.packb({"endpoints": {}, "topics": {}, "complete": True})),
        (msgpack.packb("type"), msgpack.packb("ack")),
        (_fixstr(b"typ\xe9"), msgpack.packb("syn")),
        (msgpack.packb(7), msgpack.packb(None)),
    ]
    chosen = draw(st.lists(st.sampled_from(parts), min_size=0, max_size=5))
    n = draw(st.sampled_from([len(chosen), len(chosen) + 1, 15]))
    return bytes([0x80 | min(n, 15)]) + b"".join(k + v for k, v in chosen)


# --- gossip: only BadRequest comes out --------------------------------------------------

FROM_WIRE = (message_from_wire, ClusterState.from_wire, Digest.from_wire, EndpointState.from_wire,
             TopicEntry.from_wire)


@FUZZ
@given(st.binary(max_size=120) | hand_made_msgpack() | packed(messages()) | packed(garbage))
@example(b"\x81\xa4type\xa3syn\x81")  # a map with one entry too few
@example(b"\xdf\xff\xff\xff\xff")  # a map claiming 4G entries
def test_gossip_bytes(raw: bytes) -> None:
    for w in unpack_variants(raw):
        for fn in FROM_WIRE:
            refused_or(fn, w)


@FUZZ
@given(messages(), st.data())
def test_gossip_message_with_one_part_replaced(wire: dict[str, Any], data: st.DataObject) -> None:
    bad = mutate(data, wire)
    refused_or(message_from_wire, bad)
    raw = pack(bad)
    for w in unpack_variants(raw) if raw is not None else ():
        refused_or(message_from_wire, w)


# --- gossip: what is accepted is harmless -----------------------------------------------


def _me() -> GossipCore:
    core = GossipCore(EndpointState("me", 0, "me:8080", "me:7070", 1000, status="normal"), ["b-1:7070"],
                      random.Random(1))
    core.put_topic("clicks", {"partitions": 3}, NOW_MS)
    return core


def _speaks_cleanly(core: GossipCore) -> None:
    """Everything the core could send next parses at a peer."""
    outs = core.tick(NOW_S + 1)
    outs += core.on_message(NOW_S + 1, "b-2:7070", Syn("b-2", Digest()))
    outs += core.on_message(NOW_S + 1, "b-2:7070", Ack("b-2", ClusterState(), core.state.digest()))
    for out in outs:
        message_from_wire(msgpack.unpackb(msgpack.packb(out.message.to_wire(), use_bin_type=True), raw=False))
    ClusterState.from_wire(msgpack.unpackb(msgpack.packb(core.state.to_wire()), raw=False))
    core.statuses(NOW_S + 1)


def _absorb_and_speak(wire: dict[str, Any]) -> None:
    msg = message_from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False))
    core = _me()
    for out in core.on_message(NOW_S, "b-1:7070", msg):
        message_from_wire(msgpack.unpackb(msgpack.packb(out.message.to_wire()), raw=False))
    for name in core.topics():
        core.put_topic(name, {"partitions": 1}, NOW_MS)  # a local write over the peer's version
    _speaks_cleanly(core)


@FUZZ
@given(messages())
def test_an_accepted_message_leaves_the_core_speaking_valid_gossip(wire: dict[str, Any]) -> None:
    _absorb_and_speak(wire)


def test_our_own_entry_shown_at_the_top_version() -> None:
    """A +1 past a peer's version of our own entry would leave int64, and every peer would refuse us."""
    me = EndpointState("me", 0, "me:8080", "me:7070", 1000, INT64_MAX - 1, "normal")
    _absorb_and_speak(Ack2("b-1", ClusterState.of([me])).to_wire())


def test_a_topic_shown_at_the_top_timestamp() -> None:
    """Likewise for our next write of a topic a peer showed at the largest timestamp."""
    _absorb_and_speak(Ack2("b-1", ClusterState.of([], {"clicks": TopicEntry(INT64_MAX, "b-1", {})})).to_wire())


def test_our_own_entry_shown_at_the_top_generation() -> None:
    """And at the top generation, where no new generation is left to take."""
    me = EndpointState("me", 0, "me:8080", "me:7070", INT64_MAX, INT64_MAX - 1, "normal")
    _absorb_and_speak(Ack2("b-1", ClusterState.of([me])).to_wire())


@FUZZ
@given(messages())
def test_an_accepted_message_round_trips(wire: dict[str, Any]) -> None:
    msg = message_from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False))
    assert msg.to_wire() == message_from_wire(msg.to_wire()).to_wire()


# --- replication frames -----------------------------------------------------------------

frame_fields = st.sampled_from(["sync", "append", "hw", "ack", "reject", "vote", "voted", "other", ""]) | leaf
epochs = st.sampled_from([0, 1, 7, 2**31 - 1, 2**31])
offsets = st.sampled_from([0, 1, 5, 2**62, INT64_MAX])


@st.composite
def syncs(draw: st.DrawFn) -> protocol.Sync:
    starts = sorted(draw(st.sets(st.integers(0, 100), max_size=3)))
    history = tuple((i + 1, o) for i, o in enumerate(starts))
    end = draw(offsets)
    return protocol.Sync(draw(topic_names), draw(st.integers(0, 10)), draw(epochs), draw(offsets), draw(offsets),
                         draw(offsets), end, history,
                         tuple(draw(st.lists(names, min_size=1, max_size=3, unique=True))))


valid_frames = st.one_of(
    syncs(),
    st.builds(protocol.Append, topic_names, st.integers(0, 10), big_ints, big_ints, big_ints, st.binary(max_size=20)),
    st.builds(protocol.Hw, topic_names, st.integers(0, 10), big_ints, big_ints),
    st.builds(protocol.FollowerAck, topic_names, st.integers(0, 10), big_ints, big_ints),
    st.builds(protocol.Reject, topic_names, st.integers(0, 10), big_ints, st.sampled_from([-1, 0, 7]),
              st.sampled_from(protocol.REASONS)),
)
MAX_FRAME = limits.REPLICATION_MESSAGE_BYTES_MAX


def _frame_or_refused(raw: bytes) -> protocol.Frame | None:
    f = refused_or(protocol.decode, raw, MAX_FRAME)
    if f is not None:
        assert protocol.decode(protocol.encode(f), MAX_FRAME) == f
        # Batches carry the epoch as int32; partitions are 32-bit everywhere.
        assert 0 <= f.epoch <= 2**31 - 1 and 0 <= f.partition <= 2**31 - 1, f
    return f


@FUZZ
@given(st.binary(max_size=80) | packed(st.lists(frame_fields, max_size=8)) | packed(garbage))
@example(b"\x97\xa6append\xa1t\x00\x01\x00\x00\xc6\xff\xff\xff\xff")  # bin32 claiming 4 GiB
@example(b"\xdd\xff\xff\xff\xff")  # array32 claiming 4G items
@example(msgpack.packb(["reject", "t", 0, 1, -2, "gap"]))
def test_replication_frame_bytes(raw: bytes) -> None:
    _frame_or_refused(raw)


@FUZZ
@given(valid_frames, st.data())
def test_replication_frame_with_one_field_replaced(frame: protocol.Frame, data: st.DataObject) -> None:
    w = frame.to_wire()
    i = data.draw(st.integers(0, len(w) - 1))
    w[i] = data.draw(garbage | frame_fields)
    raw = pack(w)
    if raw is not None:
        _frame_or_refused(raw)
        _frame_or_refused(raw[: data.draw(st.integers(0, len(raw)))])


def test_a_frame_epoch_beyond_the_batch_format_is_refused() -> None:
    """A follower adopting such an epoch could never stamp a batch with it once it leads."""
    for frame in (protocol.Append("t", 0, 2**31, 0, 0, b""), protocol.Hw("t", 0, 2**31, 0)):
        with pytest.raises(BadRequest):
            protocol.decode(protocol.encode(frame), MAX_FRAME)


# --- election votes (POST /peer/v1/votes) --------------------------------------------------


def _vote_wire(raw: bytes) -> Any:
    """The vote body as the peer handler unpacks it; None when msgpack refuses it there."""
    try:
        return msgpack.unpackb(raw, raw=False, max_array_len=16, max_map_len=0, max_str_len=4096)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


vote_requests = st.builds(election.VoteRequest, topic_names, st.integers(0, 10), epochs, names,
                          st.sampled_from([-1, 0, 3, 2**31 - 1]), offsets, st.booleans(), st.booleans())
vote_replies = st.builds(election.VoteReply, topic_names, st.integers(0, 10), epochs, names, st.booleans(),
                         st.sampled_from(election.REASONS))


def _vote_or_refused(w: Any) -> None:
    for parse in (election.request_from_wire, election.reply_from_wire):
        v = refused_or(parse, w)
        raw = None if v is None else pack(v.to_wire())  # None: a lone surrogate, which no wire carries
        if raw is not None:
            assert parse(msgpack.unpackb(raw, raw=False)) == v
            assert 0 <= v.partition <= 2**31 - 1 and 0 <= v.epoch <= 2**31 - 1, v


@FUZZ
@given(st.binary(max_size=60) | packed(st.lists(frame_fields, max_size=9)) | packed(garbage)
       | vote_requests.map(lambda v: msgpack.packb(v.to_wire())))
def test_vote_bytes(raw: bytes) -> None:
    w = _vote_wire(raw)
    if w is not None:
        _vote_or_refused(w)


@FUZZ
@given(vote_requests | vote_replies, st.data())
def test_vote_with_one_field_replaced(vote: Any, data: st.DataObject) -> None:
    w = vote.to_wire()
    w[data.draw(st.integers(0, len(w) - 1))] = data.draw(garbage | frame_fields)
    _vote_or_refused(w)
    raw = pack(w)
    if raw is not None and (w2 := _vote_wire(raw)) is not None:
        _vote_or_refused(w2)
