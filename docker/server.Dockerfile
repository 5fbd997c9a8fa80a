# syntax=docker/dockerfile:1
# The server pod image: torch and moshi as pinned in pyproject.toml, and asrpool. The
# operator runs it as `asrpool serve`. Build from the repository root:
#   docker build -f docker/server.Dockerfile -t ghcr.io/asrpool/asrpool:0.1.0 .
# or, without Docker and without pulling anything: tools/images/build server
# No CUDA base image: torch's PyPI wheel for Linux x86_64 carries its CUDA 12.8 libraries
# as nvidia-* wheels (cuBLAS, cuDNN, NCCL, ...), and needs from the host only the
# driver's libcuda.so.1, which the NVIDIA container toolkit mounts into GPU containers
# (docs/images.md shows the evidence). So the server builds FROM the same slim base as
# the control image.
# Model weights are not baked in: they download on first start into HF_HOME (/models),
# a volume; mount a persistent or node-local volume there to download once per node.
ARG BASE_IMAGE=python:3.11.11-slim-bookworm

# The pins (pyproject.toml's, torch and moshi kept equal to them: a test checks), resolved
# by pip into the layers of the final stage (docker/requirements.py layers): a stage of its
# own, so that those layers are rebuilt only when the pins change.
# WHEELHOUSE: a folder of wheels that tools/images/build mounts from its cache, so that
# torch and its CUDA wheels (some 4 GB) download once per machine: `pip download` keeps
# what is already there, and every install reads only that folder. Unset (docker build),
# pip installs from the index. No pip cache is kept (PIP_NO_CACHE_DIR).
FROM ${BASE_IMAGE} AS requirements
ARG TORCH_VERSION=2.9.1
ARG MOSHI_VERSION=0.2.13
ARG PIP_CERT
ARG WHEELHOUSE
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY docker/requirements.py docker/requirements.py
RUN python3 docker/requirements.py server pyproject.toml > /requirements.txt \
 && printf '%s\n' "torch==${TORCH_VERSION}" "moshi==${MOSHI_VERSION}" >> /requirements.txt \
 && python3 -m venv /opt/resolve \
 && if [ -n "${WHEELHOUSE:-}" ]; then \
      /opt/resolve/bin/pip download --quiet --dest "$WHEELHOUSE" --requirement /requirements.txt; \
    fi \
 && /opt/resolve/bin/pip install --dry-run --quiet --report /resolved.json \
      ${WHEELHOUSE:+--no-index --find-links "$WHEELHOUSE"} --requirement /requirements.txt \
 && python3 docker/requirements.py layers /resolved.json > /layers.txt

FROM ${BASE_IMAGE} AS wheel
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY asrpool asrpool
COPY server server
COPY router router
COPY operator operator
COPY bench bench
COPY plan plan
COPY crds crds
RUN /opt/build/bin/pip wheel --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE}
ARG PIP_CERT
ARG WHEELHOUSE
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/asrpool \
    PATH=/opt/asrpool/bin:$PATH \
    HF_HOME=/models
COPY --from=requirements /requirements.txt /layers.txt /opt/
# Some 7.8 GB of packages in four layers, none over about 2.7 GB: committing a layer takes
# twice its size in temporary disk, so one layer of it all needed 20 GB free to build.
# Each of the first three installs one line of /opt/layers.txt (CUDA libraries, torch)
# without dependencies; the fourth installs the requirements, which finds those in place.
# The wheelhouse is filled again first (a no-op when it holds them all), in case it was
# emptied while the requirements stage stayed cached.
RUN python3 -m venv /opt/asrpool \
 && if [ -n "${WHEELHOUSE:-}" ]; then \
      pip download --quiet --dest "$WHEELHOUSE" --requirement /opt/requirements.txt; \
    fi \
 && sed -n 1p /opt/layers.txt | xargs -r pip install --no-deps \
      ${WHEELHOUSE:+--no-index --find-links "$WHEELHOUSE"}
RUN sed -n 2p /opt/layers.txt | xargs -r pip install --no-deps \
      ${WHEELHOUSE:+--no-index --find-links "$WHEELHOUSE"}
RUN sed -n 3p /opt/layers.txt | xargs -r pip install --no-deps \
      ${WHEELHOUSE:+--no-index --find-links "$WHEELHOUSE"}
RUN pip install ${WHEELHOUSE:+--no-index --find-links "$WHEELHOUSE"} \
      --requirement /opt/requirements.txt \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin asrpool \
 && mkdir -p /models \
 && chown 10001:10001 /models
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/asrpool-*.whl \
 && rm -rf /wheels
VOLUME ["/models"]
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["asrpool"]
CMD ["serve"]
