"""The commands, flags and ``ASRPOOL_*`` variables in the rendered manifests are the ones
the code reads: parsed by the real ``asrpool`` parser and loaded into the real settings
classes through the same functions the commands use. The server pods are the
operator's: the operator, configured as the chart configures it, builds them here."""

from __future__ import annotations

import argparse
import base64
from typing import Any

import pytest

from asrpool.common import redis_acl, redis_clients, seeds
from asrpool.operator import children, pools
from asrpool.operator import cli as operator_cli
from asrpool.operator import settings as operator_settings
from asrpool.router import app as router_app
from asrpool.router import cli as router_cli
from asrpool.router import settings as router_settings
from asrpool.server import settings as server_settings
from tests.chart import rendering
from tests.chart.containers import Environ, check_fields, parse, resolve_env
from tests.chart.scenarios import SCENARIOS


def _rendered(scenario: str, deployment: str, settings_class: type, command: str,
              environ: Environ) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The Deployment's container, its env checked against ``settings_class`` and set."""
    manifests = rendering.render(SCENARIOS[scenario])
    container = rendering.container(rendering.deployment(manifests, deployment))
    env = resolve_env(container)
    check_fields(env, settings_class)
    args = parse(container)
    assert args.command == command
    environ(env)
    return args, container


def operator_from(scenario: str, environ: Environ) -> tuple[operator_settings.OperatorSettings,
                                                          dict[str, Any]]:
    args, container = _rendered(scenario, "operator", operator_settings.OperatorSettings,
                                "operator", environ)
    return operator_cli.load_settings(args), container


def router_from(scenario: str, environ: Environ) -> tuple[router_settings.RouterSettings,
                                                      dict[str, Any]]:
    args, container = _rendered(scenario, "router", router_settings.RouterSettings, "route",
                                environ)
    config: router_settings.RouterSettings = router_cli.settings_from(args)
    return config, container


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_operator_reads_its_rendered_command_and_environment(
    scenario: str, environ: Environ
) -> None:
    config, container = operator_from(scenario, environ)
    values = rendering.chart().merge_values(SCENARIOS[scenario])
    image = values["images"]["server"]
    assert config.default_image == f"{image['repository']}:{image['tag'] or '0.1.0'}"
    assert config.all_namespaces == values["operator"]["allNamespaces"]
    assert config.termination_margin_seconds == values["operator"]["terminationMarginSeconds"]
    assert config.log_level == values["operator"]["logLevel"]
    probe = container["livenessProbe"]["httpGet"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}[probe["port"]]
    assert config.liveness_endpoint == f"http://0.0.0.0:{port}{probe['path']}"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_router_reads_its_rendered_command_and_environment(
    scenario: str, environ: Environ
) -> None:
    config, container = router_from(scenario, environ)
    values = rendering.chart().merge_values(SCENARIOS[scenario])["router"]
    assert config.policy == values["policy"]
    assert config.default_pool == values["defaultPool"]
    assert config.resume_grace_seconds == values["resumeGraceSeconds"]
    assert (config.queue_max, config.queue_max_per_key) == (values["queueMax"],
                                                            values["queueMaxPerKey"])
    assert (config.new_streams_per_second, config.new_streams_burst,
            config.forwarded_allow_ips) == (
        values["newStreamsPerSecond"], values["newStreamsBurst"], values["forwardedAllowIps"])
    assert config.connection_limits.allowed_origins == tuple(
        origin.strip() for origin in values["allowedOrigins"].split(",") if origin.strip())
    assert config.members_required  # a heartbeat alone is never a pod
    assert config.gpu_hour_price == values.get("gpuHourPrice")  # null drops the key
    assert config.gpus_per_pod == values["gpusPerPod"]
    assert config.workers == values["workers"]
    assert config.port == container["ports"][0]["containerPort"]
    assert config.router_id == "from-metadata.name"
    assert config.pool_namespace == rendering.NAMESPACE  # bare pool names: this namespace


def test_the_router_probes_and_the_operator_redis_are_real(environ: Environ) -> None:
    config, container = router_from("defaults", environ)
    paths = {getattr(route, "path", None) for route in router_app.create_app(config).routes}
    assert {container["readinessProbe"]["httpGet"]["path"],
            container["livenessProbe"]["httpGet"]["path"]} <= paths
    assert config.redis_url == \
        "redis://asrpool-router@demo-asrpool-redis.asr-system.svc.cluster.local:6379/0"


