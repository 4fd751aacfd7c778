"""An unclean election on real brokers: availability chosen over what only lost replicas held.

The scenario of tests/test_disk_loss.py: one partition, RF 3; F1 paused while records are acknowledged
at quorum by the leader L and F2; L dies, F2 comes back with an empty data directory, F1 resumes. The
partition stays without a leader (503 ``no_eligible_leader``) until an operator chooses otherwise:

* the one-shot command (``POST .../unclean-election``) elects F1, the only live replica holding state;
  it records from which offset records were lost, new writes are taken from there, F2 catches up, and
  when L comes back with its disk it follows F1 and gives up what F1 never had: every replica ends up
  with the same log;
* turning the topic's ``unclean_leader_election`` on (PATCH) does the same without a command.

And what is refused: a partition that has a leader (409 ``election_not_needed``), an unknown topic or
partition (404), a setting that is not a boolean (400).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.brokers import Member, TestCluster
from tests.support import wait_for
from tests.test_disk_loss import ELECTED_WITHIN_S, TOPIC, leader_seen_by, produce, stale_and_wiped

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REFUSED_WITHIN_S = 40.0  # detection of L's death, then F1's rounds finding F2 without its state


def leaderless_after_disk_loss(make_cluster) -> tuple[TestCluster, Member, Member, Member, dict[int, Any]]:
    """The issue's scenario, up to writes refused as no_eligible_leader: (cluster, L, F1, F2, acked)."""
    c, lead, f1, f2, acked = stale_and_wiped(make_cluster)

    def refused() -> bool:
        status, doc = produce(f1, ["probe"])
        assert status != 200, doc  # never taken while the acknowledged records are gone
        return status == 503 and doc.get("error") == "no_eligible_leader"

    wait_for("writes refused as no_eligible_leader", refused, REFUSED_WITHIN_S, 0.3)
    return c, lead, f1, f2, acked


def elected_uncleanly(c: TestCluster, lead: Member, f1: Member, f2: Member, acked: dict[int, Any]) -> None:
    """F1 leads, records from its end on were lost (recorded), new writes are taken and everyone,
    L included once it returns, holds the same log."""
    part = wait_for("F1's record of the unclean election",
                    lambda: (lambda p: p if p["unclean_elections"] else None)(f1.http.describe(TOPIC)["partitions"][0]),
                    ELECTED_WITHIN_S, errors=(OSError,))
    assert part["leader"] == f1.name, part
    [record] = part["unclean_elections"]
    lost_from = record["from_offset"]
    # F1's log: the two writes every replica held, and whatever frame was in flight to it when it was
    # paused; nothing acknowledged after that.
    assert 2 <= lost_from < len(acked) and record["epoch"] == part["epoch"], part
    assert part["no_eligible_leader"] is False, part  # (F2 is named in lost_state until it has caught up)
    written: dict[int, str] = {o: v for o, v in acked.items() if o < lost_from}
    for n in range(5):
        status, doc = produce(f2, [f"new-{n}"])  # through the wiped broker: forwarded to F1
        assert status == 200, doc
        written[doc["base_offset"]] = f"new-{n}"
    assert sorted(written) == list(range(lost_from + 5))  # taken from where F1's log ended
    lead.local.start()
    c.wait_statuses({m.name: "up" for m in c})
    end = max(written) + 1
    for m in c:  # the returned L gave up the 200 records only it (and the wiped F2) held
        got = wait_for(f"{m.name} holds the new log", lambda m=m: (lambda g: g if len(g) == end else None)(
            m.http.read_all(TOPIC, 0, end=end, timeout_s=5)), 60, errors=(OSError,))
        assert got == written, (m.name, got)
    wait_for("F2 counts again once caught up", lambda: f1.http.describe(TOPIC)["partitions"][0]["lost_state"] == [],
             30, errors=(OSError,))


def test_an_operator_elects_the_stale_replica_once(make_cluster) -> None:
    c, lead, f1, f2, acked = leaderless_after_disk_loss(make_cluster)
    r = f2.http.post(f"/v1/topics/{TOPIC}/partitions/0/unclean-election")
    assert r.status == 200, r.body
    doc = r.json()
    assert doc["leader"] == f1.name and f1.name in doc["asked"], doc
    assert doc["state"]["unclean_elections"][0]["from_offset"] >= 2, doc
    elected_uncleanly(c, lead, f1, f2, acked)
    r = f2.http.post(f"/v1/topics/{TOPIC}/partitions/0/unclean-election")
    assert r.status == 409 and r.json()["error"] == "election_not_needed", r.body


def test_the_topic_setting_elects_without_a_command(make_cluster) -> None:
    c, lead, f1, f2, acked = leaderless_after_disk_loss(make_cluster)
    r = f1.http.request("PATCH", f"/v1/topics/{TOPIC}", json_body={"unclean_leader_election": True})
    assert r.status == 200 and r.json()["unclean_leader_election"] is True, r.body
    wait_for("a leader", lambda: leader_seen_by([f1, f2]) == f1.name, ELECTED_WITHIN_S + 10, errors=(OSError,))
    elected_uncleanly(c, lead, f1, f2, acked)


def test_what_is_refused(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=1).status == 201
    # The broker asked knows the leader (under load, gossip may bring it a moment after the creator knows it).
    def known() -> bool:
        r = c[1].http.get(f"/v1/topics/{topic}")
        return r.status == 200 and r.json()["partitions"][0]["leader"] is not None

    wait_for("a leader known to the broker asked", known, 20)
    r = c[1].http.post(f"/v1/topics/{topic}/partitions/0/unclean-election")
    assert r.status == 409 and r.json()["error"] == "election_not_needed", r.body
    assert c[1].http.post(f"/v1/topics/{topic}/partitions/1/unclean-election").status == 404
    assert c[1].http.post("/v1/topics/no-such-topic/partitions/0/unclean-election").status == 404
    r = c[0].http.request("PATCH", f"/v1/topics/{topic}", json_body={"unclean_leader_election": "yes"})
    assert r.status == 400 and r.json()["field"] == "unclean_leader_election", r.body
    assert c[0].http.describe(topic)["unclean_leader_election"] is False  # nothing changed
