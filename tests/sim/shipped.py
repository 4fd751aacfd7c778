"""Shipped ring brokers in the simulated world: ``ring.cli.serve`` on the virtual loop and network.

Each broker is started the way ``ring serve`` starts it (``serve(config)``)
with its own configuration: a data directory under the run's root, its own
host (127.0.0.N) with the client and peer ports, every broker's peer address
as seeds, one cluster secret. It runs as its host's code on the
``VirtualLoop`` (``tests.sim.vloop``), so ``kill`` is a crash: its code stops
where it is and the network resets its connections. Its clock reads the
loop's virtual time and its random source is drawn from the loop's seeded one.

``restart`` starts a killed broker again, as a new incarnation of its host,
on the data directory it left: a crash that keeps the page cache (a SIGKILL)
keeps every byte written, and the crashed process's open files are closed
(its data directory's lock too). ``restart(name, wipe=True)`` starts it on an
empty directory instead: a disk lost. ``kill(name, power_loss=True)`` is a
power loss instead of a crash: every directory of its data directory goes
back to its entries at its last fsync, and every file is cut back to the
length it had at its last fsync (none: empty). While a virtual loop runs,
``os.fsync`` and ``os.fdatasync`` sync nothing on the machine's disk: they
record the length of the file (by inode, so a file renamed after its fsync
keeps it), or a directory's entries, which is what a power loss keeps
(``SyncedLengths``). ``fail_fsyncs(name)``
makes every fsync of a file in that broker's data directory fail (EIO), as
a disk going bad does, until ``fail_fsyncs(name, False)``; ``slow_fsyncs(name,
seconds)`` makes each one take that many virtual seconds (a slow disk): an
fsync in an executor thread (group commit's) is done that much later
(``VirtualLoop.stall``), and one on the event loop's own thread (a state
file's, the catalogue's) holds up the whole broker that long
(``VirtualLoop.hold``), until ``slow_fsyncs(name, 0)``. ``flip_batch_byte``
spoils one byte of a record batch's body in a stopped broker's segment file,
so that batch's CRC no longer matches (a bit flip on its disk). ``spare``
brokers are made but not started: ``join`` starts one (it joins the ring),
and ``retire`` stops a decommissioned one for good; ``members`` are the
brokers started and not retired, the ones a world asks and waits for.

``Client`` talks to the brokers' client API with aiohttp from its own host,
its bytes on the simulated network (``tests.sim.vnet``) like the brokers'.

Three reads in ``ring/`` escape the injected clock and random source; the world
routes them while a virtual loop runs: ``ring.http_api.server`` reads
``time.time()`` for the Date header of the client API's answers,
``ring.log.datadir`` draws a data directory's incarnation id from
``secrets.token_hex``, and ``ring.ranges`` asks the machine's disk how much is
free (``shutil.disk_usage``, gossiped in each broker's load): the simulated
disk has ``DISK_FREE_BYTES`` free. ``serve``'s ``gc.freeze()`` is skipped: many
brokers start and stop in one test process.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import gc
import os
import random
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from ring.config import BrokerConfig
from ring.log import batch as batchfmt
from ring.log.segment import LOG_SUFFIX
from ring.log.fsync import FsyncPolicy
from tests.sim.vloop import VirtualClock, VirtualLoop, running
from tests.sim.vnet import Network, VirtualTimeModule

CLIENT_PORT = 9250
PEER_PORT = 9251
SECRET = "simulated-cluster-secret"
CLIENT_HOST = "10.0.0.100"
TORN_ZEROS_MAX = 4096  # a torn write's zeroed tail: at most a page


class _VirtualSecrets:
    """The ``secrets`` module, drawing from the virtual loop's random source while one runs."""

    def token_hex(self, nbytes: int | None = None) -> str:
        loop = running()
        if loop is None:
            return secrets.token_hex(nbytes)
        return loop.rng.randbytes(nbytes or 32).hex()

    def __getattr__(self, name: str) -> Any:
        return getattr(secrets, name)


