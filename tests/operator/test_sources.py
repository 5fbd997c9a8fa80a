"""The children built from each form of ``spec.model``, the dtype and the pod-template
pass-through: plain dict asserts on the pure builders, and every built object passes
``kubernetes-validate --strict``."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from asrpool.common import weights
from asrpool.operator import children, naming, pools, settings, sources, specs
from asrpool.server import settings as server_settings
from asrpool_harness.localcluster import podspecs
from tests.support.environs import Environ

CONFIG = settings.OperatorSettings(namespaces=["speech"], redis_url="redis://redis:6379/0",
                                   redis_password_secret="redis")
WRITABLE = {name for name, _ in children.WRITABLE_PATHS}  # the read-only root's emptyDirs


def model_volumes(template: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's volumes but the writable emptyDirs every server pod has."""
    return [v for v in template["spec"].get("volumes", []) if v["name"] not in WRITABLE]


def model_mounts(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in container.get("volumeMounts", []) if m["name"] not in WRITABLE]


def pool(model: dict[str, Any], **spec: Any) -> pools.Pool:
    return pools.from_body({"metadata": {"name": "stt", "namespace": "speech"}, "spec": {
        "model": model, "slots": 16, **spec}})


def pod_spec(model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    built = children.build_all(pool(model, **spec), CONFIG)
    for child in built:
        kubernetes_validate.validate(child, "1.30.0", strict=True)
    template: dict[str, Any] = built[1]["spec"]["template"]
    return template


def server(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    assert container["name"] == naming.SERVER_CONTAINER
    return dict(container)


def data(model: dict[str, Any], **spec: Any) -> dict[str, str]:
    return dict(children.build_config_map(pool(model, **spec), CONFIG)["data"])


# The three forms of spec.model.

def test_a_preset_needs_nothing_but_its_name() -> None:
    template = pod_spec({"name": "tiny"})
    assert "initContainers" not in template["spec"] and model_volumes(template) == []
    assert model_mounts(server(template)) == []
    assert data({"name": "tiny"})["ASRPOOL_MODEL"] == "tiny"
    assert "HF_HUB_OFFLINE" not in data({"name": "tiny"})


def test_a_path_in_the_image_is_loaded_as_it_is() -> None:
    template = pod_spec({"name": "/models/stt-1b"})
    assert "initContainers" not in template["spec"]
    assert data({"name": "/models/stt-1b"})["ASRPOOL_MODEL"] == "/models/stt-1b"


def test_a_host_path_volume_is_mounted_read_only_where_the_server_loads_it() -> None:
    template = pod_spec({"volume": {"hostPath": "/srv/models", "subPath": "stt-1b"}})
    assert model_volumes(template) == [
        {"name": "model", "hostPath": {"path": "/srv/models", "type": "Directory"}}]
    assert model_mounts(server(template)) == [
        {"name": "model", "mountPath": sources.MODEL_DIR, "readOnly": True, "subPath": "stt-1b"}]
    assert data({"volume": {"hostPath": "/srv/models"}})["ASRPOOL_MODEL"] == sources.MODEL_DIR
    assert "initContainers" not in template["spec"]


def test_a_claim_volume_is_mounted_read_only() -> None:
    template = pod_spec({"volume": {"claimName": "stt-weights"}})
    assert model_volumes(template) == [{"name": "model", "persistentVolumeClaim": {
        "claimName": "stt-weights", "readOnly": True}}]
    assert model_mounts(server(template)) == [
        {"name": "model", "mountPath": sources.MODEL_DIR, "readOnly": True}]


def test_a_repo_is_fetched_by_an_init_container_into_an_empty_dir_by_default() -> None:
    template = pod_spec({"name": "kyutai/stt-1b-en_fr", "revision": "v2"})
    (fetch,) = template["spec"]["initContainers"]
    assert fetch["name"] == "fetch-model"
    assert fetch["image"] == server(template)["image"]  # asrpool itself
    assert fetch["command"] == ["asrpool", "fetch-model"]
    assert fetch["args"] == ["kyutai/stt-1b-en_fr", "--cache-dir", sources.HUB_CACHE,
                             "--revision", "v2"]
    assert model_mounts(fetch) == [{"name": "model-cache", "mountPath": sources.CACHE_DIR}]
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert model_volumes(template) == [
        {"name": "model-cache", "emptyDir": {"sizeLimit": sources.DEFAULT_CACHE_SIZE}}]
    assert server(template)["resources"]["requests"]["ephemeral-storage"] == "20Gi"
    assert model_mounts(server(template)) == [  # the fetch alone writes the cache
        {"name": "model-cache", "mountPath": sources.CACHE_DIR, "readOnly": True}]
    env = data({"name": "kyutai/stt-1b-en_fr", "revision": "v2"})
    assert (env["ASRPOOL_MODEL"], env["ASRPOOL_MODEL_REVISION"]) == ("kyutai/stt-1b-en_fr", "v2")
    assert (env["HF_HUB_CACHE"], env["HF_HUB_OFFLINE"]) == (sources.HUB_CACHE, "1")


def test_the_empty_dir_size_limit_is_the_ephemeral_storage_request() -> None:
    template = pod_spec({"name": "kyutai/stt-2.6b-en", "cache": {"sizeLimit": "12Gi"}})
    assert model_volumes(template)[0]["emptyDir"] == {"sizeLimit": "12Gi"}
    assert server(template)["resources"]["requests"]["ephemeral-storage"] == "12Gi"


def test_a_node_cache_is_a_host_path_per_namespace_and_asks_for_no_ephemeral_storage() -> None:
    template = pod_spec({"name": "kyutai/stt-1b-en_fr", "cache": {"type": "hostPath"}})
    assert model_volumes(template) == [{"name": "model-cache", "hostPath": {
        "path": "/var/cache/asrpool/speech", "type": "DirectoryOrCreate"}}]
    assert "ephemeral-storage" not in server(template)["resources"].get("requests", {})
    named = pod_spec({"name": "kyutai/stt-1b-en_fr", "cache": {"type": "hostPath",
                                                              "path": "/data/hf"}})
    assert model_volumes(named)[0]["hostPath"]["path"] == "/data/hf"


def test_a_node_cache_is_given_to_the_server_user_by_root_with_chown_alone() -> None:
    """The kubelet makes a missing hostPath folder as root; the fetch runs as 10001."""
    template = pod_spec({"name": "kyutai/stt-1b-en_fr", "cache": {"type": "hostPath"}})
    owner, fetch = template["spec"]["initContainers"]
    assert (owner["name"], fetch["name"]) == ("cache-owner", "fetch-model")
    assert owner["command"] == ["chown", "10001:10001", sources.CACHE_DIR]
    assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert owner["securityContext"]["allowPrivilegeEscalation"] is False
    assert model_mounts(owner) == [{"name": "model-cache", "mountPath": sources.CACHE_DIR}]
    assert model_mounts(server(template))[0]["readOnly"] is True
    for cache in ({}, {"type": "persistentVolumeClaim", "claimName": "hf"}):
        others = pod_spec({"name": "kyutai/stt-1b-en_fr", "cache": cache})
        assert [c["name"] for c in others["spec"]["initContainers"]] == ["fetch-model"]


def test_a_shared_cache_is_the_named_claim() -> None:
    template = pod_spec({"name": "kyutai/stt-1b-en_fr", "cache": {
        "type": "persistentVolumeClaim", "claimName": "hf-cache"}})
    assert model_volumes(template) == [
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}]


def test_the_token_reaches_the_fetch_from_its_secret_and_never_the_server() -> None:
    template = pod_spec({"name": "kyutai/private", "tokenSecret": {"name": "hf", "key": "tk"}})
    (fetch,) = template["spec"]["initContainers"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tk"}}} \
        in fetch["env"]
    assert not [arg for arg in fetch["args"] if arg == "hf" or "tk" in arg]
    assert "HF_TOKEN" not in str(server(template)) + str(data({"name": "kyutai/private"}))


def test_the_startup_budget_is_the_model_load_timeout() -> None:
    probe = server(pod_spec({"name": "tiny", "loadTimeoutSeconds": 1200}))["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 1200
    default = server(pod_spec({"name": "tiny"}))["startupProbe"]
    assert default["periodSeconds"] * default["failureThreshold"] == 600
    assert server(pod_spec({"name": "tiny"}))["terminationMessagePolicy"] == \
        "FallbackToLogsOnError"


@pytest.mark.parametrize(("model", "needle"), [
    ({"name": "no-such-model"}, "is none of a preset"),
    ({"name": "a/b/c"}, "is none of a preset"),
    ({"name": "../etc"}, "is none of a preset"),
    ({"name": "tiny", "volume": {"hostPath": "/m"}}, "exactly one of name"),
    ({"volume": {}}, "exactly one of claimName"),
    ({"volume": {"hostPath": "m"}}, "must be absolute"),
    ({"volume": {"hostPath": "/m", "subPath": "../x"}}, "without '..'"),
    ({"name": "tiny", "tokenSecret": {"name": "hf"}}, "applies to a Hugging Face repo only"),
    ({"volume": {"claimName": "w"}, "cache": {"type": "hostPath"}}, "applies to a Hugging Face"),
    ({"name": "kyutai/x", "cache": {"type": "persistentVolumeClaim"}}, "claimName is required"),
    ({"name": "kyutai/x", "cache": {"type": "s3"}}, "cache.type must be one of"),
    ({"name": "kyutai/x", "tokenSecret": {}}, "tokenSecret.name is required"),
])
def test_a_model_reference_the_operator_cannot_serve_is_refused(model: dict[str, Any],
                                                                needle: str) -> None:
    with pytest.raises(specs.InvalidSpec) as info:
        pool(model)
    assert needle in str(info.value)


def test_every_reference_kind_is_classified() -> None:
    assert [weights.kind_of(name) for name in ("tiny", "kyutai/stt-1b-en_fr", "/models/x",
                                               "nope", "a/b/c")] == [
        weights.Kind.PRESET, weights.Kind.REPO, weights.Kind.PATH, None, None]


# Precision.

def test_the_dtype_travels_to_the_pods_and_defaults_to_auto() -> None:
    assert data({"name": "tiny"})["ASRPOOL_DTYPE"] == "auto"
    assert data({"name": "tiny"}, dtype="float32")["ASRPOOL_DTYPE"] == "float32"
    with pytest.raises(specs.InvalidSpec, match=r"spec\.dtype must be one of"):
        pool({"name": "tiny"}, dtype="int8")


# The pod template pass-through.

PASS_THROUGH: dict[str, Any] = {
    "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
    "envFrom": [{"secretRef": {"name": "mirror"}}],
    "volumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}}],
    "volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/extra", "readOnly": True}],
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "stt-pods",
    "runtimeClassName": "nvidia",
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"asrpool.io/pool": "stt"}}}],
    "podMetadata": {"labels": {"team": "speech", naming.POOL_LABEL: "other"},
                    "annotations": {"prometheus.io/scrape": "true",
                                    naming.CONFIG_HASH_ANNOTATION: "mine"}},
}


