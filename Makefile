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

# The live page's test drives Debian's Chromium; the image tests (tools/images/build,
# tests/images) need buildah, podman, runc, mmdebstrap and a static libc for the pause
# image. Install what is missing (command:Debian package).
IMAGE_TOOLS := buildah:buildah podman:podman runc:runc mmdebstrap:mmdebstrap \
	newuidmap:uidmap gcc:gcc curl:curl
system-deps:
	@command -v chromium >/dev/null || { \
	  echo "installing chromium (Debian package) for the live page test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@missing=""; \
	for pair in $(IMAGE_TOOLS); do command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
	[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || missing="$$missing libc6-dev"; \
	[ -z "$$missing" ] || { \
	  echo "installing$$missing (Debian packages) for the image tests (tests/images)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
