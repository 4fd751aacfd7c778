"""docs/ARCHITECTURE.md's picture of the modules and their arrows, and its module table, are the code's:
tests.codemap generates them from the imports and docstrings of ring/ and sparkio/."""

from __future__ import annotations

from tests import codemap
from tests.docs import section


def test_the_committed_code_map_is_the_generated_one() -> None:
    assert section("codemap") == codemap.render(), (
        "docs/ARCHITECTURE.md's code map differs from the code: regenerate it with "
        "`python -m tests.codemap --write docs/ARCHITECTURE.md` (and check that its prose still holds)")


def test_the_map_sees_every_unit_and_their_imports() -> None:
    arrows, listed = codemap.graph()
    assert {"broker", "cluster", "replication", "log", "http_api", "groups", "sparkio"} <= set(listed)
    assert "log" in arrows["broker"] and "broker" in arrows["cluster"]  # absolute imports
    assert "hashing" in arrows["broker"]  # `from ring.hashing import ...` names the package
    network = {name for unit in listed.values() for name, _, net in unit if net}
    assert "ring.gossip.core" not in network and "ring.cluster.membership" in network
