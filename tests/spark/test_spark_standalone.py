"""sparkio on a Spark cluster, not only in local mode: a Spark standalone master and two workers on
loopback (Spark's own daemons, from the pyspark package), and ``examples/clickstream_job.py`` run by
``spark-submit`` against a real three-broker ring. The executors import sparkio and ring as
docs/SPARK.md ("On a Spark cluster") says: the same Python, with ring installed or on PYTHONPATH.
The job's per-minute records are read back from ring and compared with a plain Python count of the
events, and each worker's directory shows it ran an executor of the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from ring import clickstream
from ring.client import Client
from ring.localcluster import free_port
from sparkio.client import BrokerClient
from tests.brokers import REPO_ROOT, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

EVENTS = 3_000
START_S = 90.0  # three JVMs starting on a busy 2-core machine
JOB_S = 300.0  # the job: the driver's JVM, two executors, two stages


def _spark_bin(name: str) -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / name)


def _master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
        return json.load(r)


def _alive_workers(ui_port: int) -> int:
    try:
        state = _master_state(ui_port)
    except OSError:
        return -1
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE") if state.get("status") == "ALIVE" else -1


def test_the_clickstream_job_runs_on_a_standalone_spark_cluster(tmp_path):
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)}
    port, ui = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def daemon(name: str, *argv: str) -> None:
        with (logs / f"{name}.log").open("wb") as out:
            procs.append(subprocess.Popen([_spark_bin("spark-class"), *argv], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    cluster = TestCluster(tmp_path / "ring", 3, args=["--fsync", "never", "--log-level", "warning"])
    try:
        cluster.start()
        daemon("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(ui))
        workdirs = [tmp_path / f"worker-{i}" for i in range(2)]
        for i, wd in enumerate(workdirs):
            daemon(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                   "--memory", "1g", "--work-dir", str(wd), "--webui-port", str(free_port()), master_url)
        wait_for(f"two alive workers at {master_url}", lambda: _alive_workers(ui) == 2, timeout_s=START_S)

        brokers = ",".join(m.url for m in cluster)
        job = subprocess.run(
            [_spark_bin("spark-submit"), "--master", master_url,
             "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
             "--conf", f"spark.executorEnv.PYTHONPATH={env['PYTHONPATH']}",
             "--conf", f"spark.pyspark.python={sys.executable}",
             "--conf", "spark.executor.memory=1g", "--conf", "spark.sql.session.timeZone=UTC",
             str(REPO_ROOT / "examples" / "clickstream_job.py"), "--brokers", brokers,
             "--topic", "clicks", "--out-topic", "per-minute", "--generate", str(EVENTS), "--min-partitions", "4"],
            env=env, capture_output=True, text=True, timeout=JOB_S, cwd=tmp_path)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-5000:]

        minutes: dict[int, list[dict]] = defaultdict(list)
        for e in clickstream.events(EVENTS):
            minutes[e["ts"] // 60_000 * 60_000].append(e)
        assert f"{EVENTS} page views in {len(minutes)} minutes" in job.stdout, job.stdout[-3000:]
        written = []
        with BrokerClient([m.url for m in cluster]) as meta, Client([m.url for m in cluster]) as client:
            for p in range(len(meta.describe_topic("per-minute")["partitions"])):
                got = client.fetch("per-minute", p, 0)
                assert got.next_offset == got.high_watermark  # one fetch holds the few records
                written += [json.loads(r.value) for r in got.records]
        assert sorted(r["minute_ms"] for r in written) == sorted(minutes)
        for row in written:
            evs = minutes[row["minute_ms"]]
            assert (row["views"], row["users"]) == (len(evs), len({e["user"] for e in evs}))

        # Both executors of the job ran on the workers: each keeps the application's directory.
        apps = [sorted(p.name for p in wd.glob("app-*")) for wd in workdirs]
        assert all(len(a) == 1 for a in apps) and apps[0] == apps[1], apps
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        cluster.stop()
