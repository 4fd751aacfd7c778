"""A produce forwarded to its partition's leader is given up, outcome unknown (504), once the leader
turns unreachable or after ``PEER_REQUEST_TIMEOUT_S`` without an answer (``Router._given_up``, the
rule of ``Router._check_forwards`` over every forward ``Router._forward`` sends), and never lets an
acknowledged write go.

The unit tests run the rule on a router whose host has a real node core, which knows its peer
ring-1 alive by one gossip exchange and hears of its replication link as the peer port would: the
leader is reachable while the link is up and for ``LINK_LOSS_GRACE_MS`` after it closes, and not
after; a broker never heard of is not; a deadline that has passed gives the forward up whatever
the leader's state. ``_check_forwards`` gives up the forwards on the open link the rule says, and
only those.

The integration tests stop the leader (SIGSTOP: the kernel still accepts its connections, nothing
answers) under a broker that forwards to it. With no forward link open yet, the produce waits for
one, whose handshake never completes: it is given up by the rule, naming the leader,
once the leader is unreachable (its replication link to the forwarding broker closed by the
heartbeat, then the grace). On an open link, the link's own heartbeat (``REPLICATION_HEARTBEAT_S``
and half of it again without a pong) closes it first and fails the produce, outcome unknown, a
grace before the rule would. Either way the answer is the forwarding broker's 504, well before
``PEER_REQUEST_TIMEOUT_S``, and every produce answered 200 is read back after the leader resumes.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from typing import Any

import pytest

from ring import limits
from ring.catalog import TopicConfig
from ring.clock import ManualClock
from ring.cluster.routing import Forwarding, Router
from ring.errors import RequestTimeout
from ring.gossip.core import Syn
from ring.gossip.state import EndpointState
from ring.hashing import broker_token
from ring.node.core import NodeCore
from ring.node.members import Members
from ring.node.ready import ClockRead, GossipIn, LeaderLink
from ring.produce import Batches, Produce
from tests.brokers import Http, Member, TestCluster
from tests.support import wait_for

WAIT_S = 30.0
GRACE_S = limits.LINK_LOSS_GRACE_MS / 1000
WALL_MS = 1_700_000_000_000


# --- the rule, on a router over a real node core ------------------------------------------------------


def _core(name: str, seeds: list[str], status: str) -> NodeCore:
    ordinal = int(name.rpartition("-")[2])
    me = EndpointState(name, broker_token(ordinal), f"h:{10 * ordinal}", f"h:{10 * ordinal + 1}",
                       generation=WALL_MS, status=status)
    members = Members(me, seeds, random.Random(1))
    members.restore(None, None, 0.0)
    core = NodeCore(name, lambda t, p: None, lambda: [], True, random.Random(2), members)
    core.step(0.0, ClockRead(WALL_MS))
    return core


def _forwarding_broker() -> NodeCore:
    """ring-0's node core after one gossip exchange with ring-1 (a member) at 0.1 s: it knows ring-1 alive."""
    leader, me = _core("ring-1", ["h:1"], "normal"), _core("ring-0", ["h:11"], "joining")
    ack = me.step(0.1, GossipIn("h:11", Syn(leader.name, leader.members.gossip.state.digest()))).reply
    for dst, ack2 in leader.step(0.1, GossipIn("h:1", ack)).sends:
        me.step(0.1, GossipIn(dst, ack2))
    assert me.members.status("ring-1", 0.1) == "up"
    return me


class Host:
    """The names a ``Router`` reads to give a forward up: the broker's node core and clock."""

    def __init__(self, core: NodeCore, clock: ManualClock) -> None:
        self.name = "ring-0"
        self.core = core
        self.clock = clock


def _router(now: float = 0.1) -> tuple[Router, Host]:
    host = Host(_forwarding_broker(), ManualClock(WALL_MS, now))
    return Router(host), host  # type: ignore[arg-type]  # the part of RouterHost the rule reads


def _message(exc: RequestTimeout | None, leader: str) -> str:
    """The message of a forward given up (a 504 naming the partition and its leader)."""
    assert isinstance(exc, RequestTimeout), exc
    assert exc.status == 504 and exc.code == "timeout"
    assert exc.extra == {"topic": "t", "partition": 3, "leader": leader}
    return exc.message


def test_a_forward_waits_while_its_leader_is_reachable_and_its_deadline_is_ahead() -> None:
    router, _ = _router()
    assert router._given_up(0.1, "ring-1", "t", 3, 0.1 + limits.PEER_REQUEST_TIMEOUT_S) is None


