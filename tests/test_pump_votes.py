"""Vote requests to one peer travel together: the node core's driver sends the vote requests of one
event-loop turn to a peer ``VOTES_PER_MESSAGE_MAX`` to a message (``POST /peer/v1/votes``) and steps
each message's answers back in one ``VoteAnswered`` (ring.cluster.pump.NodePump), so a broker that
lost the leader of hundreds of partitions asks each voter in a few messages. The voter here is a
real broker of a running cluster."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import msgpack

from ring import limits
from ring.clock import SystemClock
from ring.cluster.peers import PeerClient
from ring.cluster.pump import NodePump
from ring.node.ready import Ready, VoteAnswered
from ring.replication import election
from tests.support import wait_for


class _Core:
    """The node core as the driver sees it when stepping answers: it records what it is given."""

    def __init__(self) -> None:
        self.stepped: list[Any] = []

    def step(self, now: float, message: Any) -> Ready:
        self.stepped.append(message)
        return Ready()


def _pre_votes(count: int) -> list[election.VoteRequest]:
    # Pre-votes for partitions the voter does not hold: it answers not_a_voter and saves nothing.
    return [election.VoteRequest("no-such-topic", p, 7, "ring-x", 0, 0, True) for p in range(count)]


async def test_the_vote_requests_of_a_loop_turn_go_to_a_peer_together(shared_cluster) -> None:
    voter = shared_cluster[1]
    peers = PeerClient("ring-x", shared_cluster.secret,
                       peer_url=lambda name: f"http://{voter.local.host}:{voter.peer_port}")
    core = _Core()
    pump = NodePump(core, SystemClock(), peers)  # type: ignore[arg-type]  # stepping answers uses only step
    reqs = _pre_votes(2 * limits.VOTES_PER_MESSAGE_MAX + 44)
    try:
        half = len(reqs) // 2
        for part in (reqs[:half], reqs[half:]):  # two Readies of one loop turn
            ready = Ready()
            ready.sends = [(voter.name, r) for r in part]
            pump.carry_out(ready)

        def answered() -> int:
            return sum(len(m.answers) for m in core.stepped)

        deadline = asyncio.get_running_loop().time() + 20.0
        while answered() < len(reqs) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await pump.close()
        await peers.close()
    assert len(core.stepped) == math.ceil(len(reqs) / limits.VOTES_PER_MESSAGE_MAX)
    assert all(isinstance(m, VoteAnswered) and m.peer == voter.name for m in core.stepped)
    # Each message's answers come in its requests' order; the messages themselves may be answered in any
    # order (they go out together), each a run of the turn's requests.
    runs = sorted(([req for req, _ in m.answers] for m in core.stepped), key=lambda run: reqs.index(run[0]))
    assert [req for run in runs for req in run] == reqs
    pairs = [pair for m in core.stepped for pair in m.answers]
    for req, reply in pairs:
        assert reply is not None and (reply.topic, reply.partition) == (req.topic, req.partition)
        assert not reply.granted and reply.reason == election.NOT_A_VOTER


def test_a_votes_message_over_the_limit_or_with_a_malformed_request_is_refused(shared_cluster) -> None:
    voter = shared_cluster[1]
    wires = [r.to_wire() for r in _pre_votes(limits.VOTES_PER_MESSAGE_MAX + 1)]
    bad = [*wires[:3], ["vote", "t", -1, 1, "ring-x", 0, 0, 0]]
    for body in (wires, [], bad, {"vote": 1}):
        r = voter.peer.post("/peer/v1/votes", body=msgpack.packb(body), headers=voter.auth)
        assert r.status == 400, (len(body), r.status)
        assert r.json()["error"] == "bad_request"
    r = voter.peer.post("/peer/v1/votes", body=msgpack.packb(wires[:2]), headers=voter.auth)
    assert r.status == 200
    assert [election.reply_from_wire(w).partition for w in msgpack.unpackb(r.body)] == [0, 1]


def test_a_ballot_that_cannot_be_saved_grants_nothing_and_says_so(shared_cluster, topic: str) -> None:
    """The voter cannot write its ballot file (a directory stands where its temporary file goes): the
    votes message gets 500 ``storage_error`` naming the ballot, with no vote in it; once the file can be
    written again the same voter answers votes."""
    from ring.log.fsync import TMP_SUFFIX
    from ring.replication.state import STATE_FILE

    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3).status == 201
    doc = c[0].http.describe(topic)["partitions"][0]
    voter = next(m for m in c if m.name != doc["leader"])
    candidate = next(m for m in c if m.name not in (doc["leader"], voter.name))
    blocker = voter.local.data_dir / "topics" / topic / "0" / (STATE_FILE + TMP_SUFFIX)
    ask = [election.VoteRequest(topic, 0, doc["epoch"] + 5, candidate.name, doc["epoch"] + 4, 1 << 40).to_wire()]

    def block() -> bool:
        try:
            blocker.mkdir()  # (the broker may be writing its file right now: its temporary one is there)
        except FileExistsError:
            return False
        return True

    wait_for("the ballot's temporary file blocked", block, 10)
    try:
        r = voter.peer.post("/peer/v1/votes", body=msgpack.packb(ask), headers=voter.auth)
        assert r.status == 500, (r.status, r.body)
        body = r.json()
        assert body["error"] == "storage_error" and "ballot" in body["message"], body
        assert "no vote" in body["message"] and STATE_FILE + TMP_SUFFIX in body["message"], body
    finally:
        blocker.rmdir()
    ask = [election.VoteRequest(topic, 0, doc["epoch"] + 6, candidate.name, doc["epoch"] + 4, 1 << 40,
                                pre=True).to_wire()]
    r = voter.peer.post("/peer/v1/votes", body=msgpack.packb(ask), headers=voter.auth)
    assert r.status == 200, (r.status, r.body)
    assert [election.reply_from_wire(w).partition for w in msgpack.unpackb(r.body)] == [0]
