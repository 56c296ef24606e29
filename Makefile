# The two set-up commands (README, quick start), each complete on a fresh machine:
#   make demo   the main job: install everything, then the whole flow on a local Consul cluster
#               (cluster up, render, apply, worker configs, two runners competing, verify)
#   make test   the whole suite: install everything, then lint, format check, types, tests, and
#               the Vagrant flow on real VMs (root; about 13 more minutes)
#   make check  the same without the VMs, for quick rounds while developing
#   make unit   the pure and unit tests only, no cluster (about a minute): the fastest answer
#   make image  the OCI image lockctl:VERSION in podman's local store (root; docs/image.md)
#   make dist   the wheel a worker installs and the sdist, in dist/ (docs/deploy.md)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo test check unit dist dashboard consul test-packages image image-packages down clean vagrant-verify

demo: $(STAMP) consul
	scripts/demo

test: $(STAMP) consul test-packages
	scripts/check

check: $(STAMP) consul test-packages
	LOCKCTL_SKIP_VMS=1 scripts/check

unit: $(STAMP) test-packages
	$(BIN)/pytest -q -n 2 tests/unit -m "not cluster"

# dist/ holds this build only: a wheel left from an older version would be copied by mistake
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# dashboards/lockctl.json, the Grafana dashboard, from dashboards/build.py (docs/dashboard.md):
# commit the result; a unit test fails while the committed file is not what the builder makes
dashboard: $(STAMP)
	$(BIN)/python dashboards/build.py

consul:
	scripts/install-consul

# Debian packages the tests use (libfaketime, Prometheus, Alertmanager, and the image's tools for
# tests/integration/test_image.py): installed when missing (root, apt-get)
test-packages: image-packages
	scripts/install-test-packages

# mmdebstrap, buildah, podman, runc: what image/build and image/podman use (root, apt-get)
image-packages:
	scripts/install-image-packages

# Root: the OCI image lockctl:VERSION from Debian's packages and the checkout's wheels, cached
# (a first build takes about a minute, an unchanged one seconds); see docs/image.md
image: $(STAMP) image-packages
	image/build

# Root, ~10 min: real VMs (libvirt + QEMU in a network namespace), see docs/vagrant.md; `make test`
# runs it too, through tests/vagrant.
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
