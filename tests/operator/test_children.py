"""The pure builders: a pool to its Deployment, Service, PodDisruptionBudget, ConfigMap."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pydantic
import pytest
import yaml

from asrpool.common import seeds
from asrpool.operator import children, naming, pools, settings, specs
from tests.operator import schemas

CONFIG = settings.OperatorSettings(namespaces=["speech"], redis_url="redis://redis:6379/0")


def pool(namespace: str = "speech", **spec: Any) -> pools.Pool:
    # A preset: what a repo or a volume adds is in tests/operator/test_sources.py.
    return pools.from_body({"metadata": {"name": "stt", "namespace": namespace}, "spec": {
        "model": {"name": "stt-1b-en_fr"}, "slots": 20, "slotsPerPod": 8, **spec}})


def deployment(**spec: Any) -> dict[str, Any]:
    return children.build_all(pool(**spec), CONFIG)[1]


def container(**spec: Any) -> dict[str, Any]:
    return deployment(**spec)["spec"]["template"]["spec"]["containers"][0]


def test_five_children_in_the_pool_namespace_with_its_labels() -> None:
    built = children.build_all(pool(), CONFIG)
    assert [(c["kind"], c["metadata"]["name"]) for c in built] == [
        ("ConfigMap", "stt-config"), ("Deployment", "stt"), ("Service", "stt"),
        ("PodDisruptionBudget", "stt"), ("NetworkPolicy", "stt")]
    for child in built:
        assert child["metadata"]["namespace"] == "speech"
        assert child["metadata"]["labels"] == {
            "app.kubernetes.io/name": "asrpool-server", "asrpool.io/pool": "stt",
            "app.kubernetes.io/instance": "stt", "app.kubernetes.io/managed-by": "asrpool-operator"}


def test_replicas_are_ceil_slots_over_slots_per_pod() -> None:
    assert deployment()["spec"]["replicas"] == 3
    assert deployment(slots=0)["spec"]["replicas"] == 0


def test_the_selector_matches_the_pod_labels() -> None:
    spec = deployment()["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"] == {"matchLabels": naming.selector("stt")}
    assert all(labels[key] == value for key, value in naming.selector("stt").items())


def test_rolls_add_a_pod_before_removing_one() -> None:
    assert deployment()["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def test_termination_grace_is_drain_grace_plus_the_margin() -> None:
    spec = deployment(drainGracePeriodSeconds=120)["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 120 + CONFIG.termination_margin_seconds
    config_map = children.build_config_map(pool(drainGracePeriodSeconds=120), CONFIG)
    assert config_map["data"]["ASRPOOL_DRAIN_GRACE_SECONDS"] == "120"


def test_the_server_settings_travel_in_the_config_map() -> None:
    config_map = children.build_config_map(pool(context=750, model={
        "name": "kyutai/stt-2.6b-en", "revision": "v1"}), CONFIG)
    assert config_map["data"] == {
        "ASRPOOL_MODEL": "kyutai/stt-2.6b-en", "ASRPOOL_MODEL_REVISION": "v1",
        "HF_HUB_CACHE": "/var/cache/asrpool/hub", "HF_HUB_OFFLINE": "1", "ASRPOOL_DTYPE": "auto",
        "ASRPOOL_BATCH_SIZE": "8", "ASRPOOL_CONTEXT": "750", "ASRPOOL_DEVICE": "cuda",
        "ASRPOOL_HOST": "0.0.0.0", "ASRPOOL_PORT": "8080", "ASRPOOL_POOL": "speech/stt",
        "ASRPOOL_REDIS_URL": "redis://redis:6379/0", "ASRPOOL_ANNOUNCE_POOL": "true",
        "ASRPOOL_DRAIN_GRACE_SECONDS": "60", "ASRPOOL_OPUS_WORKERS": "1",
        "ASRPOOL_INTAKE_WORKERS": "2", "ASRPOOL_ENGINE_PROCESS": "true"}


def test_opus_workers_reach_the_server() -> None:
    config_map = children.build_config_map(pool(opusWorkers=4), CONFIG)
    assert config_map["data"]["ASRPOOL_OPUS_WORKERS"] == "4"


@pytest.mark.parametrize(("resources", "lanes"), [
    ({}, "1"), ({"cpu": "1500m"}, "1"), ({"cpu": 3}, "1"), ({"cpu": "6"}, "4"),
    ({"cpu": "6.9"}, "4"), ({"cpu": "200"}, "64")])
def test_a_pool_naming_no_opus_workers_gets_lanes_from_its_cpu_request(
        resources: dict[str, Any], lanes: str) -> None:
    config_map = children.build_config_map(pool(resources=resources), CONFIG)
    assert config_map["data"]["ASRPOOL_OPUS_WORKERS"] == lanes


def test_a_pool_may_still_decode_opus_on_the_event_loop() -> None:
    config_map = children.build_config_map(pool(opusWorkers=0, resources={"cpu": "8"}), CONFIG)
    assert config_map["data"]["ASRPOOL_OPUS_WORKERS"] == "0"


@pytest.mark.parametrize(("spec", "workers"), [
    ({}, "2"), ({"resources": {"gpus": 0}}, "0"), ({"intakeWorkers": 0}, "0"),
    ({"intakeWorkers": 5, "resources": {"gpus": 0}}, "5")])
def test_intake_workers_reach_the_server_and_gpu_pools_get_two_unless_told(
        spec: dict[str, Any], workers: str) -> None:
    config_map = children.build_config_map(pool(**spec), CONFIG)
    assert config_map["data"]["ASRPOOL_INTAKE_WORKERS"] == workers


def test_an_engine_process_reaches_the_server() -> None:
    config_map = children.build_config_map(pool(engineProcess=True), CONFIG)
    assert config_map["data"]["ASRPOOL_ENGINE_PROCESS"] == "true"


@pytest.mark.parametrize(("resources", "spec", "expected"), [
    ({}, {}, "true"),  # a GPU (the default): the engine beside the event loop, not under it
    ({"gpus": 0, "cpu": "4"}, {}, "false"),  # a CPU pool: the engine wants the cores
    ({}, {"engineProcess": False}, "false"),  # as the pool says
    ({"gpus": 0, "cpu": "4"}, {"engineProcess": True}, "true"),
])
def test_pools_with_gpus_run_their_engine_in_a_process_unless_they_say(
        resources: dict[str, Any], spec: dict[str, Any], expected: str) -> None:
    config_map = children.build_config_map(pool(resources=resources, **spec), CONFIG)
    assert config_map["data"]["ASRPOOL_ENGINE_PROCESS"] == expected


def test_pods_reach_redis_by_their_own_url_when_given() -> None:
    config = CONFIG.model_copy(update={"pod_redis_url": "redis://10.0.0.5:6379/0"})
    data = children.build_config_map(pool(), config)["data"]
    assert data["ASRPOOL_REDIS_URL"] == "redis://10.0.0.5:6379/0"


def test_the_container_runs_asrpool_serve_with_its_identity_from_the_downward_api() -> None:
    built = container()
    assert built["command"] == ["asrpool", "serve"]
    assert built["image"] == settings.DEFAULT_IMAGE
    assert "envFrom" not in built
    from_config_map = [e for e in built["env"] if "configMapKeyRef" in e.get("valueFrom", {})]
    assert from_config_map[0] == {"name": "ASRPOOL_MODEL", "valueFrom": {
        "configMapKeyRef": {"name": "stt-config", "key": "ASRPOOL_MODEL"}}}
    assert [e["name"] for e in from_config_map] == list(
        children.build_config_map(pool(), CONFIG)["data"])
    assert built["env"][len(from_config_map):] == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "ASRPOOL_POD_ID", "value": "$(POD_NAMESPACE)/$(POD_NAME)"},
        {"name": "ASRPOOL_ADVERTISE_ADDRESS", "value": "$(POD_IP):8080"}]
    assert built["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]


def test_probes_use_readyz_and_healthz() -> None:
    built = container()
    assert built["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert built["readinessProbe"]["failureThreshold"] >= 3  # a busy pod is never briefly unready
    assert built["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert built["startupProbe"]["httpGet"]["path"] == "/startupz"


def test_gpus_are_requested_and_limited() -> None:
    assert container(resources={"gpus": 2, "cpu": 4, "memory": "24Gi"})["resources"] == {
        "requests": {"nvidia.com/gpu": "2", "cpu": "4", "memory": "24Gi"},
        "limits": {"nvidia.com/gpu": "2", "memory": "24Gi"}}
    assert "resources" not in container(resources={"gpus": 0}) or container(
        resources={"gpus": 0})["resources"] == {}


def test_placement_is_copied_to_the_pods() -> None:
    spec = deployment(nodeSelector={"gpu": "h100"}, priorityClassName="asr",
                      tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}],
                      affinity={"nodeAffinity": {"x": 1}})["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert spec["affinity"] == {"nodeAffinity": {"x": 1}}
    assert spec["priorityClassName"] == "asr"


def test_auth_mounts_the_key_file_and_passes_the_pod_token() -> None:
    auth = {"apiKeysSecret": {"name": "keys"}, "podTokenSecret": {"name": "tok"}}
    built = deployment(auth=auth)["spec"]["template"]["spec"]
    assert built["volumes"][-1] == {"name": "api-keys", "secret": {"secretName": "keys"}}
    server = built["containers"][0]
    assert server["volumeMounts"][-1] == {
        "name": "api-keys", "mountPath": "/etc/asrpool/keys", "readOnly": True}
    assert server["env"][-1] == {"name": "ASRPOOL_POD_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "tok", "key": "token"}}}
    data = children.build_config_map(pool(auth=auth), CONFIG)["data"]
    assert data["ASRPOOL_API_KEYS_FILE"] == "/etc/asrpool/keys/keys.yaml"


def test_the_redis_password_reaches_pods_by_reference_only() -> None:
    config = settings.OperatorSettings(namespaces=["speech"], redis_url="redis://redis:6379/0",
                                       redis_password="op-secret",
                                       redis_password_secret="asrpool-redis")
    built = children.build_all(pool(), config)
    server = built[1]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "ASRPOOL_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
        "name": "asrpool-redis", "key": "password"}}} in server["env"]
    assert "op-secret" not in repr(built)


ACL = CONFIG.model_copy(update={"redis_password_seed": pydantic.SecretStr("redis-seed")})


def _secret_named(built: list[children.Child], name: str) -> dict[str, Any]:
    (secret,) = [c for c in built if c["kind"] == "Secret" and c["metadata"]["name"] == name]
    return secret


def test_under_redis_acls_pods_use_their_namespaces_own_user() -> None:
    """The user asrpool.common.redis_acl names, its password in a Secret of the pool's
    namespace, and no pools-set announcements (out of that user's keys)."""
    built = children.build_all(pool(), ACL)
    data = built[0]["data"]
    assert data["ASRPOOL_REDIS_URL"] == "redis://asrpool-pods-speech@redis:6379/0"
    assert data["ASRPOOL_ANNOUNCE_POOL"] == "false"
    secret = _secret_named(built, "stt-redis")
    assert secret["metadata"]["namespace"] == "speech"
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert password == seeds.redis_password("redis-seed", "speech")
    env = next(c for c in built if c["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "ASRPOOL_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
        "name": "stt-redis", "key": "password"}}} in env
    elsewhere = _secret_named(children.build_all(pool(namespace="other"), ACL), "stt-redis")
    assert elsewhere["data"] != secret["data"]
    assert "redis-seed" not in repr(built)