DISK_FREE_BYTES = 100 << 30


class _VirtualShutil:
    """The ``shutil`` module, whose ``disk_usage`` reports the simulated disk while a virtual loop runs."""

    def disk_usage(self, path: Any) -> Any:
        if running() is None:
            return shutil.disk_usage(path)
        return shutil._ntuple_diskusage(2 * DISK_FREE_BYTES, DISK_FREE_BYTES, DISK_FREE_BYTES)  # type: ignore

    def __getattr__(self, name: str) -> Any:
        return getattr(shutil, name)


class _VirtualGc:
    """The ``gc`` module, whose ``freeze`` does nothing while a virtual loop runs: ``serve`` freezes what
    startup built for the process's life, and a test process runs many brokers that come and go."""

    def freeze(self) -> None:
        if running() is None:
            gc.freeze()

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def seeds_from_env(name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds a test runs: ``{name}_SEED=S`` replays one, ``{name}_SEEDS=N`` sweeps 0 to N-1, else
    ``default``."""
    if os.environ.get(f"{name}_SEED"):
        return (int(os.environ[f"{name}_SEED"]),)
    if os.environ.get(f"{name}_SEEDS"):
        return tuple(range(int(os.environ[f"{name}_SEEDS"])))
    return default


def _route_escapes() -> None:
    import ring.cli
    import ring.http_api.server
    import ring.log.datadir
    import ring.ranges.copier
    import ring.ranges.manager

    SYNCED.install()
    ring.cli.gc = _VirtualGc()  # type: ignore[attr-defined]
    ring.http_api.server.time = VirtualTimeModule()  # type: ignore[attr-defined]
    ring.log.datadir.secrets = _VirtualSecrets()  # type: ignore[attr-defined]
    ring.ranges.manager.shutil = ring.ranges.copier.shutil = _VirtualShutil()  # type: ignore[attr-defined]


class ShippedCluster:
    """``size`` shipped brokers that seed each other, on ``loop`` and a network made here."""

    def __init__(self, loop: VirtualLoop, root: Path, size: int = 3, fsync: str = "always", spare: int = 0,
                 **config: Any) -> None:
        """``config``: more of every broker's ``BrokerConfig`` (``repair_interval_s=2``). ``spare`` more
        brokers are made but not started: each joins when ``join`` starts it."""
        _route_escapes()
        SYNCED.reset()  # a new world: nothing of an earlier one's files is durable here (their inodes are reused)
        self.loop = loop
        self.net = Network(loop)
        self.hosts = [f"127.0.0.{i + 1}" for i in range(size + spare)]
        seeds = tuple(f"{h}:{PEER_PORT}" for h in self.hosts[:size])
        self.configs = [BrokerConfig(name=f"ring-{i}", data_dir=root / f"ring-{i}", host=h, port=CLIENT_PORT,
                                     peer_host=h, peer_port=PEER_PORT, seeds=seeds, cluster_secret=SECRET,
                                     host_label=h, fsync=FsyncPolicy.parse(fsync), **config)
                        for i, h in enumerate(self.hosts)]
        self.names = [c.name for c in self.configs]
        self.members = self.names[:size]  # started and not retired: the brokers a world asks and waits for
        self.serving: dict[str, asyncio.Task] = {}
        self.clocks = {name: VirtualClock(loop) for name in self.names}  # each host's wall clock, kept over restarts

    def start(self) -> None:
        for name in self.members:
            self._serve(self.configs[self.names.index(name)])

    def join(self, name: str) -> None:
        """A spare broker starts (``serve``, as the others did), seeded with the first ones: it joins the
        ring, and partitions move to it."""
        assert name not in self.members and name not in self.serving, name
        self.members.append(name)
        self._serve(self.configs[self.names.index(name)])

    def retire(self, name: str) -> None:
        """A broker taken off the ring (decommissioned) stops for good: its code runs no more and the world
        no longer asks it or waits for it. Its data directory is left as it was."""
        self.members.remove(name)
        self.kill(name)

    def _serve(self, config: BrokerConfig) -> None:
        from ring.cli import serve

        rng = random.Random(self.loop.rng.getrandbits(64))
        self.serving[config.name] = self.loop.spawn(config.host, serve(config, clock=self.clocks[config.name], rng=rng))

    def host_of(self, name: str) -> str:
        return self.hosts[self.names.index(name)]

    def kill(self, name: str, power_loss: bool = False, torn: random.Random | None = None) -> list[str]:
        """The broker crashes: none of its code runs again, its connections are reset, and its open files
        are closed as the process's end closes them (so its data directory's lock is free). ``power_loss``:
        its machine loses power too, and its files what was not synced (the files cut are returned), or,
        ``torn``, writes are torn (``SyncedLengths.lose_power``)."""
        self.loop.kill(self.host_of(name))
        data_dir = self.configs[self.names.index(name)].data_dir
        _close_files_under(data_dir)
        return SYNCED.lose_power(data_dir, torn) if power_loss else []

    def restart(self, name: str, wipe: bool = False) -> None:
        """The killed broker starts again (``serve``, as at first) on its data directory, or, ``wipe``, on an
        empty one (its disk lost)."""
        config = self.configs[self.names.index(name)]
        if wipe:
            SYNCED.forget(config.data_dir)
            SYNCED.tracking = False
            try:
                shutil.rmtree(config.data_dir, ignore_errors=True)
            finally:
                SYNCED.tracking = True
        self.loop.revive(config.host)
        self._serve(config)

    def fail_fsyncs(self, name: str, failing: bool = True) -> None:
        """Every fsync of a file in ``name``'s data directory fails from now on (EIO), or again succeeds."""
        data_dir = self.configs[self.names.index(name)].data_dir
        (SYNCED.failing.add if failing else SYNCED.failing.discard)(str(data_dir.resolve()) + os.sep)

    def slow_fsyncs(self, name: str, seconds: float) -> None:
        """Every fsync of a file in ``name``'s data directory takes ``seconds`` virtual seconds from now on
        (0: again none)."""
        root = str(self.configs[self.names.index(name)].data_dir.resolve()) + os.sep
        if seconds > 0:
            SYNCED.slow[root] = seconds
        else:
            SYNCED.slow.pop(root, None)

    def flip_batch_byte(self, name: str, rng: random.Random) -> str | None:
        """One byte of a record batch's body (the bytes after its header, which its CRC covers) in one of the
        stopped broker ``name``'s segment files changed, both drawn from ``rng``: where (the file, relative
        to the data directory, and the byte), or None when it has no batch on disk."""
        data_dir = self.configs[self.names.index(name)].data_dir
        segments = sorted(p for p in (data_dir / "topics").glob(f"*/*/*{LOG_SUFFIX}") if p.stat().st_size)
        if not segments:
            return None
        path = rng.choice(segments)
        raw = path.read_bytes()
        bodies = []  # (first, end) of each whole batch's body
        pos = 0
        while pos + batchfmt.HEADER_SIZE <= len(raw):
            end = pos + 16 + int.from_bytes(raw[pos + 12:pos + 16], "big")
            if end > len(raw) or end <= pos + batchfmt.HEADER_SIZE:
                break
            bodies.append((pos + batchfmt.HEADER_SIZE, end))
            pos = end
        if not bodies:
            return None
        first, end = rng.choice(bodies)
        at = rng.randrange(first, end)
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(bytes([raw[at] ^ rng.randrange(1, 256)]))
        return f"{path.relative_to(data_dir)} byte {at}"

    def jump_clock(self, name: str, seconds: float) -> None:
        """``name``'s wall clock jumps by ``seconds`` (back when negative), as a clock stepped by hand or by a
        bad time server does; its monotonic time goes on."""
        self.clocks[name].offset_s += seconds

    def alive(self) -> list[str]:
        return [n for n in self.members if self.host_of(n) not in self.loop.dead]

    def check_serving(self) -> None:
        """A broker's ``serve`` that ended (an error at startup) fails the run with its exit code."""
        for name, task in self.serving.items():
            if task.done():
                raise AssertionError(f"{name}'s serve ended: {task.result()!r}")


