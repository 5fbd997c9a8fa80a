# The two commands a newcomer runs: `make demo` and `make test`.
# Each creates the virtual environment and installs what it needs by itself.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit system-deps cluster-binaries clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/asrpool demo

test: system-deps cluster-binaries lint typecheck unit

# The control-plane tests (tests/cluster) need kube-apiserver & co., built from source by
# Go and cached outside the repository (the first build takes about ten minutes).
# Without Go they skip with one line saying why; under CI=true that skip is a failure.
cluster-binaries:
	@if command -v go >/dev/null; then tools/cluster/build >/dev/null; \
	else echo "no Go toolchain: the control-plane tests (tests/cluster) will skip"; fi

# The live page's test drives Debian's Chromium; the real-node tests (tests/nodes) need
# a container runtime, CNI plugins, netfilter tools and image builders. Install what is
# missing.
NODE_DEBS = containerd runc containernetworking-plugins nftables iptables conntrack \
  iproute2 util-linux buildah skopeo busybox-static gcc libc6-dev file
system-deps:
	@command -v chromium >/dev/null || { \
	  echo "installing chromium (Debian package) for the live page test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@missing=$$(for p in $(NODE_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	  | grep -q 'ok installed' || echo $$p; done); [ -z "$$missing" ] || { \
	  echo "installing $$missing (Debian packages) for the real-node tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
