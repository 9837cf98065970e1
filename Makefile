# shadow-ab: the commands the README names. Each target does its own set-up on a fresh machine.
PYTHON ?= python3
PIP_FLAGS ?= --disable-pip-version-check -q

.PHONY: install services services-down check test demo bench-ingest bench-mirror

install:
	$(PYTHON) -m pip install $(PIP_FLAGS) -e '.[dev]'

services: install
	shadow-ab services up

services-down:
	shadow-ab services down

check: install
	ruff format --check .
	ruff check .
	mypy

test: services
	$(PYTHON) -m pytest -q

demo: install
	shadow-ab demo

bench-ingest: services
	$(PYTHON) bench/ingest.py

# Needs no services: simulators, the mirror (SQLite sink) and a private nginx (installed if absent).
bench-mirror: install
	$(PYTHON) bench/mirror_overhead.py
