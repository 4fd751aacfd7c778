"""Running the commands of README.md and docs/ as a reader would, for the tests that keep them true.

A block a test runs sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``
in exactly one of those files (``section``), so a block may move from file to
file without its test changing. ``commands`` splits a shell block into the
commands a reader types (comments dropped, backslash continuations joined).
``Shell`` runs them one at a time like a reader's terminal: in one working
directory, each command seeing the variables the ones before it exported,
with the documented addresses (``localhost:9250`` ...) swapped for the test's
own ports. ``ring serve`` runs in the background, as in a terminal of its
own, and the next command waits until it answers. ``make cluster`` and
``make cluster-stop`` run their Makefile recipe (``python -m
ring.localcluster start|stop``) on free ports: ``make`` itself would
reinstall the shared virtualenv.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Callable

from ring import localcluster
from tests.support import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]

# The documented client ports of `make cluster` (ring-N on 9250 + 10N) and a lone broker's.
DOC_PORTS = (9250, 9260, 9270)
SECTION = re.compile(r"<!-- ([a-z0-9-]+):start -->\n(.*?)<!-- \1:end -->", re.S)


def sections() -> dict[str, tuple[Path, str]]:
    """Every marked block of README.md and docs/*.md: name -> (file, text)."""
    found: dict[str, tuple[Path, str]] = {}
    for path in DOCS:
        for m in SECTION.finditer(path.read_text()):
            assert m.group(1) not in found, f"block {m.group(1)!r} is marked in {found[m.group(1)][0]} and {path}"
            found[m.group(1)] = (path, m.group(2))
    return found


def section(name: str) -> str:
    """The text between the markers of block ``name``, wherever it lives."""
    found = sections().get(name)
    assert found, f"no file of README.md and docs/ has a block marked {name!r}"
    return found[1]


def code(name: str, language: str = "python") -> str:
    """The code of the one fenced block of block ``name``."""
    m = re.search(rf"```{language}\n(.*?)```", section(name), re.S)
    assert m, f"block {name!r} holds no {language} code"
    return m.group(1)


def commands(block: str) -> list[str]:
    """Shell commands of the fenced blocks, joining backslash continuations."""
    out, current = [], ""
    for line in block.splitlines():
        if line.startswith("```") or line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            out.append(current.strip())
            current = ""
    return out


def makefile_module(target: str) -> str:
    """What the one command of a Makefile target runs with Python: ``-m MODULE ARG``."""
    m = re.search(rf"^{re.escape(target)}:.*\n\t(.+)$", (REPO_ROOT / "Makefile").read_text(), re.M)
    assert m, f"the Makefile has no target {target}"
    run = re.search(r"\)(?:/python)? (-m [\w.]+(?: [\w-]+)?)$", m.group(1))
    assert run, f"make {target} runs {m.group(1)!r}, not a Python module"
    return run.group(1)


def free_base_port() -> int:
    """A client port P with P, P+1 (its peer port), P+2 (its Kafka listener), and the same at P+10 and
    P+20 free: the ports of `make cluster`'s brokers moved from 9250 to P."""
    for _ in range(100):
        base = localcluster.free_port()
        try:
            for offset in (0, 1, 2, 10, 11, 12, 20, 21, 22):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError("no free run of ports for a local cluster")


class Shell:
    """A reader's terminal: commands run one at a time in ``cwd``; exports carry over."""

    def __init__(self, cwd: Path, base_port: int | None = None, on_path: bool = True) -> None:
        """``on_path``: ``ring`` and ``python`` are the virtualenv's, as for a reader who took the tour."""
        self.cwd = cwd
        self.base = base_port if base_port is not None else free_base_port()
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.env.pop("RING_BROKERS", None)
        if on_path:
            self.env["PATH"] = f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{self.env['PATH']}"
        self.servers: list[tuple[subprocess.Popen, str]] = []
        if not (cwd / ".venv").exists():  # the tour puts .venv/bin on PATH
            (cwd / ".venv").symlink_to(REPO_ROOT / ".venv")

    def port(self, documented: int) -> int:
        return self.base + (documented - DOC_PORTS[0])

    def local(self, cmd: str) -> str:
        """The command with the documented addresses and `make` targets made this test's."""
        cmd = re.sub(r"(?:localhost|127\.0\.0\.1):(92[5-7]0)\b", lambda m: f"127.0.0.1:{self.port(int(m[1]))}", cmd)
        for target, extra in (("cluster", f" --base-port {self.base}"), ("cluster-stop", "")):
            if cmd == f"make {target}":
                return f"{shlex.quote(sys.executable)} {makefile_module(target)}{extra}"
        return cmd

    def run(self, cmd: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Run one documented command; its environment afterwards is the next command's."""
        local = self.local(cmd)
        if re.match(r"^(\S+/)?ring serve\b", local):
            return self._serve(local)
        with tempfile.NamedTemporaryFile(dir=self.cwd, prefix=".env-") as env_file:
            script = f"{local}\n__rc=$?\nenv -0 > {shlex.quote(env_file.name)}\nexit $__rc\n"
            done = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True,
                                  timeout=timeout_s)
            pairs = Path(env_file.name).read_bytes().split(b"\0")
        if check:
            assert done.returncode == 0, (cmd, local, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
        if pairs != [b""]:
            self.env = dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
        return done

    def _serve(self, cmd: str) -> subprocess.CompletedProcess:
        """``ring serve``, as in a terminal of its own: started, and waited for until it answers."""
        listen = re.search(r"--listen (\S+)", cmd)
        address = listen.group(1) if listen else f"127.0.0.1:{DOC_PORTS[0]}"
        tls = "--tls-cert" in cmd
        url = f"{'https' if tls else 'http'}://{address}/v1/status"
        log = open(self.cwd / f"serve-{len(self.servers)}.log", "wb")
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=self.cwd, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.servers.append((proc, url))
        context = ssl._create_unverified_context() if tls else None

        def answers() -> bool:
            assert proc.poll() is None, f"{cmd} exited with {proc.returncode}: {log.name}"
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                return r.status == 200

        wait_for(f"{cmd} answers {url}", answers, errors=(OSError,))
        return subprocess.CompletedProcess(cmd, 0, b"", b"")

    def stop_servers(self) -> list[int]:
        """SIGTERM every ``ring serve`` this shell started (a reader's Ctrl-C); their exit codes."""
        codes = []
        for proc, _ in self.servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                codes.append(proc.wait(timeout=30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        self.servers.clear()
        return codes

    def interrupt_when(self, cmd: str, ready: Callable[[bytes], bool], timeout_s: float = 60) -> tuple[int, bytes]:
        """Run a command that waits until Ctrl-C (``--follow``): SIGINT once its output satisfies
        ``ready``; its exit code and output."""
        out_path = self.cwd / ".follow.out"
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {self.local(cmd)}"], cwd=self.cwd, env=self.env,
                                    stdout=out, stderr=subprocess.PIPE)
            try:
                wait_for(f"{cmd} prints what it should", lambda: ready(out_path.read_bytes()), timeout_s=timeout_s)
                proc.send_signal(signal.SIGINT)
                code = proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return code, out_path.read_bytes()


def run_cluster_stop(shell: Shell) -> None:
    """`make cluster-stop` for a test that ends early: the brokers `make cluster` started stop."""
    shell.run("make cluster-stop", check=False)