def test_a_new_redis_password_seed_rolls_the_pods() -> None:
    def template(config: settings.OperatorSettings) -> Any:
        built = children.build_all(pool(), config)
        return next(c for c in built if c["kind"] == "Deployment")["spec"]["template"]
    rotated = CONFIG.model_copy(update={"redis_password_seed": pydantic.SecretStr("other")})
    assert template(ACL) != template(rotated)


def test_redis_acls_and_one_shared_password_secret_are_refused_together() -> None:
    with pytest.raises(pydantic.ValidationError, match="not both"):
        settings.OperatorSettings(namespaces=["speech"], redis_password_secret="shared",
                                  redis_password_seed="redis-seed")


def test_a_config_change_changes_the_pod_template() -> None:
    before = deployment()["spec"]["template"]["metadata"]["annotations"]
    after = deployment(context=750)["spec"]["template"]["metadata"]["annotations"]
    assert before[naming.CONFIG_HASH_ANNOTATION] != after[naming.CONFIG_HASH_ANNOTATION]
    assert deployment()["spec"]["template"] == deployment()["spec"]["template"]


def test_scaling_alone_does_not_roll_the_pods() -> None:
    assert deployment(slots=20)["spec"]["template"] == deployment(slots=200)["spec"]["template"]


def test_the_service_is_headless_on_the_server_port() -> None:
    spec = children.build_service(pool())["spec"]
    assert spec == {"clusterIP": "None", "selector": naming.selector("stt"), "ports": [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]}


