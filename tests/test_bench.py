"""ring bench: the pure parts (percentiles, medians, ratios, the disturbed-run
rule, case selection and interleaving, table, targets, the Markdown section,
wrk and py-spy parsing), the load-generator loops' bounds, /proc readings, and
a ``--quick --peers none`` smoke run against real ring brokers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from ring.bench import cases, ceilings, loadgen, procs, profile, report, stats
from ring.bench import records as bench_records

REPO = Path(__file__).resolve().parent.parent


# --- stats ------------------------------------------------------------------------


def test_percentile_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert stats.percentile(values, 0.5) == 50
    assert stats.percentile(values, 0.99) == 99
    assert stats.percentile(values, 0.999) == 100
    assert stats.percentile(values, 0.0) == 1
    assert stats.percentile([7.0], 0.99) == 7.0
    assert stats.percentile([], 0.5) is None


def test_latency_summary_sorts_and_counts():
    s = stats.latency_summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s == {"n": 5, "p50": 3.0, "p99": 5.0, "p999": 5.0, "max": 5.0}
    assert stats.latency_summary([])["p99"] is None


def test_median_skips_missing_values():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert stats.median([None, 5.0, None]) == 5.0
    assert stats.median([None]) is None
    assert stats.median([]) is None


def test_ratio_and_meets():
    assert stats.ratio(30.0, 20.0) == 1.5
    assert stats.ratio(None, 2.0) is None
    assert stats.ratio(1.0, None) is None
    assert stats.ratio(1.0, 0.0) is None
    assert stats.meets(1.5, 1.5) is True
    assert stats.meets(1.49, 1.5) is False
    assert stats.meets(19.9, 20.0, higher_is_better=False) is True
    assert stats.meets(None, 1.0) is None


def test_disturbed_runs_are_those_where_others_took_cpu():
    # 10 s run: the machine was busy 12 CPU-seconds, the run's own processes 11.
    assert stats.others_cores(12.0, 11.0, 10.0) == pytest.approx(0.1)
    assert not stats.disturbed(stats.others_cores(12.0, 11.0, 10.0))
    # others took 8 CPU-seconds in 10 s: most of a core
    assert stats.disturbed(stats.others_cores(19.0, 11.0, 10.0))
    # participants' counters may run slightly ahead of the machine's: never negative
    assert stats.others_cores(10.0, 10.5, 10.0) == 0.0
    assert stats.others_cores(1.0, 0.0, 0.0) == 0.0
    assert stats.disturbed(stats.OTHERS_CORES_FLAG + 0.01)
    assert not stats.disturbed(stats.OTHERS_CORES_FLAG)


# --- cases --------------------------------------------------------------------------


def test_produce_cases_cross_batching_keys_and_consistency():
    produce = cases.produce_cases()
    assert len(produce) == 12
    assert {(c.records_per_request, c.keyed, c.consistency) for c in produce} == {
        (r, k, c) for r in (1, 100) for k in (False, True) for c in ("one", "quorum", "all")}
    assert all(c.peers == (c.consistency == "quorum") for c in produce)


def test_select_adds_the_maximum_a_half_load_case_needs():
    chosen = [c.id for c in cases.select(["latency-half-100"])]
    assert chosen == ["produce-100-unkeyed-quorum", "latency-half-100"]
    assert {c.group for c in cases.select(["consume", "e2e"])} == {"consume", "e2e"}
    assert cases.select(["ceiling"]) == []
    with pytest.raises(ValueError, match="unknown cases: nope"):
        cases.select(["nope"])


def test_plan_interleaves_systems_within_each_repetition():
    chosen = cases.select(["produce-1-unkeyed-quorum", "produce-1-unkeyed-one"])
    order = [(c.id, rep, s) for c, rep, s in cases.plan(chosen, ["ring", "nats", "rabbitmq"], 2)]
    assert order == [
        ("produce-1-unkeyed-one", 0, "ring"), ("produce-1-unkeyed-one", 1, "ring"),  # ring-only case
        ("produce-1-unkeyed-quorum", 0, "ring"), ("produce-1-unkeyed-quorum", 0, "nats"),
        ("produce-1-unkeyed-quorum", 0, "rabbitmq"),
        ("produce-1-unkeyed-quorum", 1, "ring"), ("produce-1-unkeyed-quorum", 1, "nats"),
        ("produce-1-unkeyed-quorum", 1, "rabbitmq"),
    ]


def test_parse_peers():
    assert cases.parse_peers("none") == []
    assert cases.parse_peers("nats,rabbitmq,nats") == ["nats", "rabbitmq"]
    assert cases.parse_peers("kafka") == ["kafka"]
    with pytest.raises(ValueError, match="pulsar"):
        cases.parse_peers("nats,pulsar")


# --- report -------------------------------------------------------------------------


def _row(case, system, rec_s, p99=5.0, ok=True, disturbed=False, rss=50.0):
    return {"case": case, "system": system, "ok": ok, "rec_s": rec_s, "disturbed": disturbed,
            "lat": {"p50": p99 / 2, "p99": p99, "p999": p99 * 2}, "rss_peak_mb": rss, "cpu_us_per_rec": 10.0,
            "errors": 0}


def test_summarise_takes_medians_and_counts_flags():
    rows = [_row("c", "ring", 100.0), _row("c", "ring", 300.0, disturbed=True), _row("c", "ring", 200.0),
            _row("c", "ring", None, ok=False, rss=120.0)]
    s = report.summarise(rows)[("c", "ring")]
    assert s["rec_s"] == 200.0
    assert (s["runs"], s["ok"], s["disturbed"]) == (4, 3, 1)
    assert s["p99"] == 5.0
    assert s["rss_peak_mb"] == 120.0


def test_table_shows_ring_each_peer_and_the_ratio():
    rows = [_row("produce-100-unkeyed-quorum", "ring", 60_000.0), _row("produce-100-unkeyed-quorum", "nats", 20_000.0),
            _row("produce-100-unkeyed-quorum", "rabbitmq", 30_000.0, disturbed=True),
            _row("produce-100-unkeyed-one", "ring", 90_000.0)]
    chosen = cases.select(["produce-100-unkeyed-quorum", "produce-100-unkeyed-one"])
    lines = report.table(report.summarise(rows), chosen, ["nats", "rabbitmq"])
    assert lines[0] == "| case | metric | ring | NATS | ring/NATS | RabbitMQ | ring/RabbitMQ | notes |"
    quorum = next(line for line in lines if "100/req, unkeyed, quorum" in line)
    assert "| 60,000 | 20,000 | 3.00× | 30,000 | 2.00× |" in quorum
    assert "RabbitMQ: 1/1 disturbed" in quorum
    one = next(line for line in lines if "100/req, unkeyed, one" in line)
    assert "| 90,000 |  |  |  |  |" in one  # peers have no consistency=one: no figure, no ratio
    cpu = [line for line in lines if "| broker CPU µs/record |" in line]
    assert len(cpu) == 2 and "| 10.0 | 10.0 | 1.00× | 10.0 | 1.00× |" in cpu[1]  # one, then quorum


def test_targets_read_ring_against_kafka_in_records_and_broker_cpu():
    rows = [_row("produce-1-unkeyed-quorum", "ring", 6_000.0), _row("produce-1-unkeyed-quorum", "kafka", 3_000.0),
            _row("produce-100-unkeyed-quorum", "ring", 50_000.0),
            {**_row("produce-100-unkeyed-quorum", "kafka", 100_000.0), "cpu_us_per_rec": 20.0}]
    got = {name: (fig, met) for name, fig, met in report.targets(report.summarise(rows))}
    assert got["unbatched quorum produce ≥ 1.0× Apache Kafka, records/s"] == ("2.00×", True)
    assert got["unbatched quorum produce: broker CPU per record ≤ Apache Kafka's"] == ("1.00×", True)
    assert got["batched (100/request) quorum produce ≥ 1.0× Apache Kafka, records/s"] == ("0.50×", False)
    assert got["batched (100/request) quorum produce: broker CPU per record ≤ Apache Kafka's"] == ("0.50×", True)
    assert got["consume ≥ 1.0× Apache Kafka, records/s"] == ("–", None)
    lines = report.table(report.summarise(rows), cases.select(["produce-1-unkeyed-quorum"]), ["kafka"])
    assert lines[0] == "| case | metric | ring | Kafka | ring/Kafka | notes |"


def test_targets_against_the_summary():
    rows = [_row("produce-100-unkeyed-quorum", "ring", 60_000.0), _row("produce-100-unkeyed-quorum", "rabbitmq", 30_000.0),
            _row("produce-1-unkeyed-quorum", "ring", 5_000.0), _row("produce-1-unkeyed-quorum", "nats", 10_000.0),
            _row("consume-fetch", "ring", 200_000.0), _row("consume-fetch", "rabbitmq", 100_000.0),
            _row("latency-one-1", "ring", 1.0, p99=2.0), _row("latency-one-1", "nats", 1.0, p99=3.0),
            _row("latency-half-1", "ring", 1.0, p99=25.0, rss=200.0)]
    got = {name: (fig, met) for name, fig, met in report.targets(report.summarise(rows))}
    assert got["batched (100/request) quorum produce ≥ 1.5× RabbitMQ streams R3"] == ("2.00×", True)
    assert got["unbatched quorum produce ≥ 1.0× NATS JetStream R3"] == ("0.50×", False)
    assert got["consume ≥ 2× ring's (batched quorum) produce"][1] is True
    assert got["consume ≥ 1.0× RabbitMQ streams"][1] is True
    assert got["p99 quorum produce latency, one in flight ≤ NATS's"][1] is True
    assert got["p99 at half max load (1/request) < 20 ms"] == ("25.0 ms", False)
    assert got["p99 at half max load (100/request) < 20 ms"][1] is None
    assert got["broker RSS ≤ 150 MB"] == ("200 MB", False)
    assert "| p99 at half max load (1/request) < 20 ms | 25.0 ms | NO |" in report.target_lines(report.targets(
        report.summarise(rows)))


def test_replace_section_keeps_the_rest_of_the_document(tmp_path):
    doc = "# Benchmarks\n\nHand-written text.\n"
    once = report.replace_section(doc, "first")
    assert once.startswith(doc.rstrip()) and report.BEGIN in once and "first" in once
    twice = report.replace_section(once + "\n## After\n", "second")
    assert "first" not in twice and "second" in twice and "Hand-written text." in twice and "## After" in twice
    assert twice.count(report.BEGIN) == 1
    path = tmp_path / "B.md"
    report.write_section(path, "new")
    assert report.BEGIN in path.read_text()


# --- parsing the tools' output ----------------------------------------------------------------

WRK_OUT = """Running 2s test @ http://127.0.0.1:9250/v1/topics/t/messages?partition=0&consistency=quorum
  1 threads and 256 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    21.55ms    3.10ms  48.20ms   90.00%
  Latency Distribution
     50%   20.99ms
     75%   22.10ms
     90%   24.01ms
     99%    1.02s
  23456 requests in 2.00s, 3.1MB read
  Non-2xx or 3xx responses: 12
