# syntax=docker/dockerfile:1
# The control image: `asrpool operator` and `asrpool route`. Slim: no torch, no moshi
# (router and operator never import the model stack). Build from the repository root:
#   docker build -f docker/control.Dockerfile -t ghcr.io/asrpool/asrpool-control:0.1.0 .
# or, without Docker and without pulling anything: tools/images/build control
# BASE_IMAGE: any Debian bookworm with python3 (3.11) and its venv module; tools/images/build
# passes its own, made by mmdebstrap. Every stage installs into a venv, never system-wide
# (Debian's python3 refuses that, PEP 668).
ARG BASE_IMAGE=python:3.11.11-slim-bookworm

# The pins, from pyproject.toml less the model stack: a stage of its own, so that the
# final stage's dependency layer is rebuilt only when the pins change.
FROM ${BASE_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml ./
COPY docker/requirements.py docker/requirements.py
RUN python3 docker/requirements.py control pyproject.toml > /requirements.txt

FROM ${BASE_IMAGE} AS wheel
# PIP_CERT: a CA bundle for pip where the index is reached through a TLS proxy; the
# bundle is mounted into the build by tools/images/build, never copied into the image.
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
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/asrpool \
    PATH=/opt/asrpool/bin:$PATH
COPY --from=requirements /requirements.txt /opt/requirements.txt
RUN python3 -m venv /opt/asrpool \
 && pip install --requirement /opt/requirements.txt \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin asrpool
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/asrpool-*.whl \
 && rm -rf /wheels
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["asrpool"]
CMD ["route"]
