# syntax=docker/dockerfile:1
# The control image: `asrpool operator` and `asrpool route`. Slim: no torch, no moshi
# (router and operator never import the model stack). Build from the repository root:
#   docker build -f docker/control.Dockerfile -t ghcr.io/asrpool/asrpool-control:0.1.0 .
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
COPY docker/requirements.py docker/requirements.py
# The project as a wheel, and its pins from pyproject.toml less the model stack.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python docker/requirements.py control pyproject.toml > /wheels/requirements.txt

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels /wheels
RUN pip install --requirement /wheels/requirements.txt \
 && pip install --no-deps /wheels/asrpool-*.whl \
 && rm -rf /wheels \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin asrpool
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["asrpool"]
CMD ["route"]
