# The two set-up commands (README, quick start), each complete on a fresh machine:
#   make demo   the main job: install everything, then the whole flow on a local Consul cluster
#               (cluster up, render, apply, worker configs, two runners competing, verify)
#   make test   the whole suite: install everything, then lint, format check, types, tests
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo test check consul down clean vagrant-verify

demo: $(STAMP) consul
	scripts/demo

test: $(STAMP) consul
	scripts/check

check: $(STAMP)
	scripts/check

consul:
	scripts/install-consul

# Opt-in, root, ~10 min: real VMs (libvirt + QEMU in a network namespace), see docs/vagrant.md.
vagrant-verify: $(STAMP) consul
	scripts/vagrant-verify

down: $(STAMP)
	$(BIN)/lockctl cluster down

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

clean: down
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache
