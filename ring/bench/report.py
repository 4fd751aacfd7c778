"""From run rows to what a reader sees: medians per case and system, the one
comparison table (ring, each peer, and ring's ratio to it), the targets
checked against it, the Markdown section written into docs/BENCHMARKS.md
between its markers, and the plot.

Rows are dicts, one per load-generator run: ``case``, ``system``, ``ok``,
``rec_s``, ``lat`` (p50/p99/p999 ms), ``rss_peak_mb``, ``cpu_us_per_rec``,
``others_cores``, ``disturbed``. Everything here but ``plot`` is pure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ring.bench import stats
from ring.bench.cases import Case

BEGIN = "<!-- ring bench: begin (generated; `ring bench --output` rewrites what is between these markers) -->"
END = "<!-- ring bench: end -->"
NAMES = {"ring": "ring", "nats": "NATS JetStream", "rabbitmq": "RabbitMQ streams", "kafka": "Apache Kafka"}
SHORT = {"ring": "ring", "nats": "NATS", "rabbitmq": "RabbitMQ", "kafka": "Kafka"}


def summarise(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Medians over the repetitions of each (case, system)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["case"], r["system"]), []).append(r)
    out = {}
    for key, runs in groups.items():
        ok = [r for r in runs if r.get("ok")]
        lat = [r.get("lat") or {} for r in ok]
        out[key] = {
            "runs": len(runs),
            "ok": len(ok),
            "disturbed": sum(1 for r in runs if r.get("disturbed")),
            "rec_s": stats.median(r.get("rec_s") for r in ok),
            "p50": stats.median(x.get("p50") for x in lat),
            "p99": stats.median(x.get("p99") for x in lat),
            "p999": stats.median(x.get("p999") for x in lat),
            "cpu_us_per_rec": stats.median(r.get("cpu_us_per_rec") for r in ok),
            "rss_peak_mb": max((r.get("rss_peak_mb") or 0 for r in runs), default=0) or None,
            "errors": sum(r.get("errors") or 0 for r in runs),
            "error": next((r.get("error") for r in runs if r.get("error")), ""),
        }
    return out


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "–"
    if unit == "ms":
        return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}"
    if unit == "x":
        return f"{v:.2f}×"
    return f"{v:,.0f}"


def flags(s: dict[str, Any] | None) -> str:
    """What to say beside a figure: disturbed, failed and erring runs of it."""
    if not s:
        return ""
    out = []
    if s["disturbed"]:
        out.append(f"{s['disturbed']}/{s['runs']} disturbed")
    if s["ok"] < s["runs"]:
        out.append(f"{s['runs'] - s['ok']} failed")
    if s["errors"]:
        out.append(f"{s['errors']} errors")
    return ", ".join(out)


def table(summary: dict[tuple[str, str], dict[str, Any]], cases: list[Case], peers: list[str]) -> list[str]:
    """One Markdown table: a row per case and metric; ring, each peer, and ring/peer.
    For latency and CPU rows the ratio is ring/peer too, so below 1 is better there.
    Broker CPU per record is every node's CPU seconds over the records acknowledged (or read)."""
    head = ["case", "metric", "ring"]
    for p in peers:
        head += [SHORT[p], f"ring/{SHORT[p]}"]
    head.append("notes")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (1 + 2 * len(peers)) + "---|"]
    for case in cases:
        if case.metric == "rec_s":
            metrics = [("records/s", "rec_s", "")]
            if case.op == "produce":
                metrics.append(("p99 ms, loaded", "p99", "ms"))
            metrics.append(("broker CPU µs/record", "cpu_us_per_rec", "ms"))
        else:
            metrics = [(f"{q} ms", q, "ms") for q in ("p50", "p99", "p999")]
        mine = summary.get((case.id, "ring"))
        if mine is None:
            continue
        for i, (label, key, unit) in enumerate(metrics):
            cells = [case.label if i == 0 else "", label, _num(mine[key], unit)]
            notes = [flags(mine)] if i == 0 else []
            for p in peers:
                theirs = summary.get((case.id, p)) if case.peers else None
                cells += [_num(theirs[key], unit) if theirs else "", _num(stats.ratio(mine[key], theirs[key]), "x")
                          if theirs else ""]
                if i == 0 and theirs and flags(theirs):
                    notes.append(f"{SHORT[p]}: {flags(theirs)}")
            cells.append("; ".join(n for n in notes if n))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def resources(summary: dict[tuple[str, str], dict[str, Any]], systems: list[str], case_id: str,
              idle_cores: dict[str, float] | None = None) -> list[str]:
    """Per system: peak RSS of its largest broker, broker CPU per record
    (all brokers' CPU seconds over records acknowledged), CPU while idle."""
    idle_cores = idle_cores or {}
    lines = ["| system | broker RSS peak, MB (largest node, any run) | broker CPU per record, µs, all nodes "
             f"({case_id}) | idle CPU, cores, all nodes |", "|---|---:|---:|---:|"]
    for s in systems:
        peak = max((v["rss_peak_mb"] or 0 for (c, sys_), v in summary.items() if sys_ == s), default=0)
        per = (summary.get((case_id, s)) or {}).get("cpu_us_per_rec")
        idle = idle_cores.get(s)
        lines.append(f"| {NAMES[s]} | {peak:,.0f} | {_num(per, 'ms')} | {'–' if idle is None else f'{idle:.3f}'} |")
    return lines