Inode = tuple[int, int]  # (device, inode)


def _inode(st: os.stat_result) -> Inode:
    return st.st_dev, st.st_ino


class SyncedLengths:
    """What ``os.fsync`` and ``os.fdatasync`` made durable, while a virtual loop runs: each file's length
    at its last sync, by (device, inode), and each directory's entries at its last sync.

    A directory's entries (files and directories created, renamed into it, replaced or unlinked) are
    durable once the directory itself is synced, as POSIX has it: a power loss takes every directory
    under a broker's root back to its entries at its last sync (none: empty). An entry created since is
    gone; one replaced or unlinked since comes back as it was (the replaced or unlinked file is kept aside
    by a hard link, ``_keep``); a directory renamed away since is moved back."""

    def __init__(self) -> None:
        self.lengths: dict[Inode, int] = {}
        self.entries: dict[Inode, dict[str, Inode]] = {}  # directory -> its entries at its last sync
        self._named: dict[Inode, int] = {}  # inode -> how many synced directory entries name it
        self.ghosts: dict[Inode, str] = {}  # a file some synced entry names, replaced or unlinked since
        self._ghost_dir: str | None = None
        self.tracking = True  # off while the world itself changes files (a disk lost)
        self.failing: set[str] = set()  # data directories (with a trailing separator) whose fsyncs fail
        self.slow: dict[str, float] = {}  # data directories (likewise) whose fsyncs take virtual seconds
        self.real_fsync = os.fsync
        self.real_fdatasync = os.fdatasync
        self.real_replace = os.replace
        self.real_unlink, self.real_rmdir = os.unlink, os.rmdir

    def reset(self) -> None:
        """Forget every sync, and what was kept aside for the entries they named."""
        self.lengths.clear()
        self.entries.clear()
        self._named.clear()
        for ghost in self.ghosts.values():
            with contextlib.suppress(OSError):
                self.real_unlink(ghost)
        self.ghosts.clear()

    def install(self) -> None:
        """Route ``os``'s syncs and directory changes through here (each acts as before while no virtual
        loop runs)."""
        if os.fsync is not self.fsync:
            os.fsync, os.fdatasync = self.fsync, self.fdatasync  # type: ignore[assignment]
            os.replace = os.rename = self.replace  # type: ignore[assignment]
            os.unlink = os.remove = self.unlink  # type: ignore[assignment]
            os.rmdir = self.rmdir  # type: ignore[assignment]

    def sync(self, fd: int) -> None:
        if self.failing or self.slow:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if any(path.startswith(root) for root in self.failing):
                raise OSError(errno.EIO, f"simulated: the disk failed to sync {path}")
            loop = running()
            for root, seconds in self.slow.items():
                if path.startswith(root) and loop is not None:
                    # an executor thread's fsync holds up its work; one on the loop's thread, the whole host
                    loop.stall(seconds) if loop.in_executor else loop.hold(seconds)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self._synced_entries(_inode(st), {name: _inode(os.stat(name, dir_fd=fd, follow_symlinks=False))
                                              for name in os.listdir(fd)})
            return
        self.lengths[_inode(st)] = st.st_size

    def _synced_entries(self, directory: Inode, entries: dict[str, Inode] | None) -> None:
        for inode in self.entries.pop(directory, {}).values():
            self._named[inode] -= 1
        if entries is not None:
            self.entries[directory] = entries
            for inode in entries.values():
                self._named[inode] = self._named.get(inode, 0) + 1

    def fsync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if running() is None:
            return self.real_fsync(fd)
        self.sync(fd)

    def fdatasync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if running() is None:
            return self.real_fdatasync(fd)
        self.sync(fd)

    def _tracked(self, **dir_fds: Any) -> bool:
        return self.tracking and running() is not None and not any(v is not None for v in dir_fds.values())

    def _keep(self, path: Any) -> None:
        """Keep the file at ``path`` aside (a hard link) if some synced directory entry names it."""
        try:
            st = os.lstat(path)
        except OSError:
            return
        inode = _inode(st)
        if not stat.S_ISREG(st.st_mode) or inode in self.ghosts or not self._named.get(inode):
            return
        if self._ghost_dir is None:
            self._ghost_dir = tempfile.mkdtemp(prefix="ring-sim-ghosts-")
            atexit.register(shutil.rmtree, self._ghost_dir, True)
        ghost = os.path.join(self._ghost_dir, f"{inode[0]}-{inode[1]}")
        try:
            os.link(path, ghost)
        except OSError:
            return  # (another file system: the entry cannot come back, as if lost)
        self.ghosts[inode] = ghost

    def replace(self, src: Any, dst: Any, *, src_dir_fd: Any = None, dst_dir_fd: Any = None) -> None:
        """``os.replace``, and ``os.rename`` (the same on POSIX): a file it replaces is kept aside first."""
        if self._tracked(src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd):
            self._keep(dst)
        self.real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, path: Any, *, dir_fd: Any = None) -> None:
        if self._tracked(dir_fd=dir_fd):
            self._keep(path)
        self.real_unlink(path, dir_fd=dir_fd)

    def rmdir(self, path: Any, *, dir_fd: Any = None) -> None:
        try:
            inode = _inode(os.stat(path, dir_fd=dir_fd, follow_symlinks=False))
        except OSError:
            inode = None
        self.real_rmdir(path, dir_fd=dir_fd)
        if inode is not None:
            self._synced_entries(inode, None)  # (its inode may be another directory's next)

    def forget(self, root: Path) -> None:
        """``root`` is about to go (a disk lost): what its directories' last syncs named says nothing more."""
        for dirpath, _, _ in os.walk(root):
            self._synced_entries(_inode(os.lstat(dirpath)), None)

    def _entries_back(self, root: Path) -> list[str]:
        """Every directory under ``root`` back to its entries at its last sync; the entries changed."""
        where = {}  # the directories under root now, by inode (one renamed away may be moved back)
        for dirpath, dirnames, _ in os.walk(root):
            for name in dirnames:
                where[_inode(os.lstat(os.path.join(dirpath, name)))] = os.path.join(dirpath, name)
        changed: list[str] = []
        todo = [root]
        while todo:
            d = todo.pop()
            synced = self.entries.get(_inode(os.lstat(d)), {})
            now = {name: _inode(os.lstat(d / name)) for name in os.listdir(d)}
            for name in sorted(set(now) - set(synced)):  # created or renamed in since: gone
                _remove(d / name)
                changed.append(f"{(d / name).relative_to(root)} gone")
            for name, inode in sorted(synced.items()):
                if now.get(name) == inode:
                    continue
                if name in now:
                    _remove(d / name)
                moved = where.get(inode)
                if moved is not None and os.path.lexists(moved):
                    self.real_replace(moved, d / name)
                elif inode in self.ghosts:
                    os.link(self.ghosts[inode], d / name)
                else:
                    continue  # deleted whole: nothing to bring back
                changed.append(f"{(d / name).relative_to(root)} back")
            todo += [d / name for name in sorted(synced) if (d / name).is_dir() and not (d / name).is_symlink()]
        return changed

    def lose_power(self, root: Path, torn: random.Random | None = None) -> list[str]:
        """Every directory under ``root`` back to its synced entries (``_entries_back``), then every file
        back to its last synced length; what changed, relative to ``root``. ``torn``: writes torn instead,
        each drawn from it: a file keeps its synced bytes and some of what was written after them (none to
        all), and half of the files torn so have the last ``TORN_ZEROS_MAX`` bytes or fewer of what they
        kept zeroed (the size reached the disk, the data did not)."""
        self.tracking = False  # (what the power loss itself removes is not kept aside)
        try:
            cut = self._entries_back(root)
        finally:
            self.tracking = True
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            st = path.stat()
            keep = self.lengths.get(_inode(st), 0)
            if st.st_size <= keep:
                continue
            if torn is None:
                os.truncate(path, keep)
                cut.append(str(path.relative_to(root)))
                continue
            length = keep + torn.randrange(st.st_size - keep + 1)
            os.truncate(path, length)
            zeros = min(length - keep, torn.randrange(TORN_ZEROS_MAX + 1)) if torn.random() < 0.5 else 0
            if zeros:
                with open(path, "r+b") as f:
                    f.seek(length - zeros)
                    f.write(bytes(zeros))
            cut.append(f"{path.relative_to(root)} torn at {length} of {st.st_size}"
                       + (f", {zeros} zeroed" if zeros else ""))
        return cut


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


