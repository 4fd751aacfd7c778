"""Network namespaces for chaos runs: one per broker, a hub with a bridge, iptables rules for partitions.

Each broker runs in its own namespace with one veth interface on a private
subnet (``SUBNET``.1, .2, .3); a hub namespace holds the bridge they hang on
(``SUBNET``.254) and runs the harness, so clients reach every broker and no
address, route or rule is ever added to the host's own network. A broker's
outgoing connections leave from its own address because it has no other, so
rules between two brokers need no change in ring.

A partition is a DROP rule in the receiving broker's namespace, in a chain of
our own (``CHAOS``) that INPUT jumps to: ``block(a, b)`` drops every packet
from a that belongs to a connection a opened (``-m conntrack --ctdir
ORIGINAL``): new connections from a to b hang, the ones a already had stop
delivering, while connections b opens to a keep working both ways. That is a
one-way partition (a cannot reach b); both directions make a full one.
Conntrack is switched on in each namespace when it is made (a no-op rule), so
it knows which side opened every connection from the start; dropping one
direction of a connection without it breaks TCP both ways.

Namespaces are named ``ringchaos-<pid>-...`` after the process that made
them. ``destroy`` SIGKILLs the processes still inside them (``ip netns
pids``: only ours run there) and deletes them; ``remove_stale`` deletes the
ones whose maker is gone (a run killed before it could clean up).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

SUBNET = "10.231.0"  # exists only inside our namespaces
HUB_ADDRESS = f"{SUBNET}.254"
PREFIX = "ringchaos-"
CHAIN = "CHAOS"
COMMAND_TIMEOUT_S = 10.0
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y iproute2 iptables)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run("ip", "netns", "add", probe)
        try:
            _run("ip", "netns", "exec", probe, "iptables", "-A", "INPUT", "-m", "conntrack",
                 "--ctdir", "ORIGINAL", "-s", "10.0.0.1", "-j", "DROP")
        finally:
            _run("ip", "netns", "del", probe, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a namespace with conntrack rules: {exc}"
    return None


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


class Namespaces:
    """``size`` broker namespaces and a hub, made by ``create`` and removed by ``destroy``."""

    def __init__(self, size: int = 3, owner: int | None = None, names: list[str] | None = None) -> None:
        owner = os.getpid() if owner is None else owner
        self.hub = f"{PREFIX}{owner}-hub"
        self.brokers = names or [f"{PREFIX}{owner}-b{i}" for i in range(size)]
        self.created = False

    @classmethod
    def existing(cls, hub: str, brokers: list[str]) -> Namespaces:
        """Namespaces another process made (the harness inside the hub uses its parent's)."""
        ns = cls(len(brokers), names=list(brokers))
        ns.hub, ns.created = hub, False
        return ns

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def prefix(self, i: int | None) -> list[str]:
        """Command prefix that runs a program in broker i's namespace (None: the hub)."""
        return ["ip", "netns", "exec", self.hub if i is None else self.brokers[i]]

    def create(self) -> Namespaces:
        self.created = True  # from the first command on, destroy has something to undo
        hub = self.hub
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "set", "lo", "up")
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.brokers):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", hub, "link", "set", f"v{i}", "master", "br0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            ipt = [*self.prefix(i), "iptables"]
            _run(*ipt, "-N", CHAIN)
            _run(*ipt, "-A", "INPUT", "-j", CHAIN)
            # Conntrack on from the start (this rule matches nothing it would not accept anyway).
            _run(*ipt, "-A", "INPUT", "-m", "conntrack", "--ctstate", "INVALID,UNTRACKED", "-j", "ACCEPT")
        return self

    def block(self, src: int, dst: int) -> None:
        """Broker ``src`` can no longer reach broker ``dst`` (connections it opens to dst go dark)."""
        assert src != dst
        _run(*self.prefix(dst), "iptables", "-A", CHAIN, "-s", self.address(src),
             "-m", "conntrack", "--ctdir", "ORIGINAL", "-j", "DROP")

    def heal(self) -> None:
        for i in range(len(self.brokers)):
            _run(*self.prefix(i), "iptables", "-F", CHAIN)

    def rules(self, i: int) -> str:
        return _run(*self.prefix(i), "iptables", "-S", CHAIN)

    def destroy(self) -> None:
        """SIGKILL whatever still runs inside (brokers we started, by PID), then delete every namespace."""
        if not self.created:
            return
        for ns in [*self.brokers, self.hub]:
            _kill_inside(ns)
            _run("ip", "netns", "del", ns, check=False)
        self.created = False

    def __enter__(self) -> Namespaces:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _kill_inside(ns: str) -> None:
    pids = [int(p) for p in _run("ip", "netns", "pids", ns, check=False).split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return "Z"


def remove_stale() -> list[str]:
    """Delete namespaces of ours whose maker no longer runs; the names removed."""
    if shutil.which("ip") is None:
        return []
    removed = []
    for line in _run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        _kill_inside(name)
        _run("ip", "netns", "del", name, check=False)
        removed.append(name)
    return removed