Requests/sec:  11728.00
Transfer/sec:      1.55MB
"""


def test_the_report_names_no_commit():
    """The section written into docs/BENCHMARKS.md describes the run (command, date, machine, versions
    of the peers) but not the commit measured: that is the run log's (stdout and the rows file)."""
    from types import SimpleNamespace

    from ring.bench import render
    from ring.bench.run import Settings

    bench = SimpleNamespace(settings=Settings(), args=SimpleNamespace(command="ring bench --quick"),
                            extra={"seconds": 1.0}, versions={"commit": "0123abc", "ring": "ring 0.1"})
    lines = "\n".join(render._settings(bench, ["ring"]))
    assert "command: `ring bench --quick`" in lines
    assert "0123abc" not in lines and "commit" not in lines, lines


def test_parse_wrk():
    got = ceilings.parse_wrk(WRK_OUT)
    assert got["req_s"] == 11728.0
    assert got["p50_ms"] == pytest.approx(20.99)
    assert got["p99_ms"] == pytest.approx(1020.0)
    assert got["non_2xx"] == 12
    assert got["requests"] == 23456
    assert ceilings.parse_wrk("garbage")["req_s"] is None
    assert ceilings.parse_wrk("garbage")["requests"] is None


def test_cpu_table_reads_each_case_against_the_yardsticks_of_the_same_client():
    from ring.bench import cpu

    def row(case, client, us, ok=True, disturbed=False):
        return {"case": case, "client": client, "ok": ok, "req_s": 1000.0, "cpu_us_per_req": us,
                "disturbed": disturbed, "errors": 0}

    rows = [row("yard-aiohttp", "wrk", 30.0), row("yard-httptools", "wrk", 6.0),
            row("yard-aiohttp", "python", 20.0), row("yard-httptools", "python", 5.0),
            row("produce-1", "wrk", 90.0), row("produce-1", "wrk", 60.0, disturbed=True), row("produce-1", "wrk", 120.0),
            row("produce-1", "python", 100.0)]
    lines = cpu.table({"rows": rows, "clients": ["wrk", "python"]})
    produce = [line for line in lines if line.startswith("| produce 1 record (JSON), one broker")]
    assert produce[0] == ("| produce 1 record (JSON), one broker, 64 in flight | wrk | 1,000 | 90.0 | 3.00× | 15.00× "
                          "| 1/3 disturbed |")
    assert "| python | 1,000 | 100.0 | 5.00× | 20.00× |" in produce[1]
    yard = next(line for line in lines if line.startswith("| yardstick: aiohttp") and "| wrk |" in line)
    assert "| 30.0 |  |  |" in yard  # a yardstick is not a ratio of itself