def test_the_pod_template_pass_through_reaches_the_pods() -> None:
    template = pod_spec({"name": "kyutai/stt-1b-en_fr"}, **PASS_THROUGH)
    spec = template["spec"]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["serviceAccountName"] == "stt-pods"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["topologySpreadConstraints"] == PASS_THROUGH["topologySpreadConstraints"]
    assert spec["volumes"][-1] == {"name": "ca", "configMap": {"name": "ca-bundle"}}
    for container in (server(template), spec["initContainers"][0]):
        assert container["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
        assert container["envFrom"][-1] == {"secretRef": {"name": "mirror"}}
        assert container["volumeMounts"][-1]["mountPath"] == "/etc/ssl/extra"
    assert server(template)["envFrom"] == [{"secretRef": {"name": "mirror"}}]


def test_a_pools_env_from_cannot_replace_the_operators_variables(environ: Environ) -> None:
    """A ConfigMap of the pool's own, listed in spec.envFrom, names the operator's
    variables (and lower-case twins): the server's environment keeps the operator's
    values, resolved as a kubelet does (envFrom, then env)."""
    template = pod_spec({"name": "tiny"}, envFrom=[{"configMapRef": {"name": "mine"}}])
    mine = {"ASRPOOL_POOL": "other/pool", "ASRPOOL_REDIS_URL": "redis://evil:6379/0",
            "asrpool_pool": "other/pool", "ASRPOOL_LOG_LEVEL": "debug"}
    operators = children.build_config_map(pool({"name": "tiny"}), CONFIG)["data"]
    found = {"mine": mine, "stt-config": operators, "redis": {"password": "secret"}}
    env = podspecs.environment(server(template), lambda kind, name: found.get(name),
                               {"status.podIP": "198.18.16.5", "metadata.name": "stt-0",
                                "metadata.namespace": "speech"})
    assert env["ASRPOOL_POOL"] == "speech/stt"
    assert env["ASRPOOL_POD_ID"] == "speech/stt-0"
    assert env["ASRPOOL_REDIS_URL"] == CONFIG.server_redis_url
    assert env["ASRPOOL_LOG_LEVEL"] == "debug"  # what the operator leaves alone stays the pool's
    environ(env)
    assert server_settings.ServerSettings().pool == "speech/stt"  # the twin is not read


def test_the_operators_labels_and_annotations_win() -> None:
    metadata = pod_spec({"name": "tiny"}, **PASS_THROUGH)["metadata"]
    assert metadata["labels"]["team"] == "speech"
    assert metadata["labels"][naming.POOL_LABEL] == "stt"  # the selector stays the operator's
    assert metadata["annotations"]["prometheus.io/scrape"] == "true"
    assert metadata["annotations"][naming.CONFIG_HASH_ANNOTATION] != "mine"


def test_server_pods_mount_no_service_account_token_unless_asked() -> None:
    assert pod_spec({"name": "tiny"})["spec"]["automountServiceAccountToken"] is False
    asked = pod_spec({"name": "tiny"}, automountServiceAccountToken=True)
    assert asked["spec"]["automountServiceAccountToken"] is True


@pytest.mark.parametrize(("spec", "needle"), [
    ({"env": [{"name": "ASRPOOL_POOL", "value": "other"}]}, "'ASRPOOL_POOL' is set by the op"),
    ({"env": [{"name": "HF_TOKEN", "value": "x"}]}, "'HF_TOKEN' is set by the operator"),
    ({"volumes": [{"name": "model-cache", "emptyDir": {}}]}, "volume 'model-cache' is set"),
    ({"volumes": [{"name": "x", "emptyDir": {}}],
      "volumeMounts": [{"name": "x", "mountPath": "/var/cache/asrpool/"}]}, "mount path"),
    ({"volumes": [{"name": "x", "emptyDir": {}}],
      "volumeMounts": [{"name": "x", "mountPath": "//models"}]}, "'//models' is '/models'"),
    ({"volumes": [{"name": "x", "emptyDir": {}}],
      "volumeMounts": [{"name": "x", "mountPath": "/tmp/../models"}]}, "is '/models', at or"),
    ({"volumes": [{"name": "x", "emptyDir": {}}],
      "volumeMounts": [{"name": "x", "mountPath": "/etc/asrpool/keys/./k"}]}, "under '/etc/asr"),
    ({"volumes": [{"name": "x", "emptyDir": {}}],
      "volumeMounts": [{"name": "x", "mountPath": "models"}]}, "must be absolute"),
    ({"volumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}, "not in spec.volumes"),
    ({"volumes": [{"name": "x", "emptyDir": {}}, {"name": "x", "emptyDir": {}}]}, "twice"),
    ({"podMetadata": {"labels": {"a": 1}}}, "spec.podMetadata.labels"),
])
def test_a_pass_through_that_would_replace_the_operators_own_is_refused(
    spec: dict[str, Any], needle: str
) -> None:
    with pytest.raises(specs.InvalidSpec) as info:
        pool({"name": "kyutai/stt-1b-en_fr"}, **spec)
    assert needle in str(info.value)


def test_the_reserved_names_cover_everything_the_operator_sets() -> None:
    """Every variable, volume and mount path the builders write is in the reserved sets."""
    built = pool({"name": "kyutai/x", "tokenSecret": {"name": "hf"}},
                 auth={"apiKeysSecret": {"name": "k"}, "podTokenSecret": {"name": "t"}})
    template = children.build_pod_template(built, CONFIG, "digest")
    containers = [*template["spec"]["containers"], *template["spec"]["initContainers"]]
    names = {env["name"] for c in containers for env in c["env"]}
    names |= set(children.build_config_map(built, CONFIG)["data"])
    assert names <= pools.RESERVED_ENV
    assert set(pools.ENV_FIELDS) <= pools.RESERVED_ENV  # a hint only a refusal can give
    assert {v["name"] for v in template["spec"]["volumes"]} <= pools.RESERVED_VOLUMES
    assert {m["mountPath"] for c in containers for m in c["volumeMounts"]} <= pools.RESERVED_MOUNTS
    volume_pool = pool({"volume": {"claimName": "w"}})
    mounts = children.build_container(volume_pool, CONFIG)["volumeMounts"]
    assert {m["mountPath"] for m in mounts} <= pools.RESERVED_MOUNTS
