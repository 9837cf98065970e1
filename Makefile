# shadow-ab: the commands the README names. Each target does its own set-up on a fresh machine:
# it makes the project venv .venv/ with $(PYTHON) -m venv (a stock Debian python3 refuses
# `pip install` outside a venv, PEP 668), installs the package into it, and runs in it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP_FLAGS ?= --disable-pip-version-check -q
# Installing again only when pyproject.toml changed (the install is editable: code changes need none).
INSTALLED := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install services services-down engines check test demo bench-ingest bench-mirror

install: $(INSTALLED)

# Debian ships venv and ensurepip apart from python3, in python3-venv. A failed attempt leaves
# no half-made venv behind, so the next run starts over.
$(BIN)/python:
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "make: $(PYTHON) has no venv module: installing Debian's python3-venv with apt-get"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv >/dev/null && \
	  echo "make: installed python3-venv"; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install $(PIP_FLAGS) -e '.[dev]'
	touch $@

services: install
	$(BIN)/shadow-ab services up

services-down: install
	$(BIN)/shadow-ab services down

# Real vLLM's CPU build for the real_engine tests: a pinned 6.3 GB venv and a tiny model under
# var/ (about 7 minutes the first time, then a check of a second or two). On a machine that
# cannot run it (not x86-64 Linux with AVX2) it fails saying so: run pytest -m "not real_engine".
engines: install
	$(BIN)/shadow-ab engine vllm prepare

check: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two pytest-xdist workers for everything but the real-engine tests: the suite waits on
# simulators, Kafka and PostgreSQL as much as it computes. The real-engine tests run after, in
# one process, so the two vLLM engines (one CPU each) start once. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: services engines
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not real_engine"
	$(BIN)/python -m pytest -q -m real_engine

demo: install
	$(BIN)/shadow-ab demo

bench-ingest: services
	$(BIN)/python bench/ingest.py

# Needs no services: simulators, the mirror (SQLite sink) and a private nginx (installed if absent).
bench-mirror: install
	$(BIN)/python bench/mirror_overhead.py