def test_top_frames_from_collapsed_stacks():
    raw = ("process 1:main (x.py:1);serve (/a/b/app.py:10);append (/a/log/segment.py:5) 60\n"
           "process 1:main (x.py:1);serve (/a/b/app.py:10);crc (/a/log/batch.py:7) 30\n"
           "process 1:main (x.py:1);idle (/a/loop.py:2) 10\n"
           "process 1:main (x.py:1);run (/a/runners.py:9);idle (/a/loop.py:2) 5\n")
    top = profile.top_frames(raw)
    assert top["samples"] == 105
    assert top["own"][0] == ("append (segment.py:5)", pytest.approx(60 / 105))
    incl = dict(top["inclusive"])
    assert incl["serve (app.py:10)"] == pytest.approx(90 / 105)
    assert "main (x.py:1)" not in incl  # the process line, not a frame
    assert profile.top_frames("")["own"] == []


# --- load generator loops ----------------------------------------------------------------------


def test_records_are_1k_json_and_carry_a_sequence():
    recs = bench_records.make_records(20)
    assert all(len(v) == 1024 and k.startswith(b"u") for k, v in recs)
    stamped = bench_records.with_seq(recs[3][1], 123456)
    assert len(stamped) == 1024 and bench_records.seq_of(stamped) == 123456
    assert orjson.loads(stamped)["user"] == orjson.loads(recs[3][1])["user"]


