# kvops: the two first commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvops-installed
PYTEST_ARGS ?=

.PHONY: demo test lint unit lab clean help system-deps

help:
	@echo "make demo   set up .venv and run kvops ab-test on the embedded simulated engines"
	@echo "            (the three reference cases, then a num_prefixes campaign: where offload starts to pay)"
	@echo "make test   install missing system packages (as root), set up .venv (dev extras), whole suite + lint"
	@echo "            (the lab tier as two pytest processes beside one for the other tiers)"
	@echo "make lint   only the lint gates;  make unit   only the unit tier"
	@echo "make lab    (root) the local lab end to end: hosts, site.yml, deploy.yml, validate, smoke, ab-test --deploy"

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip

# --no-compile: pip would byte-compile all ~20,000 files of the extras (the Ansible collections
# most of them), on the path of every first `make test`; importing every library the tests and
# gates use compiles about 1,200 of them, once each, when first imported (tests/tiers.py writes
# bytecode). Measured interleaved here: the install took 30, 45 and 52 CPU-s against 38, 77 and
# 91 byte-compiled.
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing kvops and its dev extras into $(VENV) ..."
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile \
		-e '.[dev,plots]' \
		> $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	@touch $(STAMP)

# The three reference cases side by side, then the gain appearing as the shared prefixes' KV
# outgrows the GPU KV cache (a campaign over num_prefixes=5..40, each point predicted first
# and scored after; about 1.5 minutes on 2 cores, the whole demo under 3).
demo: $(STAMP)
	@$(BIN)/kvops ab-test --scenario all --scale 0.1 --out runs/demo --overwrite
	@$(BIN)/kvops ab-test --sweep-preset multi-shared-prefix --scale 0.02 \
		--out runs/demo-campaign --overwrite

lint: $(STAMP)
	@$(BIN)/ruff check kvops tests benchmarks
	@$(BIN)/ruff format --check kvops tests benchmarks
	@$(BIN)/mypy
	@$(BIN)/yamllint -s .
	@PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-lint -q

unit: $(STAMP)
	@$(BIN)/pytest -q -m unit $(PYTEST_ARGS)

system-deps:
	@scripts/system-deps.sh

# The lab tier (two processes) beside the other three (one), in parallel (tests/tiers.py): each log is
# printed whole when it ends, then the slowest 20 tests of the whole suite; fails if any fails.
# The lint gates run beside the tier groups (tests/tiers.py --gate): a failure still stops the run
# within a minute, and their one busy core no longer delays the first test. The system packages
# and .venv are its --setup: they install while the engine tier's virtualenv starts installing
# in the background, so tiers.py runs on the system's python3 (it needs only the standard library).
test:
	@$(PYTHON) tests/tiers.py --setup scripts/system-deps.sh \
		--setup '$(MAKE) --no-print-directory $(STAMP)' --pytest $(BIN)/pytest \
		--gate '$(MAKE) --no-print-directory lint' -- $(PYTEST_ARGS)

lab: $(STAMP)
	@$(BIN)/kvops lab demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache runs
