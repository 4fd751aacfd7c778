"""Apache Kafka as a bench peer: three KRaft nodes on loopback, each both
broker and controller (``process.roles=broker,controller``, a static
three-voter controller quorum), topics with replication factor 3 and
``min.insync.replicas=2``.

Kafka comes from Maven Central: a generated pom naming ``kafka_2.13`` (whose
jar holds ``kafka.Kafka`` and ``kafka.tools.StorageTool``) and an SLF4J
binding, resolved by ``mvn dependency:copy-dependencies`` into a cache
directory (``$RING_BENCH_CACHE``, default ``~/.cache/ring-bench``) with its
own local repository; a second run finds the jars there and starts offline.
``java`` and ``mvn`` come from Debian's packages when missing.

Each node gets a ``server.properties`` (a client and a controller port on
127.0.0.1, its own log dir under the run's root), is formatted with
``kafka.tools.StorageTool format`` under one cluster id, and is started as
``java -Xms1g -Xmx1g ... -cp 'lib/*' kafka.Kafka server.properties`` with the
JVM options of Kafka's own start script. The cluster is ready when a
Metadata request answers with all three brokers. Flushing is Kafka's default
(the page cache; durability by replication): like the other systems here, no
fsync per write. Topics are created by the load generator.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from ring.bench.system import ensure_packages
from ring.localcluster import free_port

NODES = 3
VERSION = "4.3.1"  # Apache Kafka, from Maven Central
SLF4J = "2.0.17"
READY_S = 120.0
STOP_S = 30.0
MVN_S = 900.0
HEAP = "1g"
# Before the measured runs, this long of batched and then of unbatched produce: HotSpot compiles a method
# with C2 after some thousands of calls, which either load reaches in its first seconds; what is measured
# after 2 x 20 s runs compiled code, not the interpreter.
WARM_UP_S = 20.0
# kafka-server-start.sh's KAFKA_JVM_PERFORMANCE_OPTS
JVM_OPTS = ["-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true"]
# What every topic the load generator creates gets (and what the broker defaults to).
TOPIC_CONFIG = {"min.insync.replicas": "2"}
PARTITIONS = 3


def cache_dir() -> Path:
    return Path(os.environ.get("RING_BENCH_CACHE") or Path.home() / ".cache" / "ring-bench")


def pom(version: str = VERSION) -> str:
    """A pom whose runtime dependencies are what a Kafka broker needs."""
    deps = [("org.apache.kafka", "kafka_2.13", version),
            ("org.slf4j", "slf4j-api", SLF4J),  # kafka_2.13 brings 1.7; the binding below is an SLF4J 2 one
            ("org.slf4j", "slf4j-simple", SLF4J)]
    body = "".join(f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                   "</dependency>\n" for g, a, v in deps)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0">\n  <modelVersion>4.0.0</modelVersion>\n'
            "  <groupId>ring.bench</groupId>\n  <artifactId>kafka-peer</artifactId>\n  <version>1</version>\n"
            f"  <packaging>pom</packaging>\n  <dependencies>\n{body}  </dependencies>\n</project>\n")


def install_kafka(home: Path, version: str = VERSION) -> str | None:
    """The broker's jars in ``home/lib`` (from the cache when a previous run put them there);
    None when they are there, else why not."""
    lib = home / "lib"
    done = home / "lib.complete"
    if done.exists() and (lib / f"kafka_2.13-{version}.jar").exists():
        return None
    why = ensure_packages({"java": "openjdk-17-jre-headless", "mvn": "maven"})
    if why:
        return why
    r = copy_dependencies(home, pom(version), lib)
    if isinstance(r, str):
        return f"mvn could not resolve Apache Kafka {version}: {r}"
    if r.returncode != 0 or not (lib / f"kafka_2.13-{version}.jar").exists():
        return f"mvn could not resolve Apache Kafka {version}: {(r.stdout + r.stderr)[-400:]}"
    done.write_text(version + "\n")
    return None


def copy_dependencies(home: Path, pom_xml: str, lib: Path) -> subprocess.CompletedProcess[str] | str:
    """mvn copies the runtime dependencies of the project ``pom_xml`` (written to ``home``) into ``lib``,
    emptied first, with its own local repository under ``home``: mvn's outcome, or why it could not run."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(pom_xml)
    shutil.rmtree(lib, ignore_errors=True)
    try:
        return subprocess.run(["mvn", "-q", "-B", f"-Dmaven.repo.local={home / 'm2'}", "-f", str(home / "pom.xml"),
                               "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={lib}"],
                              capture_output=True, text=True, timeout=MVN_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)


