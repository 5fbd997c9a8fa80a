# The two commands a newcomer runs: `make demo` and `make test`.
# Each creates the virtual environment and installs what it needs by itself.

PYTHON ?= python3
# The checkout's operator/ would shadow the standard library's operator module for any
# Python started here that puts the working directory on sys.path (Debian's python3 does
# so before it imports collections, so even `python3 -m venv` failed): never put it there.
export PYTHONSAFEPATH := 1
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test prerequisites lint typecheck unit system-deps cluster-binaries images clean \
  node-clients promtool \
  parity parity-deps

# The product with its dev extras, and the developers' harness (harness/: experiments,
# the local control plane), which only the tests and benchmarks need.
$(STAMP): pyproject.toml harness/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./harness
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/asrpool demo

test: prerequisites
	$(MAKE) lint typecheck unit

# What the tests need, made side by side: each is cached per machine, and on a fresh
# one the Go build (CPU), pip's installs and the image builds (network, disk) overlap.
prerequisites: system-deps
	$(MAKE) -j3 $(STAMP) cluster-binaries images node-clients promtool

# promtool, which checks and unit-tests the chart's alert rules (tests/chart/test_alerts.py):
# taken out of Debian's prometheus package, not installed (no service, no users).
PROMTOOL_DIR := $(HOME)/.cache/asrpool/promtool
PROMTOOL := $(PROMTOOL_DIR)/usr/bin/promtool
promtool: $(PROMTOOL)
$(PROMTOOL):
	@mkdir -p $(PROMTOOL_DIR)/deb
	cd $(PROMTOOL_DIR)/deb && { apt-get download -qq prometheus 2>/dev/null \
	  || { apt-get update -qq && apt-get download -qq prometheus; }; }
	dpkg-deb -x $(PROMTOOL_DIR)/deb/prometheus_*.deb $(PROMTOOL_DIR)
	rm -rf $(PROMTOOL_DIR)/deb
	test -x $(PROMTOOL)

# OpenAI's official Node SDK, pinned (tests/node/package-lock.json), for the Node client's
# test (tests/router/test_realtime_node.py), from the npm registry.
NODE_CLIENTS := tests/node/node_modules/.package-lock.json
node-clients: $(NODE_CLIENTS)
$(NODE_CLIENTS): tests/node/package-lock.json
	cd tests/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

# The project's images (tests/images, tests/nodes), built without Docker and without
# pulling by tools/images/build; layers, the Debian base and torch's wheels are cached
# per machine (the first build takes about ten minutes, an unchanged one seconds).
images: system-deps
	tools/images/build

# The control-plane tests (tests/cluster) need kube-apiserver & co., built from source by
# Go and cached outside the repository (the first build takes about ten minutes), with
# the helm CLI and the Prometheus Operator's CRDs that the production guide's test uses.
# Without Go they skip with one line saying why; under CI=true that skip is a failure.
cluster-binaries:
	@if command -v go >/dev/null; then tools/cluster/build >/dev/null && tools/cluster/user-tools >/dev/null; \
	else echo "no Go toolchain: the control-plane tests (tests/cluster) will skip"; fi

# Debian packages the tests need, installed when missing: Chromium (the live page's
# test); image builders and a static libc for the pause image (tools/images/build,
# tests/images); a container runtime, CNI plugins and netfilter tools (the real nodes,
# tests/nodes; a registry the guide's test pushes the images to and the nodes pull from).
TEST_DEBS = chromium buildah podman runc mmdebstrap uidmap gcc libc6-dev curl skopeo docker-registry \
  containerd containernetworking-plugins nftables iptables conntrack iproute2 util-linux \
  busybox-static file
system-deps:
	@missing=$$(for p in $(TEST_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	  | grep -q 'ok installed' || echo $$p; done); [ -z "$$missing" ] || { \
	  echo "installing" $$missing "(Debian packages) for the tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }

# Parity with Kyutai's own moshi-server, behaviour by behaviour (docs/parity.md): not in
# CI (too long). `asrpool bench parity` builds moshi-server once with cargo (CPU, a pinned
# version, cached in ~/.cache/asrpool/moshi-server; the first build took 46 minutes here
# on two busy cores), then runs the catalogue against it, a pod and a router and writes
# bench/results/parity.json and docs/parity.md's table. Its crates need a C/C++
# toolchain, CMake (sentencepiece, libopus), OpenSSL's headers and pkg-config, and
# Python's shared library (pyo3); Rust itself comes from rustup (Debian's is too old).
PARITY_DEBS = build-essential cmake pkg-config libssl-dev python3-dev
parity-deps:
	@missing=$$(for p in $(PARITY_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	  | grep -q 'ok installed' || echo $$p; done); [ -z "$$missing" ] || { \
	  echo "installing" $$missing "(Debian packages) to build moshi-server"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }
	@command -v cargo >/dev/null || { echo "no cargo: install Rust with rustup to build moshi-server"; exit 1; }

parity: $(STAMP) parity-deps
	$(BIN)/asrpool bench parity

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache tests/node/node_modules
