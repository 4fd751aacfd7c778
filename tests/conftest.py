"""Fixtures that start real broker processes (see tests/brokers.py).

``broker`` is one process for the whole session, for tests that only add
their own topics; ``make_broker`` starts private ones (killed, restarted or
configured differently), stopped at the end of the test whatever happens.
``shared_cluster`` and ``make_cluster`` do the same for 3-broker clusters
(started once every broker sees every other one up); ``kafka_cluster`` is a
shared one whose brokers also serve Kafka's protocol.

Under pytest-xdist (``make test`` runs two workers) each worker picks listening
ports from its own slice of the range (``ring.localcluster.PORT_SLICE_ENV``,
inherited by every broker and harness it starts), and the Spark tests run on
one worker, so one SparkSession is started, not one per worker.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from ring.localcluster import PORT_SLICE_ENV
from tests.brokers import Http, TestBroker, TestCluster

SPARK_DIR = Path(__file__).parent / "spark"


def pytest_configure(config: pytest.Config) -> None:
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and count:  # gw0, gw1 ...
        os.environ[PORT_SLICE_ENV] = f"{int(worker.removeprefix('gw'))}/{count}"
    # A suite started in the background of a shell without job control inherits SIGINT ignored, and so
    # would every command a test starts, whose Ctrl-C tests would then wait in vain: Python's own handler.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup`` the Spark tests share one worker: one SparkSession, one JVM. The
    scheduler groups them by path itself (xdist's own ``xdist_group`` marks do not reach its test ids
    under pytest 9), and hands the group out first, as the biggest unit of work."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    spark = SPARK_DIR.relative_to(config.rootpath).as_posix() + "/"

    class SparkTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "spark" if nodeid.startswith(spark) else super()._split_scope(nodeid)

    return SparkTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with a slow test first, then the other modules that start brokers, then the rest, each
    module's tests in their own order: xdist hands the tests out in this order (after the Spark group),
    so the long ones start early and the many short ones fill in at the end, instead of a long one
    starting last while the other worker has nothing left."""
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        r = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("integration") else 2
        rank[module] = min(rank.get(module, 2), r)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    b = TestBroker(tmp_path_factory.mktemp("session-broker"), args=["--fsync", "interval:100"])
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def http(broker: TestBroker) -> Http:
    return broker.http


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., TestBroker]]:
    started: list[TestBroker] = []

    def make(*args: str, name: str = "ring-0", env: dict[str, str] | None = None) -> TestBroker:
        b = TestBroker(tmp_path, name=name, args=args, env=env)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.kill()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    """One broker with a Kafka listener, for a test module; ``kafka.bootstrap`` is its HOST:PORT."""
    from ring.localcluster import free_port

    port = free_port()
    b = TestBroker(tmp_path_factory.mktemp("kafka"), args=["--kafka-listen", f"127.0.0.1:{port}"]).start()
    b.bootstrap = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield b
    b.stop()


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """Three gossiping brokers for the whole session: for tests that neither kill nor pause one."""
    c = TestCluster(tmp_path_factory.mktemp("shared-cluster"), 3, args=["--fsync", "interval:100"])
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """Three gossiping brokers, each with a Kafka listener, for the whole session: for the Kafka client
    modules, each with topic and group names of its own, none of which kills, pauses or restarts one."""
    c = TestCluster(tmp_path_factory.mktemp("kafka-cluster"), 3, kafka=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., TestCluster]]:
    """Private clusters (killed, paused, restarted), killed at the end of the test whatever happens."""
    started: list[TestCluster] = []

    def make(size: int = 3, *args: str, prefixes: dict[int, list[str]] | None = None) -> TestCluster:
        c = TestCluster(tmp_path / f"cluster-{len(started)}", size, args=args, prefixes=prefixes)
        started.append(c)
        return c.start()

    yield make
    for c in started:
        c.kill()