SYNCED = SyncedLengths()


def _close_files_under(root: Path) -> None:
    """Every file descriptor of this process open on a file under ``root`` now refers to /dev/null: the
    files are closed as a crashed process's are (its locks released), and the frozen objects that hold the
    numbers close /dev/null, not some later file, if they are ever collected."""
    prefix = str(root.resolve()) + os.sep
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                os.dup2(null, int(fd))
    finally:
        os.close(null)


class Reply:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)


class Client:
    """The client API of the brokers, from host ``CLIENT_HOST`` over the simulated network."""

    def __init__(self, cluster: ShippedCluster) -> None:
        self.cluster = cluster
        self.session: aiohttp.ClientSession | None = None

    async def request(self, name: str, method: str, path: str, timeout_s: float = 10.0, **kwargs: Any) -> Reply:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
        url = f"http://{self.cluster.host_of(name)}:{CLIENT_PORT}{path}"
        async with self.session.request(method, url, **kwargs) as r:
            return Reply(r.status, await r.read())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class Probes:
    """A world's questions to the brokers' client API, from ``CLIENT_HOST``, and its waits in virtual time."""

    def __init__(self, loop: VirtualLoop, cluster: ShippedCluster) -> None:
        self.loop = loop
        self.cluster = cluster
        self.client = Client(cluster)

    async def ask(self, name: str, method: str, path: str, **kwargs: Any) -> tuple[int, Any] | None:
        """The answer (status, json or None), or None for no answer."""
        try:
            r = await self.client.request(name, method, path, timeout_s=5.0, **kwargs)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None
        try:
            return r.status, r.json()
        except orjson.JSONDecodeError:
            return r.status, None

    async def all_up(self) -> bool:
        """Every member answers, and sees every member up (and any other broker it lists removed)."""
        members = self.cluster.members
        for name in members:
            got = await self.ask(name, "GET", "/v1/cluster")
            if got is None or got[0] != 200:
                return False
            seen = {b["name"]: b["status"] for b in got[1]["brokers"]}
            if {n: s for n, s in seen.items() if n in members} != {n: "up" for n in members}:
                return False
            if any(s != "removed" for n, s in seen.items() if n not in members):
                return False
        return True

    async def until(self, what: str, probe: Any, within_s: float) -> Any:
        """``probe()``'s first true answer, asked every 0.25 virtual s for at most ``within_s``."""
        deadline = self.loop.time() + within_s
        while self.loop.time() < deadline:
            self.cluster.check_serving()
            got = await probe()
            if got:
                return got
            await asyncio.sleep(0.25)
        raise AssertionError(f"{what}: not within {within_s} virtual s")
