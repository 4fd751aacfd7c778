"""Spark's own Kafka source (``spark-sql-kafka-0-10``) from Maven Central, for the
tests and the comparison that read ring through its Kafka listener.

The connector is resolved as ``ring.bench.peer_kafka`` resolves Kafka: a
generated pom naming ``spark-sql-kafka-0-10_2.13``, ``mvn
dependency:copy-dependencies`` into a cache directory with its own local
repository (``$RING_BENCH_CACHE``, default ``~/.cache/ring-bench``,
``spark-kafka-<version>``); a second run finds the jars there and needs no
network, and no version is asked for again once one is there. The version tried first is the installed pyspark's; when Maven
Central has no connector of that version, ``FALLBACK`` (the newest release
it has of the same major version, whose Kafka source runs on this Spark).
Of what mvn copies, only the jars pyspark does not ship itself are put on
``spark.jars`` (the connector, its token provider, ``kafka-clients``,
``commons-pool2``): Spark's own Scala, Hadoop and compression jars stay the
ones it was built with.

``python -m ring.bench.spark_kafka_jars`` installs them and prints the
jars, or why not (exit status 1).
"""

from __future__ import annotations

import fcntl
import sys
from pathlib import Path

from ring.bench.peer_kafka import cache_dir, copy_dependencies
from ring.bench.system import ensure_packages

ARTIFACT = "spark-sql-kafka-0-10_2.13"
# Maven Central has no spark-sql-kafka-0-10_2.13 4.3.0 (its newest release is 4.2.0).
FALLBACK = "4.2.0"


def pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def pom(version: str) -> str:
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0">\n  <modelVersion>4.0.0</modelVersion>\n'
            "  <groupId>ring.tests</groupId>\n  <artifactId>spark-kafka</artifactId>\n  <version>1</version>\n"
            "  <packaging>pom</packaging>\n  <dependencies>\n"
            f"    <dependency><groupId>org.apache.spark</groupId><artifactId>{ARTIFACT}</artifactId>"
            f"<version>{version}</version></dependency>\n  </dependencies>\n</project>\n")


def _home(version: str) -> Path:
    return cache_dir() / f"spark-kafka-{version}"


def _artifact(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    stem = jar.removesuffix(".jar")
    parts = stem.split("-")
    while parts and not parts[-1][:1].isdigit():  # a classifier after the version
        parts.pop()
    return "-".join(parts[:-1]) if len(parts) > 1 else stem


def _spark_ships() -> set[str]:
    import pyspark

    return {_artifact(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def _installed(version: str) -> list[str] | None:
    home = _home(version)
    lib = home / "lib"
    if not (home / "lib.complete").exists() or not (lib / f"{ARTIFACT}-{version}.jar").exists():
        return None
    ships = _spark_ships()
    return sorted(str(j) for j in lib.glob("*.jar") if _artifact(j.name) not in ships)


def _resolve(version: str) -> str | None:
    """mvn copies the connector and its runtime dependencies; None when done, else why not."""
    home = _home(version)
    lib = home / "lib"
    r = copy_dependencies(home, pom(version), lib)
    if isinstance(r, str):
        return f"mvn could not resolve {ARTIFACT} {version}: {r}"
    if r.returncode != 0 or not (lib / f"{ARTIFACT}-{version}.jar").exists():
        out = r.stdout + r.stderr
        missing = f"Maven Central has no {ARTIFACT} {version}" if "Could not find artifact" in out else ""
        return missing or f"mvn could not resolve {ARTIFACT} {version}: {out.strip()[-300:]}"
    (home / "lib.complete").write_text(version + "\n")
    return None


def jars() -> tuple[str, list[str]] | str:
    """(connector version, jars for ``spark.jars``) from the cache, resolving what is not there
    (the pyspark version first, then ``FALLBACK``); or why they cannot be had."""
    try:
        wanted = [pyspark_version(), FALLBACK]
    except ImportError:
        return "pyspark is not installed (the spark extra: pip install -e '.[spark]')"
    for version in dict.fromkeys(wanted):
        found = _installed(version)
        if found:
            return version, found
    why = ensure_packages({"java": "openjdk-17-jre-headless", "mvn": "maven"})
    if why:
        return why
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "spark-kafka.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist's workers each ask at once: one mvn at a time
        refusals = []
        for version in dict.fromkeys(wanted):
            found = _installed(version)  # another process may have put it there while this one waited
            if found:
                return version, found
            why = _resolve(version)
            if why is None:
                return version, _installed(version) or []
            refusals.append(why)
    return "; ".join(refusals)


def main() -> int:
    got = jars()
    if isinstance(got, str):
        print(got, file=sys.stderr)
        return 1
    version, paths = got
    print(f"{ARTIFACT} {version} (pyspark {pyspark_version()}):")
    for p in paths:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
