"""Start and stop real broker processes on loopback: demo, bench, tests and
``make cluster``.

Each broker is ``python -m ring serve`` in its own process with its own data
directory, so what runs here is exactly what runs in production. Readiness is
``GET /v1/status`` answering 200; shutdown is SIGTERM (clean) or SIGKILL (crash),
always by the PID we started.

``LocalCluster`` is N such brokers named ``ring-0..N-1`` that gossip with each
other: each gets ``--peer-listen``, ``--seeds`` (every peer address) and the
cluster secret (through ``RING_CLUSTER_SECRET``, so it stays out of ``ps``).
``python -m ring.localcluster start|stop|status`` runs the fixed developer
cluster behind ``make cluster``: data in ``var/ring-N``, logs in
``var/ring-N.log``, PIDs in ``var/ring-N.pid``, client ports 9250/9260/9270
and peer ports 9251/9261/9271, the secret from ``RING_CLUSTER_SECRET`` or a
random one kept in ``var/cluster-secret``; ``start`` returns once every broker
answers ``/v1/status`` and sees the others up. ``stop`` signals only the PIDs
in those files, and only if they still run that broker.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_S = 30.0  # a cold start imports aiohttp/uvloop; seconds on a busy machine
STOP_TIMEOUT_S = 10.0


# Listening ports are picked from here up to the kernel's ephemeral range, not from it:
# a port the kernel hands out for a moment (bind to 0) may be given to some outgoing
# connection's local end before the broker binds it ("address already in use").
LISTEN_PORT_MIN = 10_000
_RECENT_PORTS_MAX = 4_096  # ports handed out lately in this process, not handed out again
_recent_ports: deque[int] = deque(maxlen=_RECENT_PORTS_MAX)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


# Processes that pick ports side by side (parallel test workers) each take their own
# slice of the range: "K/N" picks only from the K-th of N equal slices (K from 0), so
# one cannot pick a port another picked and has not bound yet.
PORT_SLICE_ENV = "RING_PORT_SLICE"


def _port_range() -> tuple[int, int]:
    """[low, high) of the ports ``free_port`` picks from."""
    low, high = LISTEN_PORT_MIN, _ephemeral_low()
    k, _, n = os.environ.get(PORT_SLICE_ENV, "").partition("/")
    if k.isdigit() and n.isdigit() and int(k) < int(n):
        width = (high - low) // int(n)
        low, high = low + int(k) * width, low + (int(k) + 1) * width
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, below the ephemeral range (in this process's slice of it,
    see ``PORT_SLICE_ENV``), and not handed out lately by this process."""
    low, high = _port_range()
    # Ports handed out lately are skipped while they leave most of the range free (a slice of it may
    # be narrower than the ports kept); the oldest of them are allowed again before that.
    recent = set(list(_recent_ports)[-((high - low) // 2):]) if high - low >= 2 else set()
    for _ in range(200 if high > low else 0):
        port = random.randrange(low, high)
        if port in recent:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _recent_ports.append(port)
        return port
    with socket.socket() as s:  # no room below the ephemeral range: take one from it
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LocalBroker:
    name: str
    data_dir: Path
    port: int
    host: str = "127.0.0.1"
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    proc: subprocess.Popen | None = None
    detach: bool = False  # its own session: outlives the launcher and its terminal's ^C
    prefix: list[str] = field(default_factory=list)  # run through this: ip netns exec NS, faketime +8d ...
    # What runs ring: this interpreter's ``-m ring`` unless given (another release's ``ring`` entry point).
    program: list[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            *self.prefix, *(self.program or [sys.executable, "-m", "ring"]), "serve",
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen", f"{self.host}:{self.port}",
            *self.args,
        ]

    def start(self, wait: bool = True) -> "LocalBroker":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path or (self.data_dir.parent / f"{self.name}.log"), "ab")
        env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
            stdin=subprocess.DEVNULL, start_new_session=self.detach,
        )
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see its log")
            try:
                with urllib.request.urlopen(self.url + "/v1/status", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready within {timeout_s} s")

    def stop(self) -> int | None:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: a crash. Whatever the page cache holds survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


# --- clusters -------------------------------------------------------------------

CLUSTER_SECRET_ENV = "RING_CLUSTER_SECRET"
# The developer cluster of `make cluster`: broker N listens for clients on
# 9250 + 10 N and for peers on the next port.
DEV_SIZE = 3
DEV_CLIENT_PORT = 9250
DEV_PORT_STEP = 10


@dataclass
class LocalCluster:
    """``size`` brokers ring-0.. under ``root`` that know each other as seeds.

    Ports default to free ones (tests); pass ``client_ports``/``peer_ports``
    for fixed addresses, and ``hosts`` for a listen host per broker (brokers
    that serve PolarStreams' API each need their own). ``brokers`` are
    ``LocalBroker``s (url, stop, kill ...).
    """

    root: Path
    size: int = 3
    host: str = "127.0.0.1"
    client_ports: list[int] | None = None
    peer_ports: list[int] | None = None
    kafka_ports: list[int] | None = None  # a Kafka listener per broker (None: none)
    secret: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    detach: bool = False
    hosts: list[str] | None = None
    brokers: list[LocalBroker] = field(init=False)

    def __post_init__(self) -> None:
        assert self.size >= 1
        self.root = Path(self.root)
        hosts = self.hosts or [self.host] * self.size
        clients = self.client_ports or [free_port(h) for h in hosts]
        peers = self.peer_ports or [free_port(h) for h in hosts]
        assert len(clients) == len(peers) == len(hosts) == self.size
        if self.secret is None:
            self.secret = secrets.token_hex(16)
        seeds = ",".join(f"{h}:{p}" for h, p in zip(hosts, peers))
        self.brokers = []
        for i, (host, port, peer) in enumerate(zip(hosts, clients, peers)):
            name = f"ring-{i}"
            flags = ["--peer-listen", f"{host}:{peer}", "--seeds", seeds]
            if self.kafka_ports is not None:
                flags += ["--kafka-listen", f"{host}:{self.kafka_ports[i]}"]
            self.brokers.append(LocalBroker(
                name, self.root / name, port, host=host, args=[*flags, *self.args],
                env={CLUSTER_SECRET_ENV: self.secret, **self.env},
                log_path=self.root / f"{name}.log", detach=self.detach))

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.brokers]

    def start(self, wait: bool = True) -> "LocalCluster":
        """Start every broker; with ``wait``, return once each answers and sees
        every other one up (so placement is the same everywhere)."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for b in self.brokers:
                b.start(wait=False)
            if wait:
                for b in self.brokers:
                    b.wait_ready()
                self.wait_joined()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_joined(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every broker's GET /v1/cluster lists all ``size`` brokers up."""
        import json

        deadline = time.monotonic() + timeout_s
        pending = list(self.brokers)
        while pending:
            b = pending[0]
            try:
                with urllib.request.urlopen(b.url + "/v1/cluster", timeout=2) as r:
                    doc = json.load(r)
                if sum(m.get("status") == "up" for m in doc.get("brokers", [])) >= self.size:
                    pending.pop(0)
                    continue
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    raise RuntimeError(f"{b.name} runs with --auth-tokens: start with wait=False "
                                       "and wait with a token (tests/secure_cluster.py does)") from None
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{b.name} does not see all {self.size} brokers up within {timeout_s} s")
            time.sleep(0.1)

    def stop(self) -> list[int | None]:
        """SIGTERM each broker and wait: exit codes, in order."""
        return [b.stop() for b in self.brokers]

    def kill(self) -> None:
        for b in self.brokers:
            b.kill()


# --- `make cluster`: the developer cluster, tracked by PID files ----------------------


def dev_secret(root: Path) -> str:
    """RING_CLUSTER_SECRET, else the one kept in root/cluster-secret (made on first use)."""
    if os.environ.get(CLUSTER_SECRET_ENV):
        return os.environ[CLUSTER_SECRET_ENV]
    path = root / "cluster-secret"
    if path.exists():
        return path.read_text().strip()
    root.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def dev_cluster(root: Path, size: int = DEV_SIZE, base_port: int = DEV_CLIENT_PORT) -> LocalCluster:
    """ring-N on client port base + 10N, its peer port one above and its Kafka listener two above."""
    clients = [base_port + DEV_PORT_STEP * i for i in range(size)]
    return LocalCluster(root, size, client_ports=clients, peer_ports=[p + 1 for p in clients],
                        kafka_ports=[p + 2 for p in clients], secret=dev_secret(root), detach=True)


def _pid_file(root: Path, name: str) -> Path:
    return root / f"{name}.pid"


def _running_pid(root: Path, name: str) -> int | None:
    """The PID in root/NAME.pid if that process still runs broker NAME."""
    try:
        pid = int(_pid_file(root, name).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return None  # not ours
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():  # a recycled PID must not be signalled
        argv = cmdline.read_bytes().split(b"\0")
        if b"serve" not in argv or name.encode() not in argv:
            return None
    return pid


def cluster_start(root: Path, size: int = DEV_SIZE, base_port: int = DEV_CLIENT_PORT) -> int:
    cluster = dev_cluster(root, size, base_port)
    running = [b.name for b in cluster.brokers if _running_pid(root, b.name)]
    if running:
        print(f"already running: {', '.join(running)} (make cluster-stop first)", file=sys.stderr)
        return 1
    try:
        cluster.start(wait=False)
        for b in cluster.brokers:
            assert b.proc is not None
            _pid_file(root, b.name).write_text(f"{b.proc.pid}\n")
        for b in cluster.brokers:
            b.wait_ready()
        cluster.wait_joined()
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"cluster did not start: {exc}", file=sys.stderr)
        for b in cluster.brokers:
            log = b.log_path.read_text(errors="replace").splitlines()[-5:] if b.log_path and b.log_path.exists() else []
            print(f"--- {b.log_path} (tail)\n" + "\n".join(log), file=sys.stderr)
        cluster_stop(root, size)
        return 1
    for b, peer, kafka in zip(cluster.brokers, cluster.peer_ports or [], cluster.kafka_ports or []):
        print(f"{b.name}  {b.url}  peer {cluster.host}:{peer}  kafka {cluster.host}:{kafka}  "
              f"pid {b.proc.pid if b.proc else '?'}  log {b.log_path}")
    print(f"brokers: {','.join(cluster.urls)}")
    print(f"kafka bootstrap.servers: {','.join(f'{cluster.host}:{k}' for k in cluster.kafka_ports or [])}")
    return 0


def cluster_stop(root: Path, size: int = DEV_SIZE) -> int:
    """SIGTERM the brokers named by root/ring-N.pid (only those), wait, remove the files."""
    for i in range(size):
        name = f"ring-{i}"
        pid = _running_pid(root, name)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline and _running_pid(root, name) == pid:
                time.sleep(0.05)
            if _running_pid(root, name) == pid:
                print(f"{name} (pid {pid}) ignored SIGTERM for {STOP_TIMEOUT_S:g} s; sending SIGKILL",
                      file=sys.stderr)
                os.kill(pid, signal.SIGKILL)
            print(f"{name} stopped (pid {pid})")
        _pid_file(root, name).unlink(missing_ok=True)
    return 0


def cluster_status(root: Path, size: int = DEV_SIZE, base_port: int = DEV_CLIENT_PORT) -> int:
    """One line per broker: PID, whether /v1/status answers. Exit 0 when all are up."""
    up = 0
    for i in range(size):
        name = f"ring-{i}"
        pid = _running_pid(root, name)
        url = f"http://127.0.0.1:{base_port + DEV_PORT_STEP * i}"
        try:
            with urllib.request.urlopen(url + "/v1/status", timeout=2) as r:
                answer = f"answers {r.status}"
                up += r.status == 200
        except OSError as exc:
            answer = f"no answer ({exc.__class__.__name__})"
        print(f"{name}  {url}  pid {pid or '-'}  {answer}")
    return 0 if up == size else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ring.localcluster",
                                description="Run the local developer cluster in the background.")
    p.add_argument("command", choices=["start", "stop", "status"])
    p.add_argument("--root", type=Path, default=Path("var"), help="data, logs and PID files (default ./var)")
    p.add_argument("--size", type=int, default=DEV_SIZE, help=f"brokers (default {DEV_SIZE})")
    p.add_argument("--base-port", type=int, default=DEV_CLIENT_PORT,
                   help=f"client port of ring-0; ring-N uses base + {DEV_PORT_STEP}N, peers the next port")
    args = p.parse_args(argv)
    if args.command == "start":
        return cluster_start(args.root, args.size, args.base_port)
    if args.command == "stop":
        return cluster_stop(args.root, args.size)
    return cluster_status(args.root, args.size, args.base_port)


if __name__ == "__main__":
    sys.exit(main())
