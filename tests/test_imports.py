"""No two modules of ring or sparkio import each other, directly or around a loop.

Every import counts: at the top, inside a function (the usual way to dodge a
cycle at import time) and under ``TYPE_CHECKING``. A cycle means neither side
can be read, tested or replaced without the other; the way out is a narrow
interface (a ``Protocol`` of what one side uses) or moving what both need
below them.
"""

from __future__ import annotations

from tests import codemap


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of ring and sparkio it imports (its own enclosing packages left out:
    importing a sibling through its package is not a loop)."""
    modules = codemap._modules()
    known = {name for name, _ in modules}
    graph: dict[str, set[str]] = {}
    for name, path in modules:
        targets = set()
        for imported in codemap._imports(name, path):
            while imported and imported not in known:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_loop_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = module_graph()
    assert "ring.broker" in graph["ring.cluster.node"], "the graph misses a known import"
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " <-> ".join(component) + ": " + "; ".join(
            f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component)
        for component in found)


def test_the_ranges_reach_the_broker_only_through_their_host_interface() -> None:
    """``Ranges`` takes a ``RangesHost`` (ring/ranges/host.py), not the broker: no module of
    ring.ranges imports the broker or the cluster node, and the node has every name the host lists."""
    from pathlib import Path

    from ring.clock import SystemClock
    from ring.cluster.membership import Membership
    from ring.cluster.node import ClusterBroker
    from ring.config import BrokerConfig
    from ring.ranges.host import MembershipView, RangesHost

    graph = module_graph()
    reached = {(m, t) for m, targets in graph.items() if m.startswith("ring.ranges.") for t in targets
               if t == "ring.broker" or t.startswith("ring.cluster.")}
    assert not reached, reached

    node = ClusterBroker(BrokerConfig(data_dir=Path("unused")), SystemClock())  # not opened: no file is made
    assert len(names(RangesHost)) > 10 and not {n for n in names(RangesHost) if not hasattr(node, n)}
    assert not {n for n in names(MembershipView) if not hasattr(Membership, n)}


def test_the_ranges_parts_are_held_by_ranges_not_inherited() -> None:
    """``Ranges`` holds its reads below the local logs (``Reads``), its audit (``Audit``) and its
    copier, each given the ranges through a narrow owner interface, and derives from none of them:
    ``Ranges`` has every name each owner interface lists."""
    from pathlib import Path

    from ring.clock import SystemClock
    from ring.cluster.node import ClusterBroker
    from ring.config import BrokerConfig
    from ring.ranges.audit import Audit, AuditOwner
    from ring.ranges.copier import CopyOwner
    from ring.ranges.manager import Ranges
    from ring.ranges.remote import Reads, ReadsOwner

    assert Ranges.__mro__ == (Ranges, object) and Reads.__mro__ == (Reads, object) and Audit.__mro__ == (Audit, object)
    ranges = ClusterBroker(BrokerConfig(data_dir=Path("unused")), SystemClock()).ranges  # not opened: no file is made
    assert isinstance(ranges.reads, Reads) and isinstance(ranges.audit, Audit)
    for owner in (ReadsOwner, AuditOwner, CopyOwner):
        assert len(names(owner)) >= 5 and not {n for n in names(owner) if not hasattr(ranges, n)}, owner


def test_repair_reaches_the_broker_only_through_its_host_interface() -> None:
    """``Repair`` takes a ``RepairHost`` (ring/repair/host.py): no module of ring.repair imports the
    broker or anything of ring.cluster (the peer client included), and the node has every name the host
    lists, its peer client every name of ``PeerCalls``."""
    from pathlib import Path

    from ring.clock import SystemClock
    from ring.cluster.node import ClusterBroker
    from ring.cluster.peers import PeerClient
    from ring.config import BrokerConfig
    from ring.repair.host import PeerCalls, RepairHost

    graph = module_graph()
    reached = {(m, t) for m, targets in graph.items() if m == "ring.repair" or m.startswith("ring.repair.")
               for t in targets if t == "ring.broker" or t == "ring.cluster" or t.startswith("ring.cluster.")}
    assert not reached, reached
    node = ClusterBroker(BrokerConfig(data_dir=Path("unused")), SystemClock())  # not opened: no file is made
    assert len(names(RepairHost)) >= 8 and not {n for n in names(RepairHost) if not hasattr(node, n)}
    assert names(PeerCalls) == {"call"} and hasattr(PeerClient, "call")


def test_the_read_proxy_reaches_the_broker_only_through_its_host_interface() -> None:
    """``Proxy`` (ring/cluster/proxy.py, the reads asked of other brokers) is composed into the broker
    with a ``ProxyHost``, not written as more of its methods: it does not import the broker, and the
    node has every name the host lists."""
    from pathlib import Path

    from ring.clock import SystemClock
    from ring.cluster.node import ClusterBroker
    from ring.cluster.peers import PeerClient
    from ring.config import BrokerConfig
    from ring.cluster.proxy import ClientRequests, ProxyHost

    assert not module_graph()["ring.cluster.proxy"] & BROKER_MODULES
    node = ClusterBroker(BrokerConfig(data_dir=Path("unused")), SystemClock())  # not opened: no file is made
    assert not {n for n in names(ProxyHost) if not hasattr(node, n)}
    assert not {n for n in names(ClientRequests) if not hasattr(PeerClient, n)}


def test_the_routers_reach_the_broker_only_through_their_host_interfaces() -> None:
    """Where produces and reads go is decided by a router the broker holds and calls (``Router``,
    ring/cluster/routing.py; ``LocalRouter``, ring/replication/local.py, a broker alone's), not by
    overrides of the broker's methods: the cluster node derives from ``Broker`` alone, neither router
    imports the broker, the node has every name their hosts list, and both routers have every name
    of ``Routing``, what the broker calls."""
    from pathlib import Path

    from ring.broker import Broker
    from ring.clock import SystemClock
    from ring.cluster.node import ClusterBroker
    from ring.cluster.routing import Router, RouterHost
    from ring.config import BrokerConfig
    from ring.replication.local import LocalHost, LocalRouter, Routing

    assert ClusterBroker.__mro__ == (ClusterBroker, Broker, object)
    graph = module_graph()
    assert not (graph["ring.cluster.routing"] | graph["ring.replication.local"]) & BROKER_MODULES
    node = ClusterBroker(BrokerConfig(data_dir=Path("unused")), SystemClock())  # not opened: no file is made
    assert isinstance(node.router, Router) and isinstance(node.router.local, LocalRouter)
    hosts = names(RouterHost) | names(LocalHost)
    assert len(hosts) > 20 and not {n for n in hosts if not hasattr(node, n)}
    assert len(names(Routing)) >= 8  # (that the protocol was read at all)
    assert not {n for n in names(Routing) if not hasattr(Router, n) or not hasattr(LocalRouter, n)}


def test_the_broker_asks_the_cluster_through_its_host_interface() -> None:
    """``Broker`` takes a ``BrokerHost`` (ring/broker.py) for what the cluster around it decides: the
    cluster node gives it a ``ClusterPolicy`` with every name the host lists, and overrides none of
    them itself (no base whose hooks a subclass fills)."""
    from pathlib import Path

    from ring.broker import BrokerHost
    from ring.clock import SystemClock
    from ring.cluster.node import ClusterBroker, ClusterPolicy
    from ring.config import BrokerConfig

    node = ClusterBroker(BrokerConfig(data_dir=Path("unused")), SystemClock())  # not opened: no file is made
    assert isinstance(node.host, ClusterPolicy) and node.host.node is node
    assert len(names(BrokerHost)) >= 9 and not {n for n in names(BrokerHost) if not hasattr(ClusterPolicy, n)}
    assert not set(names(BrokerHost)) & set(vars(ClusterBroker)), "ClusterBroker fills the broker's host itself"


# The broker itself: what only the layers above it (the command line, the HTTP app) and the
# cluster node may import. Everything else (its router included) is given a narrow host.
BROKER_MODULES = {"ring.broker", "ring.cluster.node"}
BROKER_IMPORTERS = {"ring.cli", "ring.http_api.app", "ring.cluster.node"}


def test_no_part_below_the_broker_imports_it() -> None:
    graph = module_graph()
    importers = {m for m, targets in graph.items() if targets & BROKER_MODULES}
    assert importers <= BROKER_IMPORTERS, sorted(importers - BROKER_IMPORTERS)
    assert importers & {"ring.cli", "ring.cluster.node"}, "the graph misses a known import"


def names(protocol: type) -> set[str]:
    """The attributes and methods a ``Protocol`` lists."""
    return set(protocol.__annotations__) | {k for k, v in vars(protocol).items()
                                             if not k.startswith("_") and (callable(v) or isinstance(v, property))}


# Packages that still import each other, each with why it is not broken yet. The test checks the list
# is exact: a cycle that goes away must be taken off, so the list only shrinks. It is empty: no two
# packages under ring/ import each other.
PACKAGE_CYCLES_ALLOWED: dict[tuple[str, str], str] = {}


def package_of(module: str) -> str:
    """``ring.cluster.node`` -> ``ring.cluster``; a top-level module (``ring.limits``) is its own package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def package_cycles(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Pairs of ring packages that import each other, each pair sorted."""
    edges = {(package_of(m), package_of(t)) for m, targets in graph.items() if m.startswith("ring.")
             for t in targets if t.startswith("ring.")}
    return {tuple(sorted((a, b))) for a, b in edges if a != b and (b, a) in edges}


def test_the_package_cycle_finder_sees_relative_and_function_level_imports(tmp_path) -> None:
    low = tmp_path / "b.py"
    low.write_text("def f():\n    from ring.high import a\n")
    high = tmp_path / "a.py"
    high.write_text("from ..low import b\n")
    graph = {"ring.high.a": codemap._imports("ring.high.a", high) & {"ring.low.b"},
             "ring.low.b": codemap._imports("ring.low.b", low) & {"ring.high.a"}}
    assert package_cycles(graph) == {("ring.high", "ring.low")}
    assert package_cycles({"ring.high.a": {"ring.low.b"}, "ring.low.b": {"ring.limits"}}) == set()


def test_no_two_packages_import_each_other_but_the_listed_ones() -> None:
    graph = module_graph()
    found = package_cycles(graph)
    unexpected = found - set(PACKAGE_CYCLES_ALLOWED)
    assert not unexpected, "packages that import each other:\n" + "\n".join(
        f"{a} <-> {b}: " + "; ".join(f"{m} -> {t}" for m in sorted(graph) for t in sorted(graph[m])
                                     if {package_of(m), package_of(t)} == {a, b})
        for a, b in sorted(unexpected))
    gone = set(PACKAGE_CYCLES_ALLOWED) - found
    assert not gone, f"no longer cycles, take them off PACKAGE_CYCLES_ALLOWED: {sorted(gone)}"
