"""Start and stop real broker processes on loopback: demo, bench, make cluster.

Each broker is ``python -m ring serve`` in its own process with its own data
directory, so what runs here is exactly what runs in production. Readiness is
``GET /v1/status`` answering 200; shutdown is SIGTERM (clean) or SIGKILL (crash),
always by the PID we started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_S = 30.0  # a cold start imports aiohttp/uvloop; seconds on a busy machine
STOP_TIMEOUT_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
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

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "ring", "serve",
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
            stdin=subprocess.DEVNULL,
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