def test_a_forward_is_given_up_once_its_deadline_passes_though_its_leader_is_reachable() -> None:
    router, _ = _router()
    deadline = 0.1
    assert router._given_up(deadline - 0.001, "ring-1", "t", 3, deadline) is None
    message = _message(router._given_up(deadline, "ring-1", "t", 3, deadline), "ring-1")
    within = f"{limits.PEER_REQUEST_TIMEOUT_S:g} s"
    assert message == f"leader ring-1 of t/3 did not answer the produce within {within}; the outcome is unknown"


def test_a_forward_is_given_up_once_its_leaders_link_has_been_closed_for_the_grace_not_before() -> None:
    router, host = _router()
    host.core.step(0.25, LeaderLink("ring-1", True))
    assert router._given_up(0.25, "ring-1", "t", 3, 100.0) is None
    host.core.step(0.5, LeaderLink("ring-1", False))  # its replication link to us broke
    assert router._given_up(0.5 + GRACE_S / 2, "ring-1", "t", 3, 100.0) is None  # within the grace: it may relink
    message = _message(router._given_up(0.5 + GRACE_S, "ring-1", "t", 3, 100.0), "ring-1")
    assert message == "leader ring-1 of t/3 became unreachable while it had the produce; the outcome is unknown"
    host.core.step(0.5 + GRACE_S, LeaderLink("ring-1", True))  # linked again: reachable again
    assert router._given_up(0.5 + GRACE_S, "ring-1", "t", 3, 100.0) is None


def test_a_forward_to_a_broker_never_heard_of_is_given_up_at_once() -> None:
    router, _ = _router()
    message = _message(router._given_up(0.1, "ring-2", "t", 3, 100.0), "ring-2")
    assert message == "leader ring-2 of t/3 became unreachable while it had the produce; the outcome is unknown"


async def test_the_check_gives_up_exactly_the_forwards_the_rule_says() -> None:
    """Three forwards on open links, never answered: to a reachable leader with time left (it waits on),
    to a broker not reachable, and one whose deadline passed. One check settles the last two as 504s, in
    the order they were sent, cancels what they wait on (the link forgets them) and keeps checking while
    the first waits."""
    router, _ = _router(now=0.2)
    loop = asyncio.get_running_loop()
    cfg = TopicConfig("t", partitions=4)

    def forwarding(leader: str, deadline: float) -> tuple[Forwarding, asyncio.Future]:
        sent = loop.create_future()
        f = Forwarding(router, leader, Produce("t", Batches([], 0), 3, None, "quorum"), cfg, 3, [], sent, deadline,
                       follow=True)
        router._forwarding[f] = None  # as _forward registers what it sent
        return f, sent

    waits, waits_sent = forwarding("ring-1", 0.2 + limits.PEER_REQUEST_TIMEOUT_S)
    lost, lost_sent = forwarding("ring-2", 0.2 + limits.PEER_REQUEST_TIMEOUT_S)
    late, late_sent = forwarding("ring-1", 0.2)
    answered: list[Forwarding] = []
    for f in (waits, lost, late):
        f.add_done_callback(answered.append)
    try:
        router._check_forwards()
        assert answered == [lost, late]  # in the order they were sent
        assert "became unreachable while it had the produce" in _message(_raised(lost), "ring-2")
        assert "did not answer the produce within" in _message(_raised(late), "ring-1")
        assert lost_sent.cancelled() and late_sent.cancelled()
        assert not waits.done() and not waits_sent.done() and list(router._forwarding) == [waits]
        assert router._forward_check is not None  # checked again while one waits
    finally:
        if router._forward_check is not None:
            router._forward_check.cancel()
        waits.finish(None)


def _raised(f: Forwarding) -> RequestTimeout | None:
    assert f.done()
    with pytest.raises(RequestTimeout) as caught:
        f.result()
    return caught.value


# --- on real brokers: the leader stopped under a forwarding broker ------------------------------------

# The forwarding broker's two answers to a produce whose leader stopped (SIGSTOP) after it was sent.
GIVEN_UP = re.compile(r"leader (ring-\d) of (\S+)/(\d+) became unreachable while it had the produce; "
                      r"the outcome is unknown")
LINK_CLOSED = re.compile(r"the link to the leader at (\S+) closed with the produce in flight; "
                         r"the outcome is unknown")


def _setup(c: TestCluster, topic: str) -> tuple[Member, int, Member]:
    """A 3-partition topic on every broker; ring-0 forwards, a partition it does not lead, its leader."""
    assert c[0].http.create_topic(topic, partitions=3, replication_factor=3).status == 201
    leaders = c.leaders(topic)
    p = next(p for p, name in leaders.items() if name != c[0].name)
    return c[0], p, c.member(leaders[p])


def _status(m: Member) -> dict[str, Any]:
    return m.http.get("/v1/status").json()