def test_an_external_redis_password_comes_from_its_secret_never_in_a_url(
    environ: Environ,
) -> None:
    """Router, operator and (through the operator) every server pod read the one password
    of an external Redis from its Secret; no URL, argument or ConfigMap carries it."""
    secret, key = "redis-credentials", "redis-password"
    config, _ = router_from("external-redis-with-password", environ)
    assert config.redis_password_value() == f"secret-{secret}-{key}"
    operator, _ = operator_from("external-redis-with-password", environ)
    assert operator.redis_password_value() == config.redis_password_value()
    assert not redis_clients.has_password(config.redis_url)
    assert (operator.redis_password_secret, operator.redis_password_secret_key) == (secret, key)
    assert operator.redis_password_seed is None  # one trust domain: no users made there
    manifests = rendering.render(SCENARIOS["external-redis-with-password"])
    assert not any(m["kind"] == "ConfigMap" and "REDIS_PASSWORD" in str(m) for m in manifests)


def test_an_external_redis_cluster_reaches_every_part_as_a_cluster_url(
    environ: Environ,
) -> None:
    """The router, the operator and (through the operator) every server pod get the
    ``redis+cluster://`` URL as it was given: each part's client is then a cluster's."""
    url = SCENARIOS["external-redis-cluster"]["redis"]["external"]["url"]
    config, _ = router_from("external-redis-cluster", environ)
    operator, _ = operator_from("external-redis-cluster", environ)
    assert config.redis_url == operator.redis_url == operator.server_redis_url == url
    assert redis_clients.is_cluster(config.redis_url)


def test_the_built_in_redis_under_sentinel_reaches_the_server_pods_as_a_sentinel_url(
    environ: Environ,
) -> None:
    """redis.sentinel.enabled: the operator gives the pods it builds the sentinels' URL,
    with their namespace's user, which the server's settings load."""
    operator, _ = operator_from("redis-sentinel", environ)
    assert redis_clients.is_sentinel(operator.redis_url)
    pool = pools.from_body({"metadata": {"name": "stt-en", "namespace": "speech"},
                            "spec": {"model": {"name": "kyutai/stt-2.6b-en"}, "slots": 16}})
    built = children.build_all(pool, operator)
    config_map = next(c for c in built if c["kind"] == "ConfigMap")
    server = rendering.container(next(c for c in built if c["kind"] == "Deployment"))
    env = resolve_env(server, {config_map["metadata"]["name"]: config_map["data"]})
    environ(env)
    loaded = server_settings.ServerSettings()
    assert loaded.redis_url == redis_clients.with_username(operator.redis_url,
                                                           redis_acl.pod_user("speech"))
    where = redis_clients.sentinel_address(loaded.redis_url)
    assert (len(where.sentinels), where.service, where.username) == (
        3, "asrpool", redis_acl.pod_user("speech"))
    assert where.sentinels == redis_clients.sentinel_address(operator.redis_url).sentinels


def test_the_built_in_redis_has_a_user_per_part_and_its_credentials_stay_in_its_namespace(
    environ: Environ,
) -> None:
    """The router and the operator each log in as their own user with their own
    password; the operator gets the pods' seed (and no shared Secret to hand them); the
    credentials exist in the release namespace alone."""
    manifests = rendering.render(SCENARIOS["defaults"])
    (secret,) = [s for s in rendering.find(manifests, "Secret")
                 if s["metadata"]["name"] == "demo-asrpool-redis"]
    assert secret["metadata"]["namespace"] == rendering.NAMESPACE
    assert set(secret["data"]) == {"operator-password", "router-password", "pods-seed"}
    assert all(len(value) > 40 for value in secret["data"].values())  # 40 random, base64
    assert len(set(secret["data"].values())) == 3
    router, _ = router_from("defaults", environ)
    operator, _ = operator_from("defaults", environ)
    assert router.redis_password_value() == "secret-demo-asrpool-redis-router-password"
    assert operator.redis_password_value() == "secret-demo-asrpool-redis-operator-password"
    assert operator.redis_url.startswith("redis://asrpool-operator@")
    assert operator.redis_password_seed is not None
    assert operator.redis_password_seed.get_secret_value() == "secret-demo-asrpool-redis-pods-seed"
    assert operator.redis_password_secret is None


def test_the_built_in_redis_turns_its_default_user_off() -> None:
    manifests = rendering.render(SCENARIOS["defaults"])
    redis = rendering.container(rendering.one(manifests, "StatefulSet", "demo-asrpool-redis"))
    script = redis["args"][0]
    assert "redis-server -" in script and "user default off" in script
    assert "user asrpool-operator on >$OPERATOR_PASSWORD" in script
    assert "user asrpool-router on >$ROUTER_PASSWORD ~asrpool:*" in script
    assert {e["name"] for e in redis["env"]} == {"OPERATOR_PASSWORD", "ROUTER_PASSWORD",
                                                "REDISCLI_AUTH"}
    assert redis["readinessProbe"]["exec"]["command"] == [
        "redis-cli", "--user", "asrpool-operator", "ping"]


def test_api_keys_reach_the_router_as_the_file_it_loads(environ: Environ) -> None:
    config, container = router_from("api-keys", environ)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(config.api_keys_file) == f"{mounts['api-keys']}/clients.yaml"
    secret = rendering.one(rendering.render(SCENARIOS["api-keys"]), "Secret",
                           "demo-asrpool-api-keys")
    assert set(secret["stringData"]) == {"clients.yaml"}


