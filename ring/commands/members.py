"""One host's members: ``ring serve --members N`` runs N brokers on this host, each its own process.

A broker is one Python process and uses one core; a host runs one member per
core. The supervisor (this process) starts each member as ``ring serve``
with the host's own flags plus what makes it a member of its own:

* its name: the host's ``--name`` must end in an ordinal ``NAME-<k>``;
  member i of N is ``NAME-<k*N+i>``, so hosts 0, 1, 2 ... with N members
  each take ordinals 0..N-1, N..2N-1, ... and their ring tokens;
* its data directory: ``<--data-dir (or RING_DATA_DIR, or ./var)>/<member name>``;
* its ports: clients on ``--member-ports`` + 2i, peers on the next port
  (the base defaults to the ``--listen`` port + 10); topology-aware clients
  go to the member leading a partition through these;
* the host's one client port (``--listen``): every member accepts there too
  (SO_REUSEPORT), so curl or a Kubernetes Service keeps one address, and a
  member forwards what it does not lead;
* seeds: the host's ``--seeds`` plus every other member of the host; the
  cluster's secret as given (required with ``--seeds``), or, for the host's
  members alone, one made for this run;
* its host label: every member gossips the same ``--host`` (the machine's
  hostname by default), so placement keeps a partition's replicas on
  different hosts.

A member that exits on its own is started again (after MEMBER_RESTART_MS,
doubling while it keeps failing). SIGTERM or SIGINT is passed to every
member, each of which hands its partitions over and closes cleanly
(``ring serve``'s controlled shutdown); the supervisor exits 0 when every
member did.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ring import limits, logging_setup
from ring.clock import SystemClock
from ring.hashing import ordinal_from_name

log = logging.getLogger("ring.members")

# A member told to stop hands its partitions over (STOP_HANDOVER_MS_MAX), lets requests finish
# (SHUTDOWN_GRACE_S) and closes its logs; past this it is killed.
MEMBER_STOP_S_MAX = limits.STOP_HANDOVER_MS_MAX / 1000 + limits.SHUTDOWN_GRACE_S + 10.0


@dataclass(frozen=True)
class MemberProcess:
    name: str
    client_port: int
    peer_port: int
    argv: list[str]  # the whole command line, python included
    env: dict[str, str]  # its whole environment


def members_of(args: argparse.Namespace, argv: list[str]) -> list[MemberProcess]:
    """The members ``ring serve --members N`` runs, from its parsed flags and its command line ``argv``
    (``serve`` and its flags); ValueError when the flags cannot make members."""

    n = args.members
    ordinal = ordinal_from_name(args.name)
    if ordinal is None:
        raise ValueError(f"--members needs a --name ending in an ordinal (NAME-<k>), not {args.name!r}")
    for flag, given in (("--token", args.token is not None), ("--peer-listen", args.peer_listen is not None),
                        ("--polarstreams", args.polarstreams)):
        if given:
            raise ValueError(f"{flag} cannot be used with --members (each member gets its own)")
    host, port = args.listen  # (the command line's default filled in)
    if port == 0:
        raise ValueError("--members needs a fixed --listen port: every member of the host accepts on it")
    base = args.member_ports or port + 10
    if not 0 < base <= 65535 - 2 * n or base <= port < base + 2 * n:
        raise ValueError(f"--member-ports {base}: members need ports {base}..{base + 2 * n - 1}, free of --listen")
    prefix = args.name[: len(args.name) - len(str(ordinal))]
    names = [f"{prefix}{ordinal * n + i}" for i in range(n)]
    data = args.data_dir or Path(os.environ.get("RING_DATA_DIR") or "./var")
    local = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    peers = [f"[{local}]:{base + 2 * i + 1}" if ":" in local else f"{local}:{base + 2 * i + 1}" for i in range(n)]
    label = args.host_label or socket.gethostname()
    env = dict(os.environ)
    if not args.cluster_secret:
        if args.seeds:
            raise ValueError("--members with --seeds needs the cluster's secret (RING_CLUSTER_SECRET)")
        # The host's members alone are the cluster: they share a secret made for this run.
        env["RING_CLUSTER_SECRET"] = secrets.token_hex(16)
    out = []
    for i, name in enumerate(names):
        seeds = list(args.seeds) + [p for j, p in enumerate(peers) if j != i]
        own = ["--members", "1", "--name", name, "--listen", f"{_addr(host)}:{base + 2 * i}",
               "--peer-listen", f"{_addr(host)}:{base + 2 * i + 1}", "--data-dir", str(data / name),
               "--shared-port", str(port), "--seeds", ",".join(seeds), "--host", label]
        out.append(MemberProcess(name, base + 2 * i, base + 2 * i + 1, [sys.executable, "-m", "ring", *argv, *own], env))
    return out


def _addr(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run_members(args: argparse.Namespace) -> int:
    """``ring serve --members N``: run the members until SIGTERM/SIGINT; the exit code."""
    logging_setup.configure(args.log_level, args.log_format)
    try:
        members = members_of(args, args.serve_argv)
    except ValueError as exc:
        print(f"ring serve: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(Supervisor(members).run())


class Supervisor:
    def __init__(self, members: list[MemberProcess]) -> None:
        self.members = members
        self.clock = SystemClock()
        self.stop = asyncio.Event()
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        log.info("running %d members: %s", len(self.members), ", ".join(
            f"{m.name} (client port {m.client_port}, peer port {m.peer_port})" for m in self.members))
        codes = await asyncio.gather(*(self._keep(m) for m in self.members))
        failed = {m.name: c for m, c in zip(self.members, codes) if c != 0}
        if failed:
            log.error("members that did not stop cleanly: %s", failed)
        return 1 if failed else 0

    async def _keep(self, m: MemberProcess) -> int:
        """Run ``m``, starting it again whenever it exits on its own, until told to stop; its exit code."""
        delay_s = limits.MEMBER_RESTART_MS / 1000
        while True:
            started = self.clock.monotonic()
            proc = await asyncio.create_subprocess_exec(*m.argv, stdin=subprocess.DEVNULL, env=m.env)
            self.procs[m.name] = proc
            log.info("member %s started, pid %d", m.name, proc.pid)
            exited = asyncio.ensure_future(proc.wait())
            stopping = asyncio.ensure_future(self.stop.wait())
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if self.stop.is_set():
                exited.cancel()
                return await self._stop(m, proc)
            stopping.cancel()
            if self.clock.monotonic() - started >= limits.MEMBER_RESTART_RESET_S:
                delay_s = limits.MEMBER_RESTART_MS / 1000
            log.warning("member %s (pid %d) exited with %s; starting it again in %.1f s", m.name, proc.pid,
                        proc.returncode, delay_s)
            try:
                await asyncio.wait_for(self.stop.wait(), delay_s)
                return 0  # told to stop while it was down
            except TimeoutError:
                pass
            delay_s = min(2 * delay_s, limits.MEMBER_RESTART_MS_MAX / 1000)

    async def _stop(self, m: MemberProcess, proc: asyncio.subprocess.Process) -> int:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), MEMBER_STOP_S_MAX)
            except TimeoutError:
                log.error("member %s (pid %d) did not stop within %.0f s: killed", m.name, proc.pid,
                          MEMBER_STOP_S_MAX)
                proc.kill()
                await proc.wait()
        log.info("member %s stopped (exit %s)", m.name, proc.returncode)
        return proc.returncode if proc.returncode is not None else 1