def _produce(via: Member, topic: str, p: int, value: dict[str, Any], acked: dict[int, Any]) -> tuple[int, dict]:
    """One record at quorum; noted in ``acked`` (offset -> value) when answered 200."""
    r = Http(via.local.host, via.local.port, timeout_s=WAIT_S).produce(topic, [value], partition=p,
                                                                       consistency="quorum")
    doc = r.json()
    if r.status == 200:
        assert doc["partition"] == p and doc["count"] == 1, doc
        acked[doc["base_offset"]] = value
    return r.status, doc


def _give_up_of_a_stopped_leader(via: Member, leader: Member, topic: str, p: int,
                                 acked: dict[int, Any]) -> dict[str, Any]:
    """Stop the leader and produce through ``via`` at once: the body of its 504."""
    leader.pause()
    stopped = time.monotonic()
    status, doc = _produce(via, topic, p, {"n": "while-stopped"}, acked)
    waited = time.monotonic() - stopped
    assert status == 504 and doc["error"] == "timeout", (status, doc)
    # Not the leader's own 504 (it cannot answer) and not the deadline's: given up early, by the forwarder.
    assert waited < limits.PEER_REQUEST_TIMEOUT_S, (waited, doc)
    print(f"given up after {waited:.1f} s: {doc['message']}")
    return doc


def _after_resume(c: TestCluster, via: Member, topic: str, p: int, acked: dict[int, Any]) -> None:
    """The leader resumed: a produce through ``via`` is acknowledged again (by it, or by the replica that
    took over), and every broker serves every acknowledged record at its offset."""

    def produced() -> bool:
        status, doc = _produce(via, topic, p, {"n": "after"}, acked)
        assert status in (200, 503, 504), (status, doc)  # an election or a link reopening meanwhile
        return status == 200

    wait_for("a produce acknowledged after the leader resumed", produced, WAIT_S)
    deadline = time.monotonic() + WAIT_S
    end = max(acked) + 1
    for m in c:
        got = m.http.read_all(topic, p, end=end, timeout_s=deadline - time.monotonic())
        missing = {o: v for o, v in acked.items() if got.get(o) != v}
        assert not missing, (m.name, missing, got)


@pytest.mark.integration
@pytest.mark.slow
def test_a_produce_on_an_open_forward_link_to_a_stopped_leader_is_given_up_and_loses_nothing(
        make_cluster, topic: str) -> None:
    """Produces forwarded on the link the forwarding broker keeps open to the leader
    (``Router._forward``); the leader stops with the next one in flight. It is given up, outcome
    unknown, by whichever ends it first: the link's heartbeat or the rule (``Router._check_forwards``)."""
    c: TestCluster = make_cluster(3, "--fsync", "interval:100")
    via, p, leader = _setup(c, topic)
    acked: dict[int, Any] = {}
    for n in range(5):
        assert _produce(via, topic, p, {"n": n}, acked)[0] == 200
    assert _status(via)["forward_links"] == 1  # the forwards went on a standing link to the leader
    try:
        doc = _give_up_of_a_stopped_leader(via, leader, topic, p, acked)
        message = doc["message"]
        closed, given_up = LINK_CLOSED.fullmatch(message), GIVEN_UP.fullmatch(message)
        assert closed or given_up, doc
        if closed:  # the link's heartbeat ended it first
            assert closed.group(1) == f"http://127.0.0.1:{leader.peer_port}", (doc, leader.peer_port)
        else:
            assert given_up.groups() == (leader.name, topic, str(p)), doc
            assert (doc["topic"], doc["partition"], doc["leader"]) == (topic, p, leader.name), doc
    finally:
        leader.resume()
    _after_resume(c, via, topic, p, acked)


@pytest.mark.integration
@pytest.mark.slow
def test_a_first_produce_forwarded_to_a_stopped_leader_is_given_up_once_it_is_unreachable(
        make_cluster, topic: str) -> None:
    """No link to the leader is open: the produce (``Router._forward``) waits for one, whose link
    handshake the stopped leader never answers. The rule gives it up once the forwarding broker
    counts the leader unreachable, within seconds, not at the session's or the request's timeout."""
    c: TestCluster = make_cluster(3, "--fsync", "interval:100")
    via, p, leader = _setup(c, topic)
    acked: dict[int, Any] = {}
    for n in range(3):
        assert _produce(leader, topic, p, {"n": n}, acked)[0] == 200  # straight to the leader
    status = _status(via)
    assert (status["forward_links"], status["produces_forwarded"]) == (0, 0), status
    try:
        doc = _give_up_of_a_stopped_leader(via, leader, topic, p, acked)
        assert GIVEN_UP.fullmatch(doc["message"]), doc
        assert (doc["topic"], doc["partition"], doc["leader"]) == (topic, p, leader.name), doc
    finally:
        leader.resume()
    _after_resume(c, via, topic, p, acked)
