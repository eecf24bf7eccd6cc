# Quick start: `make demo` and `make test`. Both create .venv on first use and
# reuse it while pyproject.toml is unchanged.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck layers unit openstack deploy-tools check-deploy bench clean lab lab-down

$(STAMP): pyproject.toml tests/harness/pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sco demo

lint: $(STAMP)
	$(BIN)/ruff check --no-cache src tests bench
	$(BIN)/ruff format --no-cache --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy --strict src/sco tests/harness/sco_harness

layers: $(STAMP)
	$(BIN)/lint-imports

# The services the integration tiers start: MariaDB and RabbitMQ from Debian and
# Nova/Placement/Glance/Neutron in their own pinned virtualenv (cached under
# ~/.cache/sco); PostgreSQL, Patroni and etcd from Debian; Slurm and munge from
# Debian. Installed here so the test run shows it as a step; the fixtures start
# them.
openstack:
	bash scripts/openstack/install.sh >/dev/null
	bash scripts/postgres/install-patroni.sh >/dev/null
	bash scripts/slurm/install.sh >/dev/null

# promtool, helm and headless Chromium for the deployment checks (tests/test_deploy.py).
deploy-tools:
	bash scripts/deploy/install.sh >/dev/null

# The deployment, on its own (`make test` runs it with everything else): the alert
# rules (promtool check and unit tests; metrics and labels against what sco
# exports), the Helm chart (lint; render with default and production values; every
# object against the Kubernetes schemas) and the image's Containerfile.
check-deploy: $(STAMP) deploy-tools
	$(BIN)/pytest tests/test_deploy.py

unit: $(STAMP) openstack deploy-tools
	$(BIN)/pytest -n 2

test: lint typecheck layers unit

bench: $(STAMP)
	$(BIN)/python bench/simulate.py
	$(BIN)/python bench/exclusion.py
	$(BIN)/python bench/scorer.py
	$(BIN)/python bench/planner.py
	$(BIN)/python bench/openstack_tier.py
	$(BIN)/python bench/chaos.py
	$(BIN)/python bench/failover.py
	$(BIN)/python bench/controlplane.py
	$(BIN)/python bench/slurm.py
	$(BIN)/python bench/slurm_replay.py
	$(BIN)/python bench/distributor.py
	$(BIN)/python bench/cycle.py
	$(BIN)/python bench/kube_intake.py
	$(BIN)/python bench/faults.py
	$(BIN)/python bench/fuzz.py
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/replay.py

clean:
	rm -rf $(VENV) reports .pytest_cache .mypy_cache .ruff_cache

# A region in a box: a local OpenStack (Nova with fake computes, Placement, Glance,
# Neutron's API), OpenBao with sco's credential, a Slurm controller whose nodes are
# sco's servers, a Kubernetes stand-in, node agents, and sco's control plane (two
# replicas, watcher, history loader, distributor, status page) under one supervisor,
# one log (.lab/lab.log).
# Prints every endpoint; docs/tour.md is what to do next. `make lab-down` stops it.
lab: $(STAMP) openstack
	$(BIN)/python -m sco_harness.lab up .lab

lab-down: $(STAMP)
	$(BIN)/python -m sco_harness.lab down .lab