def targets(summary: dict[tuple[str, str], dict[str, Any]]) -> list[tuple[str, str, bool | None]]:
    """(target, figure, met) for each target the run can speak to."""
    def get(case: str, system: str, key: str) -> float | None:
        return (summary.get((case, system)) or {}).get(key)

    out: list[tuple[str, str, bool | None]] = []
    r = stats.ratio(get("produce-100-unkeyed-quorum", "ring", "rec_s"),
                    get("produce-100-unkeyed-quorum", "rabbitmq", "rec_s"))
    out.append(("batched (100/request) quorum produce ≥ 1.5× RabbitMQ streams R3", _num(r, "x"), stats.meets(r, 1.5)))
    r = stats.ratio(get("produce-1-unkeyed-quorum", "ring", "rec_s"), get("produce-1-unkeyed-quorum", "nats", "rec_s"))
    out.append(("unbatched quorum produce ≥ 1.0× NATS JetStream R3", _num(r, "x"), stats.meets(r, 1.0)))
    r = stats.ratio(get("consume-fetch", "ring", "rec_s"), get("produce-100-unkeyed-quorum", "ring", "rec_s"))
    out.append(("consume ≥ 2× ring's (batched quorum) produce", _num(r, "x"), stats.meets(r, 2.0)))
    r = stats.ratio(get("consume-fetch", "ring", "rec_s"), get("consume-fetch", "rabbitmq", "rec_s"))
    out.append(("consume ≥ 1.0× RabbitMQ streams", _num(r, "x"), stats.meets(r, 1.0)))
    mine, theirs = get("latency-one-1", "ring", "p99"), get("latency-one-1", "nats", "p99")
    out.append(("p99 quorum produce latency, one in flight ≤ NATS's",
                f"{_num(mine, 'ms')} ms vs {_num(theirs, 'ms')} ms",
                None if mine is None or theirs is None else mine <= theirs))
    for rpr in (1, 100):
        v = get(f"latency-half-{rpr}", "ring", "p99")
        out.append((f"p99 at half max load ({rpr}/request) < 20 ms", f"{_num(v, 'ms')} ms", stats.meets(v, 20.0, False)))
    for case, what in (("produce-1-unkeyed-quorum", "unbatched quorum produce"),
                       ("produce-100-unkeyed-quorum", "batched (100/request) quorum produce"),
                       ("consume-fetch", "consume")):
        r = stats.ratio(get(case, "ring", "rec_s"), get(case, "kafka", "rec_s"))
        out.append((f"{what} ≥ 1.0× Apache Kafka, records/s", _num(r, "x"), stats.meets(r, 1.0)))
        r = stats.ratio(get(case, "ring", "cpu_us_per_rec"), get(case, "kafka", "cpu_us_per_rec"))
        out.append((f"{what}: broker CPU per record ≤ Apache Kafka's", _num(r, "x"), stats.meets(r, 1.0, False)))
    peak = max((v["rss_peak_mb"] or 0 for (c, s), v in summary.items() if s == "ring"), default=None) or None
    out.append(("broker RSS ≤ 150 MB", f"{_num(peak)} MB", stats.meets(peak, 150.0, False)))
    return out


def target_lines(items: list[tuple[str, str, bool | None]]) -> list[str]:
    lines = ["| target | figure | met |", "|---|---:|---|"]
    for name, fig, met in items:
        lines.append(f"| {name} | {fig} | {'–' if met is None else 'yes' if met else 'NO'} |")
    return lines


def replace_section(doc: str, section: str) -> str:
    """The document with the generated section between the markers replaced
    (appended, with markers, when it has none)."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}"
    if BEGIN in doc and END in doc and doc.index(BEGIN) < doc.index(END):
        return doc[: doc.index(BEGIN)] + block + doc[doc.index(END) + len(END):]
    return doc.rstrip() + "\n\n" + block + "\n"


def write_section(path: Path, section: str) -> None:
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    path.write_text(replace_section(doc, section))


def plot(summary: dict[tuple[str, str], dict[str, Any]], cases: list[Case], systems: list[str], path: Path) -> str | None:
    """Throughput and p99 latency per case and system as a PNG; None when
    matplotlib is missing (the ``bench`` extra), else the path written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    thr = [c for c in cases if c.metric == "rec_s" and (c.id, "ring") in summary]
    lat = [c for c in cases if (c.metric == "latency" or c.op == "produce") and (c.id, "ring") in summary]
    fig, axes = plt.subplots(2, 1, figsize=(13, 10))
    width = 0.8 / max(1, len(systems))
    for ax, chosen, key, title in ((axes[0], thr, "rec_s", "throughput, records/s (median)"),
                                   (axes[1], lat, "p99", "p99 latency, ms (median of runs)")):
        for j, s in enumerate(systems):
            xs, ys = [], []
            for i, c in enumerate(chosen):
                v = (summary.get((c.id, s)) or {}).get(key)
                if v:
                    xs.append(i + j * width)
                    ys.append(v)
            ax.bar(xs, ys, width, label=NAMES[s])
        ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(chosen))])
        ax.set_xticklabels([c.label for c in chosen], rotation=40, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)
