# Everything the project needs is installed into .venv by `make install`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: install run test test-unit test-integration bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The whole mesh on one machine: embedded nats-server, directory store, default model.
run: install
	$(VENV)/bin/dualpath up $(ARGS)

test: install
	$(PY) -m pytest $(ARGS)

test-unit: install
	$(PY) -m pytest -m "unit or model" $(ARGS)

test-integration: install
	$(PY) -m pytest -m integration $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
