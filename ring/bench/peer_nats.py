"""NATS JetStream as a bench peer: three ``nats-server`` nodes on loopback,
routed to each other, JetStream with file storage in the run's root.

Each node gets a small config (client, cluster and monitoring ports, routes to
all three, a store directory); a node is ready when its monitoring port's
``/healthz`` answers 200, which in 2.9 means JetStream is up. Streams are
created by the load generator with ``num_replicas=3``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from ring.bench.system import ensure_packages, http_json, stop_pid
from ring.localcluster import free_port

NODES = 3
READY_S = 60.0


class NatsSystem:
    name = "nats"
    needs = {"nats-server": "nats-server"}
    python_modules = ("nats",)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client_ports = [free_port() for _ in range(NODES)]
        self.cluster_ports = [free_port() for _ in range(NODES)]
        self.monitor_ports = [free_port() for _ in range(NODES)]
        self.procs: list[subprocess.Popen] = []
        self.label = ""

    def install(self) -> str | None:
        return ensure_packages(self.needs)

    def _config(self, i: int) -> str:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_ports)
        store = self.root / f"n{i}"
        return (f"server_name: n{i}\nlisten: 127.0.0.1:{self.client_ports[i]}\n"
                f"http: 127.0.0.1:{self.monitor_ports[i]}\n"
                f'jetstream {{ store_dir: "{store}" }}\n'
                f"cluster {{ name: ringbench, listen: 127.0.0.1:{self.cluster_ports[i]}, routes: [{routes}] }}\n")

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(NODES):
                conf = self.root / f"n{i}.conf"
                conf.write_text(self._config(i))
                log = open(self.root / f"n{i}.log", "ab")
                self.procs.append(subprocess.Popen(["nats-server", "-c", str(conf)], stdout=log,
                                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                log.close()
            deadline = time.monotonic() + READY_S
            for i, port in enumerate(self.monitor_ports):
                while http_json(f"http://127.0.0.1:{port}/healthz")[0] != 200:
                    if self.procs[i].poll() is not None:
                        raise RuntimeError(f"nats-server n{i} exited with {self.procs[i].returncode}; "
                                           f"see {self.root / f'n{i}.log'}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nats-server n{i} not ready within {READY_S:g} s")
                    time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        version = subprocess.run(["nats-server", "--version"], capture_output=True, text=True).stdout.strip()
        self.label = f"NATS JetStream ({version}), {NODES} nodes, file storage, R{NODES}"

    def broker_pids(self) -> dict[str, list[int]]:
        return {f"n{i}": [p.pid] for i, p in enumerate(self.procs)}

    def target(self) -> dict[str, Any]:
        return {"servers": [f"nats://127.0.0.1:{p}" for p in self.client_ports], "replicas": NODES}

    def version(self) -> str:
        return self.label

    def stop(self) -> None:
        for p in self.procs:
            stop_pid(p)
