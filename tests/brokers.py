"""Real broker processes for integration tests.

``TestBroker`` runs ``python -m ring serve`` on a free loopback port with a
data directory under a temporary root, waits until ``/v1/status`` answers,
and stops it by PID with SIGTERM (clean) or SIGKILL (crash); ``restart``
reuses the same directory; its ``http`` is a ``tests.support.Http`` on its
client port. ``TestCluster`` runs several brokers that gossip with each other (``ring.localcluster.LocalCluster``), each
a ``Member`` with its client API, its peer port and the cluster secret; a
member may run through a command prefix, such as ``faketime("+8d")`` for a
broker whose wall clock is wrong.
"""

from __future__ import annotations

import glob
import signal
import socket
from pathlib import Path
from typing import Iterable

from ring.localcluster import LocalBroker, free_port
from ring.log import batch as batchfmt
from tests.support import Http, Reply, wait_for

__all__ = ["REPO_ROOT", "Http", "Reply", "TestBroker", "Member", "TestCluster", "faketime", "faketime_file",
           "libfaketime"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def libfaketime() -> str | None:
    """The path of the faketime package's library, None when it is not installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def _preloaded(*settings: str) -> list[str]:
    # Through env, which execs: the broker keeps the PID we started (the faketime command forks a
    # child and waits, so a SIGKILL would reach the wrapper and leave the broker running).
    lib = libfaketime()
    assert lib is not None, "the faketime package is not installed"
    return ["env", f"LD_PRELOAD={lib}", "FAKETIME_DONT_FAKE_MONOTONIC=1", *settings]


def faketime(offset: str) -> list[str]:
    """A command prefix that runs a broker with its wall clock moved by ``offset`` (libfaketime's
    relative form: ``+8d``, ``-60s``) and its monotonic clock untouched: what ``faketime -f OFFSET``
    with FAKETIME_DONT_FAKE_MONOTONIC=1 does (Debian package faketime)."""
    return _preloaded(f"FAKETIME={offset}")


def faketime_file(offset_file: Path) -> list[str]:
    """Like ``faketime``, with the offset read from ``offset_file`` (``+0``, ``+60s`` ...) about every
    second: writing the file sets the broker's clock while it runs."""
    return _preloaded(f"FAKETIME_TIMESTAMP_FILE={offset_file}", "FAKETIME_CACHE_DURATION=1")


class TestBroker:
    """One ``ring serve`` process; a thin layer over the launcher the demo and bench use."""

    __test__ = False  # not a pytest class

    def __init__(self, root: Path, name: str = "ring-0", args: Iterable[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.local = LocalBroker(name, root / name, free_port(), args=list(args),
                                 env={"PYTHONPATH": str(REPO_ROOT), **(env or {})},
                                 log_path=root / f"{name}.log")

    @property
    def url(self) -> str:
        return self.local.url

    @property
    def data_dir(self) -> Path:
        return self.local.data_dir

    @property
    def pid(self) -> int:
        assert self.local.proc is not None
        return self.local.proc.pid

    @property
    def http(self) -> Http:
        return Http(self.local.host, self.local.port)

    def log_text(self) -> str:
        path = self.local.log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def start(self) -> TestBroker:
        self.local.start()
        return self

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit code."""
        return self.local.stop()

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.local.kill()

    def restart(self) -> TestBroker:
        """Start again on the same data directory (a new port if the old one was taken)."""
        self.local.kill()
        try:
            self.local.start()
        except RuntimeError:
            self.local.port = free_port()
            self.local.start()
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.local.proc is not None
        self.local.proc.send_signal(sig)

    def raw_socket(self, timeout_s: float = 30.0) -> socket.socket:
        return socket.create_connection((self.local.host, self.local.port), timeout=timeout_s)


# --- clusters -------------------------------------------------------------------------

CLUSTER_WAIT_S = 40.0  # a cold start of three brokers on a busy 2-core machine, plus gossip rounds


class Member:
    """One broker of a ``TestCluster``: its client API, its peer port, and its process."""

    def __init__(self, local: LocalBroker, peer_port: int, secret: str) -> None:
        self.local = local
        self.peer_port = peer_port
        self.secret = secret

    @property
    def name(self) -> str:
        return self.local.name

    @property
    def url(self) -> str:
        return self.local.url

    @property
    def http(self) -> Http:
        return Http(self.local.host, self.local.port)

    @property
    def peer(self) -> Http:
        """The peer port, with no secret: add ``headers=self.auth`` to be let in."""
        return Http(self.local.host, self.peer_port)

    @property
    def auth(self) -> dict[str, str]:
        return {"Ring-Cluster-Secret": self.secret}

    def log_text(self) -> str:
        path = self.local.log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def kill(self) -> None:
        self.local.kill()

    def pause(self) -> None:
        self.local.pause()

    def resume(self) -> None:
        self.local.resume()

    def restart(self, prefix: list[str] | None = None) -> None:
        """Start again on the same data directory and ports (through ``prefix`` instead of the one it
        had, when given); returns once it has joined."""
        self.local.kill()
        if prefix is not None:
            self.local.prefix = list(prefix)
        self.local.start()

    def cluster_view(self) -> dict[str, str]:
        """Broker name -> status, as this broker sees it."""
        r = self.http.get("/v1/cluster")
        assert r.status == 200, r.body
        return {b["name"]: b["status"] for b in r.json()["brokers"]}

    def replica_log(self, topic: str, partition: int) -> tuple[bytes, int]:
        """This broker's own stored batches of a partition up to its log end, and that end."""
        chunks, offset, end = [], None, 0
        for _ in range(10_000):  # bounded: each round returns at least one batch or ends
            query = {"max_bytes": 1 << 20, **({} if offset is None else {"offset": offset})}
            r = self.peer.get(f"/peer/v1/replicas/{topic}/{partition}", headers=self.auth, query=query)
            assert r.status == 200, r.body
            end = int(r.headers["Ring-Log-End-Offset"])
            if not r.body:
                break
            chunks.append(r.body)
            offset = max(h.next_offset for h, _ in batchfmt.scan(r.body, verify=False))
            if offset >= end:
                break
        return b"".join(chunks), end


class TestCluster:
    """``size`` real brokers ring-0.. on loopback that gossip (seeds: every peer address) and
    share a cluster secret; ``start`` returns once every broker sees every other one up."""

    __test__ = False

    def __init__(self, root: Path, size: int = 3, args: Iterable[str] = (), env: dict[str, str] | None = None,
                 prefixes: dict[int, list[str]] | None = None, hosts: list[str] | None = None,
                 kafka: bool = False) -> None:
        """``prefixes``: broker index -> a prefix its command runs through (``faketime("+8d")``);
        ``kafka``: each broker serves a Kafka listener (``kafka_bootstrap`` names them all)."""
        from ring.localcluster import LocalCluster, free_port

        kafka_ports = [free_port() for _ in range(size)] if kafka else None
        self.local = LocalCluster(root, size, args=list(args), kafka_ports=kafka_ports,
                                  env={"PYTHONPATH": str(REPO_ROOT), **(env or {})}, hosts=hosts)
        self.kafka_bootstrap = ",".join(f"127.0.0.1:{p}" for p in kafka_ports or [])
        for i, prefix in (prefixes or {}).items():
            self.local.brokers[i].prefix = list(prefix)
        assert self.local.peer_ports is None  # free ports, chosen in LocalCluster
        peers = [int(b.args[b.args.index("--peer-listen") + 1].rpartition(":")[2]) for b in self.local.brokers]
        self.members = [Member(b, p, self.local.secret or "") for b, p in zip(self.local.brokers, peers)]

    def __getitem__(self, i: int) -> Member:
        return self.members[i]

    def __iter__(self):
        return iter(self.members)

    @property
    def secret(self) -> str:
        return self.local.secret or ""

    def start(self) -> TestCluster:
        self.local.start()
        self.wait_statuses({m.name: "up" for m in self.members})
        return self

    def stop(self) -> None:
        self.local.stop()

    def kill(self) -> None:
        self.local.kill()

    def wait_statuses(self, expected: dict[str, str], observers: Iterable[Member] | None = None,
                      timeout_s: float = CLUSTER_WAIT_S) -> float:
        """Wait until every observer (default: every running member) reports each broker in
        ``expected`` with that status; returns the seconds it took."""
        import time

        watchers = list(observers) if observers is not None else [
            m for m in self.members if m.local.proc is not None and m.local.proc.poll() is None]
        started = time.monotonic()

        views: dict[str, dict[str, str]] = {}

        def reached() -> bool:
            views.clear()
            views.update({m.name: m.cluster_view() for m in watchers})
            return all(v.get(n) == s for v in views.values() for n, s in expected.items())

        try:
            wait_for(f"brokers reach {expected}", reached, timeout_s, errors=(OSError, AssertionError))
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last views {views}") from None
        return time.monotonic() - started

    def leaders(self, topic: str) -> dict[int, str]:
        doc = self.members[0].http.get(f"/v1/topics/{topic}").json()
        return {p["partition"]: p["leader"] for p in doc["partitions"]}

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)
