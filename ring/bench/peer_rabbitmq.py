"""RabbitMQ streams as a bench peer: three nodes on loopback joined into one
cluster, the stream plugin on.

Everything is private to the run's root: an epmd of our own on a free port
(``ERL_EPMD_PORT``, bound to 127.0.0.1), a shared ``HOME`` for the Erlang
cookie, per node a name ``rbN@localhost``, AMQP, distribution and stream
ports, a config file advertising the stream port on 127.0.0.1, and data and
logs under the root. Nodes start in parallel (each takes ~15 s); nodes 1 and
2 then ``join_cluster`` node 0. Schedulers do not busy-wait, so idle nodes do
not take CPU from whatever is being measured meanwhile. Streams are created by
the load generator with ``initial-cluster-size`` 3.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from ring.bench.system import ensure_packages, stop_pid
from ring.localcluster import free_port

NODES = 3
SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # not the /usr/sbin wrapper, which switches user
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
READY_S = 120.0
CTL_S = 90.0


class RabbitSystem:
    name = "rabbitmq"
    needs = {"rabbitmq-server": "rabbitmq-server", "epmd": "erlang-base"}
    python_modules = ("rstream",)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.epmd_port = free_port()
        self.amqp_ports = [free_port() for _ in range(NODES)]
        self.dist_ports = [free_port() for _ in range(NODES)]
        self.stream_ports = [free_port() for _ in range(NODES)]
        self.epmd: subprocess.Popen | None = None
        self.procs: list[subprocess.Popen] = []
        self.label = ""

    def install(self) -> str | None:
        return ensure_packages(self.needs)

    def node(self, i: int) -> str:
        return f"rb{i}@localhost"

    def _env(self, i: int) -> dict[str, str]:
        d = self.root / f"rb{i}"
        return {
            **os.environ,
            "HOME": str(self.root),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": self.node(i),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.amqp_ports[i]),
            "RABBITMQ_DIST_PORT": str(self.dist_ports[i]),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "pid"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+sbwt none +sbwtdcpu none +sbwtdio none",
        }

    def _write_files(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        cookie = self.root / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (self.root / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        (self.root / "rabbitmq-env.conf").write_text("")
        for i in range(NODES):
            d = self.root / f"rb{i}"
            (d / "log").mkdir(parents=True, exist_ok=True)
            (d / "advanced.config").write_text("[].\n")
            (d / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{self.amqp_ports[i]}\n"
                f"stream.listeners.tcp.default = 127.0.0.1:{self.stream_ports[i]}\n"
                "stream.advertised_host = 127.0.0.1\n"
                f"stream.advertised_port = {self.stream_ports[i]}\n"
                "log.console = false\n")

    def ctl(self, i: int, *args: str, timeout_s: float = CTL_S) -> None:
        r = subprocess.run([CTL, "-n", self.node(i), *args], env=self._env(i), capture_output=True,
                           text=True, timeout=timeout_s)
        if r.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.node(i)} {' '.join(args)}: {(r.stderr or r.stdout)[-400:]}")

    def start(self) -> None:
        self._write_files()
        try:
            self.epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         stdin=subprocess.DEVNULL)
            for i in range(NODES):
                log = open(self.root / f"rb{i}.log", "ab")
                self.procs.append(subprocess.Popen([SERVER], env=self._env(i), stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL))
                log.close()
            for i in range(NODES):
                # `wait` waits for the pid file (the node registered), then for the app
                self.ctl(i, "wait", str(self.root / f"rb{i}" / "pid"), "--timeout", str(int(READY_S)),
                         timeout_s=READY_S + 10)
            for i in range(1, NODES):
                self.ctl(i, "stop_app")
                self.ctl(i, "join_cluster", self.node(0))
                self.ctl(i, "start_app")
            for i in range(NODES):
                self._wait_port(self.stream_ports[i])
        except BaseException:
            self.stop()
            raise
        version = subprocess.run([CTL, "-n", self.node(0), "version"], env=self._env(0),
                                 capture_output=True, text=True).stdout.strip()
        self.label = f"RabbitMQ streams ({version}), {NODES} nodes, initial-cluster-size {NODES}"

    def _wait_port(self, port: int) -> None:
        deadline = time.monotonic() + READY_S
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"RabbitMQ stream port {port} not open within {READY_S:g} s") from None
                time.sleep(0.2)

    def broker_pids(self) -> dict[str, list[int]]:
        from ring.bench.procs import with_descendants

        return {f"rb{i}": with_descendants([p.pid]) for i, p in enumerate(self.procs)}

    def target(self) -> dict[str, Any]:
        return {"host": "127.0.0.1", "ports": self.stream_ports, "replicas": NODES}

    def version(self) -> str:
        return self.label

    def stop(self) -> None:
        # SIGTERM is a clean shutdown for the VM; its helper processes
        # (erl_child_setup, inet_gethost) exit with it.
        for p in self.procs:
            stop_pid(p)
        stop_pid(self.epmd)
