"""The generated section of docs/BENCHMARKS.md for one ``ring bench`` run:
command, machine, versions and settings, the comparison table, a peer's whole
configuration where it gives one (Apache Kafka's), targets,
resources, ceilings, the single-broker part, the hostile-input part, the profile, and every skipped
case or disturbed run, so a figure is never read without its conditions.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from ring.bench import report


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.machine()}, {os.cpu_count()} cores ({model or 'unknown CPU'}), {mem_gb:.0f} GiB RAM, "
            f"Linux {platform.release()}, Python {platform.python_version()}")


def _module_version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "not installed"


def _librdkafka() -> str:
    try:
        import confluent_kafka
    except ImportError:
        return ""
    return f" (librdkafka {confluent_kafka.libversion()[0]})"


def _client_counts(rows: list[dict[str, Any]], system: str) -> list[str]:
    """What the client library counted it sent, per produce run: requests and records per request."""
    runs = [r for r in rows if r["system"] == system and (r.get("client") or {}).get("produce_requests")]
    if not runs:
        return []
    return ["- records per ProduceRequest, as librdkafka counted them: " + ", ".join(
        f"{r['case']} {r['client']['records_per_produce_request']:.2f} ({r['client']['produce_requests']:,} requests)"
        for r in runs)]


def _ceilings(extra: dict[str, Any], ring_unbatched: float | None) -> list[str]:
    lines = ["| ceiling | figure |", "|---|---:|"]
    wrk = extra.get("wrk")
    if wrk:
        if wrk.get("skipped") or wrk.get("error"):
            lines.append(f"| wrk against ring's produce | {wrk.get('skipped') or wrk.get('error')} |")
        else:
            note = f", {wrk['non_2xx']} non-2xx" if wrk.get("non_2xx") else ""
            lines.append(f"| wrk, 1 record/request, quorum, to one leader (`{wrk['command']}`) | "
                         f"{wrk['req_s']:,.0f} req/s, p50 {wrk['p50_ms']} ms, p99 {wrk['p99_ms']} ms{note} |")
            if ring_unbatched:
                lines.append(f"| Python load generator / wrk, same request | {ring_unbatched / wrk['req_s']:.2f} |")
    disk = extra.get("disk")
    if disk:
        lines.append(f"| disk append, 100 KiB writes, one fsync at the end | {disk['append_100k']['mb_s']:,.0f} MB/s |")
        lines.append(f"| disk append, 100 KiB writes, fdatasync each | {disk['append_100k_fdatasync']['mb_s']:,.0f} MB/s |")
        lines.append(f"| disk append, 1 KiB writes, fdatasync each | "
                     f"{disk['append_1k_fdatasync']['writes_s']:,.0f} writes/s |")
    if extra.get("loopback_mb_s"):
        lines.append(f"| loopback TCP, one connection, 1 MiB sends | {extra['loopback_mb_s']:,.0f} MB/s |")
    return lines if len(lines) > 2 else []


def _profile(p: dict[str, Any]) -> list[str]:
    top = p["top"]
    lines = [f"py-spy, {top.get('samples', 0)} samples of ring-0 during an extra run of *{p['case']}* "
             f"({p.get('rec_s') or 0:,.0f} records/s while profiled); own time (top frame), then inclusive:", "",
             "| own | share | inclusive | share |", "|---|---:|---|---:|"]
    for (o, os_), (i, is_) in zip(top.get("own", []), top.get("inclusive", [])):
        lines.append(f"| `{o}` | {os_:.1%} | `{i}` | {is_:.1%} |")
    lines.append("")
    return lines


def markdown(bench: Any) -> str:
    summary = report.summarise(bench.rows)
    peers = [p for p in bench.peers if p in bench.systems]
    systems = ["ring", *peers]
    out = _settings(bench, systems)
    for n in bench.notes:
        out.append(f"- {n}")
    if bench.rows:  # the single and hostile parts alone have no comparison
        out += ["", *report.table(summary, bench.cases, peers), ""]
        for name, lines in (bench.extra.get("configs") or {}).items():
            if name in peers:
                out += [f"#### {report.NAMES[name]}: configuration", "", *lines, *_client_counts(bench.rows, name), ""]
        out += ["#### Targets", "", *report.target_lines(report.targets(summary)), ""]
        out += ["#### Resources", "", *report.resources(summary, systems, "produce-100-unkeyed-quorum",
                                                          bench.extra.get("idle_cores")), ""]
    else:
        out.append("")
    ring_unbatched = (summary.get(("produce-1-unkeyed-quorum", "ring")) or {}).get("rec_s")
    ceil = _ceilings(bench.extra, ring_unbatched)
    if ceil:
        out += ["#### Ceilings, same run", "", *ceil, ""]
    out += _extra_parts(bench)
    disturbed = [r for r in bench.rows if r.get("disturbed")]
    if disturbed:
        out.append(f"{len(disturbed)} of {len(bench.rows)} runs were disturbed (others' CPU, cores: "
                   + ", ".join(f"{r['case']}/{r['system']} {r['others_cores']:.2f}" for r in disturbed[:12])
                   + (" ..." if len(disturbed) > 12 else "") + ").")
    return "\n".join(out)


def _settings(bench: Any, systems: list[str]) -> list[str]:
    """What was run, where and how: the lines that open the report."""
    s = bench.settings
    out = [
        "### Latest run", "",
        f"- command: `{bench.args.command}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, took {bench.extra.get('seconds', 0):.0f} s",
        f"- machine: {machine()}",
    ]
    for name in systems:
        out.append(f"- {report.NAMES[name]}: {bench.versions.get(name, '')}")
    out += [
        f"- clients: aiohttp {_module_version('aiohttp')}, nats-py {_module_version('nats-py')}, "
        f"rstream {_module_version('rstream')}, confluent-kafka {_module_version('confluent-kafka')}"
        f"{_librdkafka()}, uvloop {_module_version('uvloop')}; one load-generator process per run",
        f"- load: 1 KiB clickstream records; {s.window} requests in flight at 1 record/request, "
        f"{s.window_batched} at 100/request; produce runs ≤ {s.produce_s:g} s, latency runs ≤ {s.latency_s:g} s; "
        f"{s.reps} repetition(s), interleaved; medians shown",
        f"- a run is *disturbed* when processes outside it used more than {report.stats.OTHERS_CORES_FLAG} "
        f"cores on average while it ran",
    ]
    return out


def _extra_parts(bench: Any) -> list[str]:
    """The report's parts measured only when asked for: CPU, profiles, single broker, hostile input, Spark."""
    out: list[str] = []
    if bench.extra.get("cpu", {}).get("rows"):
        from ring.bench import cpu

        out += ["#### CPU per request, same run", "", *cpu.explanation(), "", *cpu.table(bench.extra["cpu"]), ""]
    for p in bench.extra.get("profile") or []:
        out += ["#### Profile", "", *_profile(p), ""]
    if bench.extra.get("single"):
        from ring.bench import single

        text = single.report(bench.extra["single"], bench.args.command).splitlines()
        out += ["#### Single broker: stored batches and JSON", "", *text[1:], ""]
    if bench.extra.get("hostile"):
        from ring.bench import hostile

        out += ["#### Hostile input: broker memory and trickling clients", "", *hostile.report(bench.extra["hostile"]), ""]
    if bench.extra.get("members"):
        from ring.bench import members

        text = members.report(bench.extra["members"], bench.args.command).splitlines()
        out += ["#### One host, many members", "", *text, ""]
    if bench.extra.get("overload"):
        from ring.bench import overload

        out += ["#### Overload and quotas: one broker offered twice its maximum", "",
                *overload.report(bench.extra["overload"]), ""]
    if bench.extra.get("spark"):
        from ring.bench import spark

        text = spark.report(bench.extra["spark"], bench.args.command).splitlines()
        out += ["#### Spark: the ring source against a local file", "", *text[1:], ""]
    return out


def write(bench: Any, text: str) -> None:
    path: Path = bench.args.output
    png = path.with_name("benchmarks.png")
    summary = report.summarise(bench.rows)
    systems = ["ring", *[p for p in bench.peers if p in bench.systems]]
    written = report.plot(summary, bench.cases, systems, png)
    if written:
        text += f"\n\n![throughput and p99 latency per case]({png.name})"
        print(f"plot: {png}")
    else:
        print("plot skipped: matplotlib is not installed (pip install -e '.[bench]')")
    report.write_section(path, text)
    print(f"wrote {path}")
