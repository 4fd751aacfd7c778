"""Apache Kafka's own client tools from Maven Central: ``kafka-tools`` (the verifiable producer and
consumer Kafka's system tests drive, on Kafka's Java client), for the tests that run them against ring's
Kafka listener.

They are resolved as ``ring.bench.peer_kafka`` resolves Kafka's broker: a generated pom naming
``kafka-tools`` of Kafka's version and an SLF4J binding, ``mvn dependency:copy-dependencies`` into a
cache directory with its own local repository (``$RING_BENCH_CACHE``, default ``~/.cache/ring-bench``,
``kafka-tools-<version>``); a second run finds the jars there and needs no network.

``python -m ring.bench.kafka_tools`` installs them and prints the classpath, or why not (exit status 1).
"""

from __future__ import annotations

import fcntl
import sys
from pathlib import Path

from ring.bench.peer_kafka import SLF4J, VERSION, cache_dir, copy_dependencies
from ring.bench.system import ensure_packages

ARTIFACT = "kafka-tools"
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"


def pom(version: str = VERSION) -> str:
    deps = [("org.apache.kafka", ARTIFACT, version), ("org.slf4j", "slf4j-simple", SLF4J)]
    body = "".join(f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                   "</dependency>\n" for g, a, v in deps)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0">\n  <modelVersion>4.0.0</modelVersion>\n'
            "  <groupId>ring.tests</groupId>\n  <artifactId>kafka-tools</artifactId>\n  <version>1</version>\n"
            f"  <packaging>pom</packaging>\n  <dependencies>\n{body}  </dependencies>\n</project>\n")


def _home(version: str) -> Path:
    return cache_dir() / f"kafka-tools-{version}"


def _installed(version: str) -> str | None:
    home = _home(version)
    if (home / "lib.complete").exists() and (home / "lib" / f"{ARTIFACT}-{version}.jar").exists():
        return str(home / "lib" / "*")
    return None


def classpath(version: str = VERSION) -> str:
    """The Java classpath of Kafka's tools (``lib/*``), resolving them when the cache lacks them; or why
    they cannot be had, starting with "cannot"."""
    found = _installed(version)
    if found:
        return found
    why = ensure_packages({"java": "openjdk-17-jre-headless", "mvn": "maven"})
    if why:
        return f"cannot run Kafka's tools: {why}"
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "kafka-tools.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist's workers may ask at once: one mvn at a time
        found = _installed(version)
        if found:
            return found
        home = _home(version)
        r = copy_dependencies(home, pom(version), home / "lib")
        if isinstance(r, str):
            return f"cannot resolve {ARTIFACT} {version}: {r}"
        if r.returncode != 0 or not (home / "lib" / f"{ARTIFACT}-{version}.jar").exists():
            return f"cannot resolve {ARTIFACT} {version}: {(r.stdout + r.stderr).strip()[-300:]}"
        (home / "lib.complete").write_text(version + "\n")
    return _installed(version) or f"cannot find {ARTIFACT} {version} after resolving it"


def main() -> int:
    got = classpath()
    if got.startswith("cannot"):
        print(got, file=sys.stderr)
        return 1
    print(f"{ARTIFACT} {VERSION}: {got}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