def test_by_default_the_router_needs_a_key_the_chart_generated(
        environ: Environ, tmp_path: Any) -> None:
    """Keys are on unless turned off; with none listed the chart generates one, whose
    digest is the router's key file and whose plain text the admin reads from the
    Secret (never mounted in the router). (Keys were off by default.)"""
    from asrpool.common import auth

    manifests = rendering.render({})
    secret = rendering.one(manifests, "Secret", "demo-asrpool-api-keys")
    plain = secret["stringData"]["generated-key"]
    assert len(plain) == 40 and plain.isalnum()
    path = tmp_path / "keys.yaml"
    path.write_text(secret["stringData"]["keys.yaml"])
    ring = auth.load_keys(path)
    assert [k.id for k in ring.keys] == ["generated"] and ring.find(plain) is not None
    config, _ = router_from("defaults", environ)
    assert config.api_keys_file is not None and config.api_keys_file.name == "keys.yaml"
    deployment = rendering.one(manifests, "Deployment", "demo-asrpool-router")
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"]
                 if v["name"] == "api-keys"]
    assert volume["secret"]["items"] == [{"key": "keys.yaml", "path": "keys.yaml"}]


def test_keys_turned_off_leave_the_router_open(environ: Environ) -> None:
    config, container = router_from("open-router", environ)
    assert config.api_keys_file is None
    assert "api-keys" not in {m["name"] for m in container["volumeMounts"]}
    manifests = rendering.render(SCENARIOS["open-router"])
    assert not [m for m in manifests if m["kind"] == "Secret" and "api-keys" in
                m["metadata"]["name"]]


def test_the_api_key_secret_is_the_format_the_router_loads(tmp_path: Any) -> None:
    from asrpool.common import auth

    secret = rendering.one(rendering.render(SCENARIOS["api-keys"]), "Secret",
                           "demo-asrpool-api-keys")
    path = tmp_path / "clients.yaml"
    path.write_text(secret["stringData"]["clients.yaml"])
    ring = auth.load_keys(path)
    assert [(k.id, k.max_streams) for k in ring.keys] == [("team-a", 8), ("team-b", None)]
    assert ring.find("password") is not None and ring.find("hunter2") is None


def test_the_server_pods_the_operator_builds_read_their_command_and_environment(
    environ: Environ,
) -> None:
    """The chart configures the operator; the operator builds the server pods."""
    config, _ = operator_from("example-pool", environ)
    manifest = rendering.one(rendering.render(SCENARIOS["example-pool"]), "StreamingASRPool")
    # Every optional variable too: a model revision and API keys on the pods.
    manifest["spec"]["model"]["revision"] = "main"
    manifest["spec"]["auth"] = {"apiKeysSecret": {"name": "keys"}}
    pool = pools.from_body(manifest)
    built = children.build_all(pool, config)
    config_map = next(c for c in built if c["kind"] == "ConfigMap")
    # The pool's own pod token and its namespace's Redis password.
    secrets = {c["metadata"]["name"]: {k: base64.b64decode(v).decode()
                                       for k, v in c["data"].items()}
               for c in built if c["kind"] == "Secret"}
    assert set(secrets) == {"stt-first-pod-token", "stt-first-redis"}
    server = rendering.container(next(c for c in built if c["kind"] == "Deployment"))
    args = parse(server)
    assert args.command == "serve"
    assert "envFrom" not in server  # each variable its own env entry: none can be replaced
    env = resolve_env(server, {config_map["metadata"]["name"]: config_map["data"]}, secrets)
    check_fields(env, server_settings.ServerSettings)
    environ(env)
    loaded = server_settings.ServerSettings()
    assert loaded.pool == "asr-system/stt-first" and loaded.batch_size == 32
    assert loaded.pod_id == "from-metadata.namespace/from-metadata.name"
    assert loaded.redis_url == redis_clients.with_username(
        config.server_redis_url, redis_acl.pod_user(rendering.NAMESPACE))
    assert loaded.announce_pool is False
    assert loaded.redis_password_value() == seeds.redis_password(
        "secret-demo-asrpool-redis-pods-seed", rendering.NAMESPACE)
    # The token the chart's routers send to this pool, derived from the same seed.
    router, _ = router_from("example-pool", environ)
    assert loaded.pod_token is not None
    assert loaded.pod_token.get_secret_value() == router.pod_token_for(loaded.pool)
    assert router.pod_token_for("elsewhere/stt-first") != router.pod_token_for(loaded.pool)
    assert {"ASRPOOL_MODEL_REVISION", "ASRPOOL_API_KEYS_FILE"} <= set(env)
    assert server["image"] == config.default_image == "ghcr.io/asrpool/asrpool:0.1.0"