async def test_windowed_is_bounded_in_count_and_time():
    in_flight = peak = 0

    async def send(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        if i == 7:
            raise RuntimeError("refused")
        return 100

    res = await loadgen.windowed(send, window=8, requests_max=50, seconds_max=10)
    assert (res["requests"], res["errors"], res["records"]) == (49, 1, 4900)
    assert peak == 8 and "refused" in res["last_error"]
    t0 = time.perf_counter()
    res = await loadgen.windowed(send, window=4, requests_max=10**9, seconds_max=0.2)
    assert time.perf_counter() - t0 < 2.0 and res["requests"] > 0


async def test_paced_keeps_the_rate_and_stops_at_its_bounds():
    async def send(i: int) -> int:
        await asyncio.sleep(0.002)
        return 1

    t0 = time.perf_counter()
    res = await loadgen.paced(send, rate=200, requests_max=10**9, seconds_max=0.5)
    assert 0.4 < time.perf_counter() - t0 < 3.0
    assert 80 <= res["requests"] <= 102
    assert res["lat_ms"]["p50"] >= 2.0


# --- /proc --------------------------------------------------------------------------------------


def test_proc_readings_of_a_child_we_started():
    # the child spins until it has used 0.2 s of CPU (however busy the machine), says so, then sleeps
    spin = "import sys, time\nwhile time.process_time() < 0.2: pass\nprint('spun', flush=True)\ntime.sleep(10)"
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "spun"
        assert child.pid in procs.with_descendants([os.getpid()])
        assert procs.cpu_seconds(child.pid) >= 0.15
        assert procs.rss_bytes(child.pid) > 1 << 20
        sampler = procs.PeakRss({"child": [child.pid]})
        sampler.start()
        assert sampler.stop()["child"] > 1 << 20
    finally:
        child.kill()
        child.wait()
    assert procs.cpu_seconds(child.pid) == 0.0  # gone: counts nothing
    assert procs.machine_busy_seconds() > 0


# --- the whole harness, small ----------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_quick_run_against_real_brokers(tmp_path):
    """Every case runs without an error, the consumers read exactly what was there, and every figure the
    report prints is the one its runs measured (records over seconds, the medians, the target ratios): true
    on any machine, however fast; speed itself is what the benchmark reports, not what this checks."""
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nKept.\n")
    r = subprocess.run([sys.executable, "-m", "ring", "bench", "--quick", "--peers", "none", "--output", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "TMPDIR": str(tmp_path)})  # the rows file goes beside the report
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = out.read_text()
    assert "Kept." in doc and report.BEGIN in doc and report.END in doc
    assert "command: `ring bench --quick --peers none --output" in doc
    for line in ("| end-to-end, produce to long-poll delivery", "#### Targets", "| broker RSS ≤ 150 MB |",
                 "disk append, 1 KiB writes, fdatasync each", "loopback TCP", "produce, stored batches",
                 "#### Hostile input: broker memory and trickling clients", "| produces refused | 0 | 0 of 20 |",
                 "#### CPU per request, same run", "| produce 1 record (JSON), one broker, 64 in flight | python |",
                 "| yardstick: asyncio.Protocol on httptools, POST 1 KiB JSON, 64 in flight | python |"):
        assert line in doc, line
    assert "FAILED" not in r.stdout and "skipped" not in doc

    raw = orjson.loads((tmp_path / "ring-bench-rows.json").read_bytes())
    # One host's members: every run served, the direct path forwards nothing (each member gets produces
    # it leads), the shared port forwards what the member behind it does not lead.
    assert "#### One host, many members" in doc
    runs = raw["extra"]["members"]["runs"]
    assert {k.split("-", 1)[1] for k in runs} == {"1-direct", "1-shared", "100-direct", "100-shared"}
    for key, run in runs.items():
        # Every answer a 2xx, or a refusal for load (on a busy machine the loop lags: admission control).
        assert run["requests"] > run["non_2xx"] and run["non_2xx"] <= run["refused"], (key, run)
        assert (run["forwarded"] > 0) == (key.endswith("shared") and not key.startswith("1-")), (key, run)
    rows = {row["case"]: row for row in raw["rows"]}
    every = cases.all_cases()
    assert set(rows) == {c.id for c in every}, "every case ran, once (--quick: one repetition)"
    for case in every:
        row = rows[case.id]
        assert row["ok"] and row["errors"] == 0 and row["records"] > 0, row
        assert row["rec_s"] == pytest.approx(row["records"] / row["seconds"]), row
        if case.metric == "rec_s":
            assert f"| {case.label} | records/s | {report._num(row['rec_s'])} |" in doc, case.label
        else:
            lat = row["lat"]
            assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"], row
            assert f"| {case.label} | p50 ms | {report._num(lat['p50'], 'ms')} |" in doc, case.label
    for consume in ("consume-fetch", "consume-group"):
        assert rows[consume]["records"] == rows[consume]["expected"], rows[consume]
    ratio = rows["consume-fetch"]["rec_s"] / rows["produce-100-unkeyed-quorum"]["rec_s"]
    assert f"| consume ≥ 2× ring's (batched quorum) produce | {report._num(ratio, 'x')} |" in doc


def test_profile_inclusive_shares_leave_out_the_frames_above_the_event_loop():
    from ring.bench import profile

    collapsed = "\n".join([
        "main (cli.py:1);Runner.run (runners.py:118);produce (app.py:10);append (log.py:5) 6",
        "main (cli.py:1);Runner.run (runners.py:118);send (leader.py:3) 3",
        "main (cli.py:1);Runner.run (runners.py:118) 1",
    ])
    top = profile.top_frames(collapsed)
    assert top["samples"] == 10
    assert dict(top["own"])["Runner.run (runners.py:118)"] == 0.1
    incl = dict(top["inclusive"])
    assert incl == {"produce (app.py:10)": 0.6, "append (log.py:5)": 0.6, "send (leader.py:3)": 0.3}


def test_spark_part_summary_and_report():
    from ring.bench import spark

    res = {"records": 1000, "value_bytes": 1_024_000, "file_bytes": 1_025_000, "partitions": 6,
           "load_avg_1m": (0.5, 0.7),
           "times": {"count/ring": [2.0, 1.0, 3.0], "count/file": [0.5, 0.5, 0.6], "count/floor": [0.8, 0.8, 0.9],
                     "count/empty": [0.3, 0.3, 0.3], "group/ring": [4.0, 4.0, 4.0], "group/file": [1.0, 1.0, 1.0]},
           "cpu": {"count/ring": [2.0, 2.0, 2.0], "count/file": [1.0, 1.0, 1.0], "count/floor": [1.0, 1.0, 1.0],
                   "count/empty": [0.4, 0.4, 0.4], "group/ring": [3.0, 3.0, 3.0], "group/file": [1.5, 1.5, 1.5]}}
    s = spark.summary(res)
    assert s["count"]["ratio"] == 0.25 and s["count"]["cpu_ratio"] == 0.5 and s["group"]["ratio"] == 0.25
    text = spark.report(res, "ring bench --cases spark")
    assert "| 2.00 s, 2.0 CPU s | 0.50 s, 1.0 CPU s | 0.25 | 0.50 |" in text
    assert "FLAGGED" not in text and "0.80 s, 1.0 CPU s, of which 0.30 s (0.4 CPU s) with no rows" in text
    assert "spark" in cases.GROUPS


@pytest.mark.integration
def test_the_ranges_measurement_runs_on_a_small_cluster(tmp_path: Path) -> None:
    """``python -m ring.bench.ranges`` end to end on four brokers and small segments (its figures belong
    to docs/BENCHMARKS.md; here: that it measures what it says)."""
    from ring.bench import ranges

    r = ranges.measure(tmp_path / "c", 4, 6, 128 * 1024, spark=False)
    assert r["ranges"] >= 6 and len(r["disk_bytes"]) == 4
    assert all(rep["local_start_offset"] > 0 for rep in r["replicas"].values()) and len(r["replicas"]) == 3
    loop = r["fetch_loop"]
    assert loop["record_bytes"] == r["records"] * (ranges.RECORD_BYTES - 15)
    assert abs(sum(loop["served_share"].values()) - 1) < 0.01 and loop["brokers_serving"] >= 3
    assert "| replica |" in ranges.markdown(r)


def test_overload_report_checks_each_figure_against_the_issues_target():
    from ring.bench import overload

    lat = lambda p99: {"n": 10, "p50": p99 / 2, "p99": p99, "p999": p99, "max": p99}  # noqa: E731
    tally = lambda ok_per_s, p99, refused=0: {"seconds": 5.0, "ok": 1, "ok_per_s": ok_per_s,  # noqa: E731
                                              "refused": refused, "other": 0, "last_other": "",
                                              "ok_lat_ms": lat(p99), "refused_lat_ms": lat(2.0)}
    res = {"record_bytes": 1024, "body_bytes": 1026, "seconds": 5.0, "quota_bytes_per_s": 102_600.0,
           "max_per_s": 1000.0, "rss_before": 50 << 20, "rss_peak": 60 << 20, "rss_after": 55 << 20,
           "overload": tally(950.0, 40.0, refused=5000), "recovery": tally(500.0, 5.0), "recovery_s": 0.2,
           "quiet_alone": tally(250.0, 10.0), "quiet_beside": tally(250.0, 20.0), "noisy": tally(100.0, 5.0),
           "loadgen_cpu_share": 0.5}
    rows = {line.split(" | ")[0].lstrip("| "): line.rsplit(" | ", 1)[1].rstrip(" |")
            for line in overload.report(res) if line.startswith("| ") and "---" not in line}
    assert rows["goodput at 2x the maximum"] == "yes"
    assert rows["refusals (429), p50 / p99 from their send"] == "yes"
    assert rows["admitted requests, p99 from their scheduled start"] == "yes"
    assert rows["quiet tenant's p99 beside noisy (5x its quota) / alone"] == "no"  # 2x its p99 alone
    assert rows["noisy tenant's goodput / its quota"] == "yes"


def test_cpu_table_shows_the_python_calls_per_request_of_each_run():
    from ring.bench import cpu

    lines = cpu.table({"rows": [], "clients": ["wrk"],
                       "calls": [{"case": "produce-1", "calls_per_req": [260.6, 260.7]}]})
    assert "| produce-1 | 260.6 / 260.7 |" in lines


def test_the_call_counter_counts_python_calls_and_writes_them_on_sigusr2(tmp_path):
    import asyncio
    import os
    import signal
    import sys
    import threading

    from ring.commands.callcount import CallCounter

    def leaf():
        return None

    async def main():
        counter = CallCounter(tmp_path / "calls.txt")
        try:
            counter.install(asyncio.get_running_loop())
            before = counter.calls
            for _ in range(100):
                leaf()
            during = counter.calls - before
            os.kill(os.getpid(), signal.SIGUSR2)
            for _ in range(100):  # bounded: the handler runs within a few loop turns
                if (tmp_path / "calls.txt").exists():
                    break
                await asyncio.sleep(0)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR2)
        return during

    during = asyncio.run(main())
    assert 100 <= during <= 101  # the 100 calls of leaf, and nothing counted for builtins
    seq, calls = (int(x) for x in (tmp_path / "calls.txt").read_text().split())
    assert seq == 1 and calls >= 100
