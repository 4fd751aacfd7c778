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

clean:
	rm -rf $(VENV) var build *.egg-info .pytest_cache .hypothesis
