# The two commands the README starts with. Both set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench bench-quick probe

setup:
	@bash scripts/setup.sh

# The main job: a speculative generation on the default model, checked identical to plain.
demo: setup
	@$(PY) -m draftless demo

test: setup
	@$(PY) -m pytest -q

lint: setup
	@$(VENV)/bin/ruff check src tests benchmarks && $(VENV)/bin/ruff format --check src tests benchmarks && $(VENV)/bin/mypy

bench: setup
	@$(PY) -m draftless bench --out bench-out

bench-quick: setup
	@$(PY) -m draftless bench --quick --out bench-out

probe: setup
	@$(PY) -m draftless probe
