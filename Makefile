# The only entry points a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= dev,spark

.PHONY: venv system-deps spark-kafka-jars kafka-tools-jars demo test bench cluster cluster-stop clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	@touch $@

demo: venv
	$(BIN)/python -m ring.demo

# System packages some tests drive for real: Chromium (the admin page, via
# Playwright with the system browser), iproute2 and iptables (network
# partitions in namespaces), curl (the examples of README.md and docs/), a Java 17 runtime
# (the Spark tier), Maven (Spark's Kafka source, below), faketime (a broker whose wall
# clock is wrong), kcat (a Kafka client on the Kafka listener). Installed with apt-get when we
# are root and they are missing; otherwise those tests skip and say why. CI (CI=true) insists: a
# missing package fails the run.
SYSTEM_DEPS := chromium:chromium ip:iproute2 iptables:iptables curl:curl java:openjdk-17-jre-headless \
	mvn:maven faketime:faketime kcat:kcat
system-deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do \
	  command -v $${dep%%:*} >/dev/null 2>&1 || missing="$$missing $${dep#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null \
	      || { [ "$$CI" != true ] || exit 1; }; \
	  elif [ "$$CI" = true ]; then echo "missing system packages:$$missing" >&2; exit 1; \
	  else echo "note: missing$$missing; the tests that need them will skip"; fi; \
	fi

# Spark's own Kafka source (spark-sql-kafka-0-10 and its dependencies) from Maven Central with
# mvn, cached under ~/.cache/ring-bench: tests/spark reads ring's Kafka listener through it.
# Without it those tests skip and say why; CI (CI=true) insists.
spark-kafka-jars: venv system-deps
	@$(BIN)/python -m ring.bench.spark_kafka_jars >/dev/null || [ "$$CI" != true ]

# Apache Kafka's own client tools (kafka-tools: the verifiable producer and consumer, on Kafka's
# Java client) from Maven Central the same way: tests/test_kafka_java.py runs them against ring.
kafka-tools-jars: venv system-deps
	@$(BIN)/python -m ring.bench.kafka_tools >/dev/null || [ "$$CI" != true ]

# Two pytest-xdist workers: most of the suite waits on brokers, Spark and timers, not
# on a core. Each worker picks ports from its own slice and the Spark tests share one
# worker (tests/conftest.py); TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
XDIST_ARGS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
test: venv system-deps spark-kafka-jars kafka-tools-jars
	PYTEST_ADDOPTS="$(XDIST_ARGS) $$PYTEST_ADDOPTS" $(BIN)/python -m pytest

# The peers' clients and the plot need the `bench` extra; NATS and RabbitMQ
# themselves are installed with apt-get by `ring bench` when missing, Apache
# Kafka from Maven Central with mvn (cached under ~/.cache/ring-bench).
bench: venv
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/ring bench

# Three brokers in the background: ring-N serves clients on 9250+10N and peers
# on the next port, data in var/ring-N, log var/ring-N.log, PID var/ring-N.pid;
# the secret is RING_CLUSTER_SECRET or the one kept in var/cluster-secret.
# `$(BIN)/python -m ring.localcluster status` shows them.
cluster: venv
	$(BIN)/python -m ring.localcluster start

# SIGTERM to the PIDs in var/ring-N.pid only; needs no venv (stdlib only).
cluster-stop:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m ring.localcluster stop

clean:
	rm -rf $(VENV) var build *.egg-info .pytest_cache .hypothesis

# Faults against three real brokers with a checker (tests/chaos): every scenario at
# consistency one, quorum and all; writes the table in docs/RELIABILITY.md. Partitions
# use network namespaces and iptables when run as root (apt-get install iproute2
# iptables), else a fault-injecting proxy. CHAOS_ARGS="--short --scenario none" etc.
.PHONY: chaos
chaos: venv
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

# The shipped-broker simulation over many seeds of every run of its workload, in worker
# processes (tests/sim/sweep.py); prints each failing seed with the variable that replays
# it in the suite. SWEEP_ARGS="--seeds 1000 --jobs 2", "--runs membership --plant NAME" etc.
.PHONY: sim-sweep
sim-sweep: venv
	$(BIN)/python -m tests.sim.sweep $(SWEEP_ARGS)
