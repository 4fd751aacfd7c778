"""The results of chaos runs as Markdown: the table in docs/RELIABILITY.md and the anomalies behind it.

``render`` makes one row per run (scenario x consistency level) with the
checker's counts, then lists the examples the checker kept for every
anomaly, the fault events of runs that lost data, and run errors. ``update_doc``
replaces what lies between the two markers in the document and leaves the
rest (the hand-written explanation) alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BEGIN = "<!-- chaos-results:begin (written by `make chaos`; edit outside these markers) -->"
END = "<!-- chaos-results:end -->"

COLUMNS = [
    ("attempted", "attempted"), ("acknowledged", "acked"), ("failed", "failed"), ("unknown", "unknown"),
    ("lost", "**lost**"), ("unexpected", "unexpected"), ("duplicated", "dup"), ("recovered", "recovered"),
    ("inconsistent_offsets", "**inconsistent offsets**"), ("order_violations", "**order violations**"),
]
NEEDS_DRAIN = {"lost", "unexpected", "duplicated", "recovered", "inconsistent_offsets", "order_violations"}
LEVEL_ORDER = {"one": 0, "quorum": 1, "all": 2}


def _row(res: dict[str, Any]) -> str:
    r = res.get("report") or {}
    spec = res["spec"]
    drained = res.get("drained", False)
    cells = [spec["scenario"], spec["consistency"], res.get("network", "?")]
    for key, _ in COLUMNS:
        value = r.get(key)
        cells.append("–" if value is None or (key in NEEDS_DRAIN and not drained) else str(value))
    cells.append(f"{100 * r['availability']:.1f}%" if "availability" in r else "–")
    cells.append(f"{r['longest_outage_s']:.1f}" if "longest_outage_s" in r else "–")
    cells.append(str(r.get("divergent_partitions", "–")) if drained else "–")
    writable = (res.get("meta") or {}).get("writable_after_heal_s")
    cells.append("–" if not drained else ("never" if writable is None else f"{writable:.1f}"))
    notes = []
    for key, label in (("failed_but_read", "refused yet read"), ("vanished", "read then vanished"),
                       ("inconsistent_visible", "client-visible inconsistent offsets"),
                       ("drain_errors", "final reads failed"), ("starts_moved", "replica start offsets moved"),
                       ("stamped_off", "records stamped off the clock"),
                       ("timestamp_answers_changed", "offsets by timestamp changed")):
        if r.get(key):
            notes.append(f"{r[key]} {label}")
    if r.get("group_delivered") or r.get("committed_undelivered"):
        notes.append(f"group: {r['group_delivered']} delivered, {r.get('group_redelivered', 0)} twice, "
                     f"**{r.get('committed_undelivered', 0)} committed never delivered**")
    meta = res.get("meta") or {}
    if drained and meta.get("converge_s") is None:
        notes.append("replicas still differed at the end of the wait after healing")
    if meta.get("idempotent_producers"):
        notes.append("idempotent producers")
    if res.get("error"):
        notes.append("run error (see below)")
    cells.append("; ".join(notes))
    return "| " + " | ".join(cells) + " |"


def render(results: list[dict[str, Any]], command: str, date: str) -> str:
    results = sorted(results, key=lambda x: (x["spec"]["scenario"], LEVEL_ORDER.get(x["spec"]["consistency"], 9)))
    head = ["scenario", "consistency", "network", *(label for _, label in COLUMNS), "availability",
            "longest outage (s)", "divergent partitions", "writable after heal (s)", "notes"]
    lines = [f"Measured {date} with `{command}`.", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += [_row(r) for r in results]
    lines += ["", "Scenarios:", ""]
    seen = set()
    for res in results:
        name = res["spec"]["scenario"]
        if name not in seen:
            seen.add(name)
            lines.append(f"- `{name}`: {res.get('scenario', '')} (fsync {res.get('fsync', '?')}, "
                         f"{res.get('seconds', '?')} s of load)")
    details = _details(results)
    if details:
        lines += ["", "### What the checker found", "", *details]
    return "\n".join(lines) + "\n"


def _details(results: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for res in results:
        r = res.get("report") or {}
        examples = r.get("examples") or {}
        if not examples and not res.get("error"):
            continue
        spec = res["spec"]
        out.append(f"**{spec['scenario']} / {spec['consistency']}** (seed {spec['seed']}, artefacts "
                   f"`{spec['root']}`)")
        out.append("")
        if res.get("error"):
            out.append(f"- run error: `{res['error']}`")
        for kind, shown in sorted(examples.items()):
            for text in shown:
                out.append(f"- {kind}: {text}")
        if r.get("lost") or r.get("inconsistent_offsets") or r.get("order_violations") or \
                r.get("committed_undelivered"):
            out.append("- fault events: " + "; ".join(f"{t:.1f}s {what}" for t, what in res.get("events", [])
                                                      if not what.startswith("run error")))
        out.append("")
    return out


def update_doc(path: Path, section: str) -> None:
    """Put ``section`` between the markers of the document (appending markers if it has none)."""
    text = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n\n{section}\n{END}"
    if BEGIN in text and END in text:
        before, _, rest = text.partition(BEGIN)
        _, _, after = rest.partition(END)
        text = before + block + after
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    path.write_text(text)
