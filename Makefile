# Quick start: `make demo` and `make test`. Both create .venv on first use and
# reuse it while pyproject.toml is unchanged.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck layers unit bench clean

$(STAMP): pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sco demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy --strict src/sco

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck layers unit

bench: $(STAMP)
	$(BIN)/python bench/simulate.py
	$(BIN)/python bench/exclusion.py
	$(BIN)/python bench/scorer.py
	$(BIN)/python bench/planner.py

clean:
	rm -rf $(VENV) reports .pytest_cache .mypy_cache .ruff_cache