def test_the_disruption_budget_evicts_one_pod_at_a_time() -> None:
    assert children.build_disruption_budget(pool())["spec"] == {
        "maxUnavailable": 1, "selector": {"matchLabels": naming.selector("stt")}}


def test_the_rollout_strategy_is_the_pools_to_set() -> None:
    """A pool that uses every GPU it may have cannot surge: it trades one pod down."""
    assert deployment(rollout={"maxSurge": 0, "maxUnavailable": 1})["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert deployment(rollout={"maxSurge": "25%"})["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": "25%", "maxUnavailable": 0}


def test_the_disruption_budget_is_the_pools_to_set() -> None:
    selector = {"matchLabels": naming.selector("stt")}
    assert children.build_disruption_budget(pool(disruptionBudget={"minAvailable": "50%"})
                                            )["spec"] == {"minAvailable": "50%",
                                                          "selector": selector}
    assert children.build_disruption_budget(pool(disruptionBudget={"maxUnavailable": 2})
                                            )["spec"] == {"maxUnavailable": 2, "selector": selector}


def test_every_child_of_every_example_is_valid_kubernetes() -> None:
    """The built objects pass ``kubernetes-validate --strict`` (Kubernetes 1.30 schemas)."""
    for path in schemas.EXAMPLES:
        document = yaml.safe_load(path.read_text())
        document["metadata"].setdefault("namespace", "default")
        for config in (CONFIG, SEEDED):  # SEEDED: and the pool's pod token Secret
            for child in children.build_all(pools.from_body(document), config):
                kubernetes_validate.validate(child, "1.30.0", strict=True)


def test_server_pods_meet_the_restricted_pod_security_standard() -> None:
    spec = deployment()["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == children.SERVER_USER
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container()["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True}


def test_a_read_only_root_with_an_empty_dir_for_each_path_the_server_writes() -> None:
    """Scratch (/tmp) and the model download (HF_HOME, /models in the image)."""
    dockerfile = (Path(__file__).resolve().parents[2] / "docker" / "server.Dockerfile").read_text()
    assert "HF_HOME=/models" in dockerfile
    spec = deployment()["spec"]["template"]["spec"]
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {}}, {"name": "models", "emptyDir": {}}]
    assert {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]} == {"/tmp", "/models"}


