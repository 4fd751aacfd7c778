"""``python -m tests.chaos``: run chaos scenarios against real brokers and write docs/RELIABILITY.md.

``make chaos`` runs every scenario at every consistency level (one, quorum,
all) for its full duration and writes the table; ``--scenario``,
``--consistency``, ``--duration`` and ``--short`` narrow it down. Scenarios
that cut links between brokers run in network namespaces when this machine
allows it (root, iproute2, iptables), else through the fault-injecting proxy
(``--transport`` forces one). The exit status is 1 when a run at quorum or
all lost an acknowledged write, gave two values for one offset, broke a
key's order or committed a consumer group past records no member was
handed. ``one SPEC`` runs a single spec and is how the harness runs itself
inside a namespace; ``check HISTORY.json.gz ...`` runs the checker again on
saved histories.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from tests.chaos import netns
from tests.chaos.checker import check
from tests.chaos.harness import REPO_ROOT, RunSpec, run, run_isolated
from tests.chaos.history import History
from tests.chaos.report import render, update_doc
from tests.chaos.scenarios import SCENARIOS

LEVELS = ("one", "quorum", "all")


def _transport(choice: str, needs_partitions: bool) -> str:
    if not needs_partitions:
        return "loopback"
    if choice == "auto":
        return "netns" if netns.unavailable_reason() is None else "proxy"
    return choice


def _revision() -> str:
    """The commit measured, and whether ring/ had uncommitted changes then."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "ring"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown revision"
    return f"{head} (with uncommitted changes in ring/)" if dirty else head


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["one"]:
        spec = RunSpec(**json.loads(argv[1]))
        asyncio.run(run(spec))
        return 0
    if argv[:1] == ["check"]:  # replay the checker on a saved history
        for path in argv[1:]:
            with gzip.open(path, "rt") as f:
                report = check(History.from_json(json.load(f)))
            print(json.dumps(report.to_json(), indent=1))
        return 0
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                   help="run only this scenario (repeatable; default all)")
    p.add_argument("--consistency", default=",".join(LEVELS), help="levels, comma-separated (default one,quorum,all)")
    p.add_argument("--duration", type=float, default=None, help="seconds of load per run (default: the scenario's)")
    p.add_argument("--short", action="store_true", help="the short versions (as in make test)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--transport", choices=["auto", "netns", "proxy"], default="auto",
                   help="for scenarios that partition the network (default auto: netns when possible)")
    p.add_argument("--artifacts", type=Path, default=Path("var/chaos"), help="histories and broker logs")
    p.add_argument("--doc", type=Path, default=Path("docs/RELIABILITY.md"), help="where the table goes")
    p.add_argument("--no-doc", action="store_true", help="print the table, leave the document alone")
    args = p.parse_args(argv)
    levels = [lv.strip() for lv in args.consistency.split(",") if lv.strip()]
    if any(lv not in LEVELS for lv in levels):
        p.error(f"--consistency takes {', '.join(LEVELS)}")
    if args.transport == "netns" and (why := netns.unavailable_reason()):
        p.error(f"--transport netns: {why}")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    results = []
    for name in args.scenario or list(SCENARIOS):
        for level in levels:
            transport = _transport(args.transport, SCENARIOS[name].partitions)
            spec = RunSpec(name, level, str(args.artifacts / stamp / f"{name}-{level}"), args.duration,
                           args.short, args.seed, transport)
            began = time.monotonic()
            print(f"{name} / {level} ({transport}, {spec.seconds:g} s of load) ...", flush=True)
            res = run_isolated(spec)
            r = res.get("report") or {}
            print(f"  {time.monotonic() - began:.0f} s: acked {r.get('acknowledged')}/{r.get('attempted')}, "
                  f"lost {r.get('lost')}, inconsistent {r.get('inconsistent_offsets')}, "
                  f"order {r.get('order_violations')}, divergent {r.get('divergent_partitions')}"
                  + (f", group delivered {r.get('group_delivered')} (twice {r.get('group_redelivered')}), "
                     f"committed never delivered {r.get('committed_undelivered')}" if SCENARIOS[name].groups else "")
                  + (f", ERROR {res['error']}" if res.get("error") else ""), flush=True)
            results.append(res)
    command = "make chaos" if not argv else "python -m tests.chaos " + " ".join(argv)
    date = datetime.date.today().isoformat()
    section = render(results, command, date)
    if args.no_doc:
        print(section)
    else:
        update_doc(args.doc, section)
        print(f"wrote {args.doc}")
    (args.artifacts / stamp).mkdir(parents=True, exist_ok=True)
    (args.artifacts / stamp / "results.json").write_text(json.dumps(results, indent=1))
    # The commit measured is the run log's, beside its results, not the reference doc's.
    revision = _revision()
    (args.artifacts / stamp / "run.json").write_text(json.dumps({"command": command, "date": date,
                                                                 "revision": revision}, indent=1))
    print(f"measured {revision}; results in {args.artifacts / stamp}")
    unsafe = [r for r in results if r["spec"]["consistency"] != "one" and r.get("drained")
              and r.get("report") and (r["report"]["lost"] or r["report"]["inconsistent_offsets"]
                                       or r["report"]["order_violations"]
                                       or r["report"].get("committed_undelivered"))]
    for r in unsafe:
        print(f"UNSAFE: {r['spec']['scenario']} / {r['spec']['consistency']}: see {r['spec']['root']}",
              file=sys.stderr)
    return 1 if unsafe else 0


if __name__ == "__main__":
    sys.exit(main())
