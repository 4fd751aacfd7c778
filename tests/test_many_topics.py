"""A cluster holding more topics than a gossiped map has keys keeps its leaders.

Each broker gossips the partitions it leads (``ring.gossip.leaders``), and a
follower whose leader stops claiming its partition there deposes it after
``LEADER_CLAIM_GRACE_MS``. A gossiped map holds at most ``GOSSIP_MAP_KEYS_MAX``
keys: were the claims one map key per topic, with more topics than that the
last ones (in name order) would go unclaimed and their leaders be deposed
again and again, on an idle cluster.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ring import limits
from tests.brokers import TestCluster

TOPICS = limits.GOSSIP_MAP_KEYS_MAX + 4  # 3 partitions each: every broker leads a partition of each


@pytest.mark.integration
def test_a_cluster_with_more_topics_than_gossip_map_keys_keeps_its_leaders(tmp_path: Path) -> None:
    c = TestCluster(tmp_path, 3).start()
    try:
        names = [f"t{i}" for i in range(TOPICS)]

        def create(i: int) -> None:
            r = c[i % 3].http.create_topic(names[i], partitions=3, replication_factor=3)
            assert r.status == 201, r.body

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(create, range(TOPICS)))
        last = max(names)  # the topics sorting last are the ones a map full of keys leaves unclaimed
        deadline = time.monotonic() + 30
        while None in c.leaders(last).values() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert None not in c.leaders(last).values()

        def step_downs() -> int:
            return sum(m.log_text().count("steps down") for m in c)

        before = step_downs()
        time.sleep(2 * limits.LEADER_CLAIM_GRACE_MS / 1000 + 1)  # past the grace, twice
        assert step_downs() == before, "leaders were deposed on an idle cluster"
        for name in (last, min(names)):
            for m in c:
                doc = m.http.get(f"/v1/topics/{name}").json()
                assert all(p["leader"] is not None for p in doc["partitions"]), doc
    finally:
        c.kill()