def cluster_id() -> str:
    """A Kafka Uuid in its text form: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def server_properties(i: int, client_ports: list[int], controller_ports: list[int], log_dir: Path) -> str:
    """Node i's configuration: broker and controller, every port on 127.0.0.1, RF 3 everywhere."""
    voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in enumerate(controller_ports))
    props = {
        "process.roles": "broker,controller",
        "node.id": str(i),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{client_ports[i]},CONTROLLER://127.0.0.1:{controller_ports[i]}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{client_ports[i]}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": str(PARTITIONS),
        "default.replication.factor": str(NODES),
        "min.insync.replicas": TOPIC_CONFIG["min.insync.replicas"],
        "offsets.topic.replication.factor": str(NODES),
        "transaction.state.log.replication.factor": str(NODES),
        "transaction.state.log.min.isr": "2",
        "share.coordinator.state.topic.replication.factor": str(NODES),
        "share.coordinator.state.topic.min.isr": "2",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        "unclean.leader.election.enable": "false",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


class KafkaSystem:
    name = "kafka"
    needs = {"java": "openjdk-17-jre-headless", "mvn": "maven"}
    python_modules = ("confluent_kafka",)
    warm_up_s = WARM_UP_S

    def __init__(self, root: Path, version: str = VERSION) -> None:
        self.root = root
        self.version_ = version
        self.home = cache_dir() / f"kafka-{version}"
        self.client_ports = [free_port() for _ in range(NODES)]
        self.controller_ports = [free_port() for _ in range(NODES)]
        self.procs: list[subprocess.Popen] = []
        self.label = ""
        self.config = ""

    def install(self) -> str | None:
        return install_kafka(self.home, self.version_)

    def _java(self, main: str, *args: str, heap: str = HEAP) -> list[str]:
        return ["java", f"-Xms{heap}", f"-Xmx{heap}", *JVM_OPTS, "-cp", str(self.home / "lib" / "*"), main, *args]

    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        cid = cluster_id()
        formats: list[subprocess.Popen] = []
        try:
            for i in range(NODES):
                conf = self.root / f"k{i}.properties"
                conf.write_text(server_properties(i, self.client_ports, self.controller_ports, self.root / f"k{i}"))
                formats.append(subprocess.Popen(
                    self._java("kafka.tools.StorageTool", "format", "-t", cid, "-c", str(conf), heap="256m"),
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            for i, f in enumerate(formats):  # in parallel: each is a JVM start
                out = f.communicate(timeout=120)[0]
                if f.returncode != 0:
                    raise RuntimeError(f"kafka-storage format of k{i}: {out[-400:].decode(errors='replace')}")
            self.config = (self.root / "k0.properties").read_text()
            for i in range(NODES):
                log = open(self.root / f"k{i}.log", "ab")
                self.procs.append(subprocess.Popen(
                    self._java("kafka.Kafka", str(self.root / f"k{i}.properties")), stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                log.close()
            self._wait_ready()
        except BaseException:
            for f in formats:
                if f.poll() is None:
                    f.kill()
                    f.wait()
            self.stop()
            raise
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
        self.label = (f"Apache Kafka {self.version_} (KRaft, {java[0] if java else 'java'}, -Xmx{HEAP}), {NODES} nodes "
                      f"each broker and controller, RF {NODES}, min.insync.replicas "
                      f"{TOPIC_CONFIG['min.insync.replicas']}")

    def _wait_ready(self) -> None:
        """Until a Metadata request answers with every broker."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap(), "socket.connection.setup.timeout.ms": 2000,
                             "log_level": 0})  # no line per refused connection while the JVMs start
        deadline = time.monotonic() + READY_S
        seen: Any = None
        while True:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise RuntimeError(f"Kafka k{i} exited with {p.returncode}; see {self.root / f'k{i}.log'}")
            try:
                seen = sorted(admin.list_topics(timeout=2).brokers)
                if len(seen) == NODES:
                    return
            except Exception as exc:  # KafkaException while no broker answers yet
                seen = exc
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka metadata did not list {NODES} brokers within {READY_S:g} s: {seen}")
            time.sleep(0.5)

    def broker_pids(self) -> dict[str, list[int]]:
        return {f"k{i}": [p.pid] for i, p in enumerate(self.procs)}

    def target(self) -> dict[str, Any]:
        return {"bootstrap": self.bootstrap(), "replicas": NODES, "partitions": PARTITIONS,
                "topic_config": dict(TOPIC_CONFIG)}

    def version(self) -> str:
        return self.label

    def describe(self, settings: Any = None) -> list[str]:
        """The whole configuration, broker and client, as Markdown lines for the report."""
        from ring.bench import gen_kafka

        boot = "BOOTSTRAP"
        conf = self.config or server_properties(0, [9092, 9093, 9094], [9095, 9096, 9097], self.root / "k0")
        out = [f"Apache Kafka {self.version_}, `kafka_2.13` and its runtime dependencies from Maven Central "
               f"(SLF4J {SLF4J} with `slf4j-simple`), three nodes each started as "
               f"`java -Xms{HEAP} -Xmx{HEAP} {' '.join(JVM_OPTS)} -cp 'lib/*' kafka.Kafka kN.properties` after "
               "`kafka.tools.StorageTool format -t CLUSTER_ID -c kN.properties`; "
               f"{WARM_UP_S:g} s of batched and {WARM_UP_S:g} s of unbatched produce before the measured runs "
               "(the JIT). Node 0's `server.properties` (nodes 1 and 2 differ in `node.id`, ports and `log.dirs`; "
               "everything else is Kafka's default: flushing left to the page cache):", "", "```properties",
               *conf.rstrip().splitlines(), "```", "",
               f"Topics: {PARTITIONS} partitions, replication factor {NODES}, "
               + ", ".join(f"`{k}={v}`" for k, v in TOPIC_CONFIG.items()) + ". Clients: confluent-kafka "
               "(librdkafka); what is not listed is librdkafka's default.", ""]
        windows = []
        if settings is not None:
            windows = [(1, settings.window), (100, settings.window_batched)]
        for rpr in (1, 100):
            cfg = {k: v for k, v in gen_kafka.producer_config(boot, rpr).items() if k != "bootstrap.servers"}
            pool = next((f"; {-(-w // PARTITIONS)} producers at {w} requests in flight"
                         for r, w in windows if r == rpr), "")
            out.append(f"- producer, {rpr} record(s)/request{pool}: `{cfg}`")
        cfg = {k: v for k, v in gen_kafka.consumer_config(boot, "TOPIC-reader").items() if k != "bootstrap.servers"}
        out.append(f"- consumer (partitions assigned from offset 0 / from their end): `{cfg}`")
        return out

    def stop(self) -> None:
        """SIGTERM to every node at once (a controlled shutdown each), SIGKILL what is left after STOP_S."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