SEEDED = CONFIG.model_copy(update={"pod_token_seed": pydantic.SecretStr("chart-seed")})


def _token_of(built: list[children.Child]) -> tuple[dict[str, Any], str]:
    """The pods' ASRPOOL_POD_TOKEN entry, and the token in the pool's Secret."""
    env = next(c for c in built if c["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]["env"]
    (entry,) = [e for e in env if e["name"] == "ASRPOOL_POD_TOKEN"]
    (secret,) = [c for c in built if c["kind"] == "Secret"]
    ref = entry["valueFrom"]["secretKeyRef"]
    assert secret["metadata"]["name"] == ref["name"]
    return entry, base64.b64decode(secret["data"][ref["key"]]).decode()


def test_each_pool_gets_its_own_pod_token_from_the_operators_seed() -> None:
    """The token the routers derive for the pool (NAMESPACE/NAME), in a Secret of the
    pool's own namespace; a pool of the same name elsewhere gets another one."""
    entry, token = _token_of(children.build_all(pool(), SEEDED))
    assert entry["valueFrom"]["secretKeyRef"] == {"name": "stt-pod-token", "key": "token"}
    assert token == seeds.pod_token("chart-seed", "speech/stt")
    _, elsewhere = _token_of(children.build_all(pool(namespace="other"), SEEDED))
    assert elsewhere == seeds.pod_token("chart-seed", "other/stt") != token
    secret = next(c for c in children.build_all(pool(), SEEDED) if c["kind"] == "Secret")
    assert secret["metadata"]["namespace"] == "speech"


def test_a_new_seed_rolls_the_pods() -> None:
    """Pods read their token at start: a changed token must reach them."""
    def digest(config: settings.OperatorSettings) -> str:
        built = children.build_all(pool(), config)
        deployment = next(c for c in built if c["kind"] == "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"])
    rotated = CONFIG.model_copy(update={"pod_token_seed": pydantic.SecretStr("new-seed")})
    assert digest(SEEDED) != digest(rotated)


def test_without_a_seed_a_pool_has_the_token_its_spec_names_or_none() -> None:
    own = pool(auth={"podTokenSecret": {"name": "mine", "key": "k"}})
    built = children.build_all(own, CONFIG)
    env = built[1]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[-1]["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "k"}
    assert all(c["kind"] != "Secret" for c in built)
    untold = children.build_all(pool(), CONFIG)[1]["spec"]["template"]["spec"]["containers"][0]
    assert all(e["name"] != "ASRPOOL_POD_TOKEN" for e in untold["env"])


def test_with_a_seed_a_pool_naming_its_own_token_is_invalid() -> None:
    """The routers would send the pool's derived token, never the named one."""
    own = pool(auth={"podTokenSecret": {"name": "mine", "key": "k"}})
    with pytest.raises(specs.InvalidSpec, match="leave podTokenSecret out"):
        children.with_pod_token(own, SEEDED)


def test_the_server_user_is_the_images_user() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "docker" / "server.Dockerfile").read_text()
    assert f"USER {children.SERVER_USER}:{children.SERVER_USER}" in dockerfile


def test_only_routers_reach_the_server_port() -> None:
    """The NetworkPolicy: the pool's pods, ingress on 8080 (streams and metrics share it)
    from router pods only, unless told whom else to admit; it can be left out."""
    policy = children.build_all(pool(), CONFIG)[-1]
    assert policy["spec"] == {
        "podSelector": {"matchLabels": naming.selector("stt")}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [settings.DEFAULT_ROUTER_PEER],
                     "ports": [{"port": 8080, "protocol": "TCP"}]}]}
    prometheus = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app": "prometheus"}}}
    told = CONFIG.model_copy(update={"network_policy_from": [prometheus]})
    assert children.build_all(pool(), told)[-1]["spec"]["ingress"][0]["from"] == [prometheus]
    off = CONFIG.model_copy(update={"network_policy": False})
    assert [c["kind"] for c in children.build_all(pool(), off)][-1] == "PodDisruptionBudget"
