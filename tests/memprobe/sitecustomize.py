"""Memory probe for a broker process (``tests/rss_consume.py --probe``), active only with RING_MEMPROBE set.

Turns tracemalloc on at interpreter start and, on SIGUSR1, appends to
``<data-dir>/../<name>.memprobe``: the top Python allocation sites still
alive, glibc's malloc statistics (``mallinfo2``: heap in use, heap free but
kept, mmapped chunks) and ``/proc/self/smaps_rollup`` (anonymous against
file-backed resident pages). A diagnostic, never imported by ring itself.
"""

import os

if os.environ.get("RING_MEMPROBE"):
    import ctypes
    import signal
    import sys
    import tracemalloc

    tracemalloc.start(1)

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

    def _out_path() -> str:
        argv = sys.argv
        name = argv[argv.index("--name") + 1] if "--name" in argv else f"pid{os.getpid()}"
        data = argv[argv.index("--data-dir") + 1] if "--data-dir" in argv else "."
        return os.path.join(os.path.dirname(os.path.abspath(data)), f"{name}.memprobe")

    def _describe(obj) -> str:
        t = type(obj)
        name = f"{t.__module__}.{t.__qualname__}"
        if t is dict:
            return name + "{" + ",".join(map(str, list(obj)[:6])) + "}"
        if hasattr(obj, "f_code"):
            return f"frame {obj.f_code.co_filename}:{obj.f_lineno}"
        if hasattr(obj, "cr_code"):
            return f"coroutine {obj.cr_code.co_qualname}"
        return name

    def _big_holders(limit: int = 1 << 20) -> list:
        """Who holds the bytes objects over ``limit`` (chains of referrers, four levels up)."""
        import gc

        found = []
        for obj in gc.get_objects():
            sizes = [len(r) for r in gc.get_referents(obj) if type(r) in (bytes, bytearray) and len(r) > limit]
            if sizes:
                found.append((obj, sizes))
        mine = {id(found)} | {id(pair) for pair in found}
        out = []
        for obj, sizes in found[:20]:
            chain, cur, seen = [_describe(obj)], obj, set(mine)
            for _ in range(4):
                seen.add(id(cur))
                ups = [r for r in gc.get_referrers(cur) if id(r) not in seen and not hasattr(r, "f_code")]
                if not ups:
                    break
                cur = ups[0]
                chain.append(_describe(cur) + (f" (+{len(ups) - 1} more)" if len(ups) > 1 else ""))
            out.append(f"  big {[s >> 10 for s in sizes]} KiB held by " + " <- ".join(chain))
        return out

    def _dump(signum, frame) -> None:
        lines = []
        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("lineno")
        total = sum(s.size for s in stats)
        cur, peak = tracemalloc.get_traced_memory()
        lines.append(f"tracemalloc: live {total / 2**20:.1f} MiB, traced now {cur / 2**20:.1f} MiB, "
                     f"traced peak {peak / 2**20:.1f} MiB")
        for s in stats[:12]:
            lines.append(f"  {s.size / 2**20:8.2f} MiB {s.count:8d} blocks  {s.traceback[0]}")
        tracemalloc.reset_peak()
        lines.extend(_big_holders())
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _MallInfo2
            mi = libc.mallinfo2()
            lines.append(f"malloc: heap (arena) {mi.arena / 2**20:.1f} MiB, in use {mi.uordblks / 2**20:.1f} MiB, "
                         f"free but kept {mi.fordblks / 2**20:.1f} MiB, mmapped chunks {mi.hblks} = "
                         f"{mi.hblkhd / 2**20:.1f} MiB")
        except (OSError, AttributeError) as exc:
            lines.append(f"malloc: n/a ({exc})")
        try:
            with open("/proc/self/smaps_rollup") as f:
                keep = ("Rss", "Anonymous", "Shared_Clean", "Private_Clean", "Private_Dirty")
                lines.append("smaps: " + ", ".join(l.split(":")[0] + " " + l.split()[1] + " kB"
                                                  for l in f if l.split(":")[0] in keep))
        except OSError:
            pass
        with open(_out_path(), "a") as f:
            f.write("\n".join(lines) + "\n")

    signal.signal(signal.SIGUSR1, _dump)
