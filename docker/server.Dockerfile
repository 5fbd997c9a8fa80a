# syntax=docker/dockerfile:1
# The server pod image: CUDA runtime, torch and moshi as pinned in pyproject.toml, and
# asrpool. The operator runs it as `asrpool serve`. Build from the repository root:
#   docker build -f docker/server.Dockerfile -t ghcr.io/asrpool/asrpool:0.1.0 .
# Model weights are not baked in: they download on first start into HF_HOME (/models),
# a volume; mount a persistent or node-local volume there to download once per node.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY asrpool asrpool
COPY server server
COPY router router
COPY operator operator
COPY bench bench
COPY plan plan
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${CUDA_IMAGE}
# Kept equal to the pins in pyproject.toml (a test checks); torch's PyPI wheels for
# Linux x86_64 are built for CUDA 12.8, as the base image.
ARG TORCH_VERSION=2.9.1
ARG MOSHI_VERSION=0.2.13
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/asrpool \
    PATH=/opt/asrpool/bin:$PATH \
    HF_HOME=/models
RUN apt-get update \
 && apt-get install --yes --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/asrpool \
 && pip install "torch==${TORCH_VERSION}" "moshi==${MOSHI_VERSION}"
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/asrpool-*.whl \
 && rm -rf /wheels \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin asrpool \
 && mkdir -p /models \
 && chown 10001:10001 /models
VOLUME ["/models"]
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["asrpool"]
CMD ["serve"]
