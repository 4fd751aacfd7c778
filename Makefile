# The only entry points a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= dev,spark

.PHONY: venv demo test bench cluster cluster-stop clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	@touch $@

demo: venv
	$(BIN)/python -m ring.demo

test: venv
	$(BIN)/python -m pytest

bench: venv
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
