"""The systems a bench run starts and measures: ring here, the peers in
``peer_nats``, ``peer_rabbitmq`` and ``peer_kafka``. Each is started on loopback under a
temporary root, knows the PIDs of its server processes (for CPU and RSS), the
target a load generator connects to, its version, and stops every process it
started, by PID, even after a failed start.

Also the one place that installs what a peer needs with apt-get (``apt-get
update`` once per run, and only when something is missing).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from ring import __version__
from ring.localcluster import LocalBroker, LocalCluster, free_port

CLUSTER_FORM_S = 60.0
STOP_WAIT_S = 15.0
_apt_updated = False


def ensure_packages(binaries: dict[str, str]) -> str | None:
    """Install the Debian packages whose binaries are missing ({binary: package});
    None when all are there afterwards, else why not."""
    global _apt_updated
    missing = {pkg for binary, pkg in binaries.items() if shutil.which(binary) is None}
    if not missing:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{', '.join(sorted(missing))} not installed and apt-get is not usable here"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    try:
        if not _apt_updated:
            subprocess.run(["apt-get", "update", "-q", *lock], env=env, check=True, capture_output=True, timeout=600)
            _apt_updated = True
        subprocess.run(["apt-get", "install", "-y", "-q", *lock, *sorted(missing)], env=env, check=True,
                       capture_output=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as exc:
        tail = getattr(exc, "stderr", b"") or b""
        return f"apt-get install {' '.join(sorted(missing))} failed: {exc} {tail[-300:].decode(errors='replace')}"
    still = [b for b in binaries if shutil.which(b) is None]
    return f"still missing after apt-get: {', '.join(still)}" if still else None


def stop_pid(proc: subprocess.Popen | None, timeout_s: float = STOP_WAIT_S) -> None:
    """SIGTERM a process we started, SIGKILL if it does not go."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def http_json(url: str, timeout_s: float = 2.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, orjson.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None


class RingSystem:
    """``brokers`` brokers (three by default) with RF equal to their number; one broker when
    asked for one, labelled so in every figure."""

    name = "ring"

    def __init__(self, root: Path, brokers: int = 3, fsync: str = "interval:1000", partitions: int = 3) -> None:
        self.root = root
        self.want = brokers
        self.fsync = fsync
        self.partitions = partitions
        self.cluster: LocalCluster | None = None
        self.single: LocalBroker | None = None
        self.label = ""

    @property
    def clustered(self) -> bool:
        return self.cluster is not None

    def start(self) -> None:
        args = ["--fsync", self.fsync, "--log-level", "warning"]
        if self.want > 1:
            self.cluster = LocalCluster(self.root, self.want, args=args)
            self.cluster.start()
            self._wait_formed()
            self.label = f"ring {__version__}, {self.want} brokers, RF {self.want}"
        else:
            self.single = LocalBroker("ring-0", self.root / "ring-0", free_port(), args=args,
                                      log_path=self.root / "ring-0.log")
            self.single.start()
            self.label = f"ring {__version__}, 1 broker, RF 1"

    def _wait_formed(self) -> None:
        """Every broker sees every broker up."""
        assert self.cluster is not None
        deadline = time.monotonic() + CLUSTER_FORM_S
        while time.monotonic() < deadline:
            ups = []
            for url in self.cluster.urls:
                status, doc = http_json(url + "/v1/cluster")
                ups.append(status == 200 and sum(b.get("status") == "up" for b in doc["brokers"]) == self.want)
            if all(ups):
                return
            time.sleep(0.2)
        raise TimeoutError(f"the {self.want} ring brokers did not see each other within {CLUSTER_FORM_S:g} s")

    @property
    def urls(self) -> list[str]:
        if self.cluster is not None:
            return self.cluster.urls
        return [self.single.url] if self.single is not None else []

    def broker_pids(self) -> dict[str, list[int]]:
        brokers = self.cluster.brokers if self.cluster is not None else [self.single] if self.single else []
        return {b.name: [b.proc.pid] for b in brokers if b.proc is not None}

    def target(self) -> dict[str, Any]:
        return {"urls": self.urls, "partitions": self.partitions,
                "replication_factor": self.want if self.clustered else 1}

    def version(self) -> str:
        return self.label

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.single is not None:
            self.single.stop()
