# syntax=docker/dockerfile:1
# The chart's Redis (its StatefulSet, redis.enabled): Debian's redis-server and
# redis-cli, run as uid/gid 999 as the chart's podSecurityContext sets. The chart starts
# it with `sh -c 'exec redis-server - ...'` (the password on standard input) and probes
# it with `redis-cli ping`, so sh and redis-cli are here. Build from the repository root:
#   docker build -f docker/redis.Dockerfile -t localhost/asrpool/redis:7.0 .
# or, without Docker and without pulling anything: tools/images/build redis
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE}
# The user first, with the chart's ids: the package's postinst keeps an existing system
# user named redis.
RUN groupadd --system --gid 999 redis \
 && useradd --system --uid 999 --gid 999 --no-create-home --home-dir /data \
      --shell /usr/sbin/nologin redis \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install --yes --no-install-recommends \
      redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data \
 && chown 999:999 /data
WORKDIR /data
VOLUME ["/data"]
USER 999:999
EXPOSE 6379
CMD ["redis-server", "--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", "/data"]
