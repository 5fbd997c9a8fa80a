"""Every refusal of a bad ``StreamingASRPool`` spec, word for word.

Users read these messages (the pool's ``InvalidSpec`` status condition carries them) and
tests match them, so a change to how the operator reads a spec must leave them as they
are. Each case is a minimal valid spec with some fields replaced (``DROP``: left out),
read as reconcile reads it. The API server's schema refuses most of these first; an older
CRD, an API server that skips it, or a plan (``asrpool plan``) has no schema in front.
"""

from __future__ import annotations

from typing import Any

import pytest

from asrpool.operator import children, pools, settings, specs

DROP = object()  # a field of the minimal spec left out
MINIMAL: dict[str, Any] = {"model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 16}
X = {"name": "x", "emptyDir": {}}  # a volume of the pool's own
LONG_NAME = "p" * 51


def policies(direction: str, *items: Any) -> dict[str, Any]:
    """``spec.autoscaling.behavior.<direction>.policies``: the items as given."""
    return {"autoscaling": {"behavior": {direction: {"policies": list(items)}}}}


def read(fields: dict[str, Any] | None, *, name: str = "stt",
         seed: str | None = None) -> pools.Pool:
    """The minimal spec with ``fields`` over it (None: no spec at all), read as reconcile
    reads a pool: the spec, the operator's own pod token, the auth rule."""
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": "speech"}}
    if fields is not None:
        body["spec"] = {key: value for key, value in {**MINIMAL, **fields}.items()
                        if value is not DROP}
    config = settings.OperatorSettings(namespaces=["speech"], pod_token_seed=seed)
    pool = children.with_pod_token(pools.from_body(body), config)
    pools.check_auth(pool)
    return pool


def refusal(fields: dict[str, Any] | None, **options: Any) -> str:
    with pytest.raises(specs.InvalidSpec) as info:
        read(fields, **options)
    return str(info.value)


REFUSED: list[tuple[str, dict[str, Any] | None, str]] = [
    ("no-spec", None,
     "spec.model is required"),
    ("model-missing", {"model": DROP},
     "spec.model is required"),
    ("model-null", {"model": None},
     "spec.model is required"),
    ("model-string", {"model": "kyutai/stt"},
     "spec.model must be an object, got str"),
    ("model-empty-string", {"model": ""},
     "spec.model must be an object, got str"),
    ("model-list", {"model": []},
     "spec.model must be an object, got list"),
    ("model-empty", {"model": {}},
     "spec.model needs exactly one of name (a preset, a Hugging Face repo id or a path in the "
     "image) and volume (a checkpoint directory)"),
    ("model-revision-only", {"model": {"revision": "main"}},
     "spec.model needs exactly one of name (a preset, a Hugging Face repo id or a path in the "
     "image) and volume (a checkpoint directory)"),
    ("model-name-and-volume", {"model": {"name": "tiny", "volume": {"hostPath": "/m"}}},
     "spec.model needs exactly one of name (a preset, a Hugging Face repo id or a path in the "
     "image) and volume (a checkpoint directory)"),
    ("model-unknown-kind", {"model": {"name": "../etc"}},
     "spec.model.name '../etc' is none of a preset (tiny, small, stt-1b-en_fr, stt-2.6b-en), a "
     "Hugging Face repo id (org/name) or an absolute path to a checkpoint directory"),
    ("model-name-integer", {"model": {"name": 5}},
     "spec.model.name must be a string, got 5"),
    ("model-name-zero-with-volume", {"model": {"name": 0, "volume": {"hostPath": "/m"}}},
     "spec.model.name must be a string, got 0"),
    ("model-revision-integer", {"model": {"name": "tiny", "revision": 5}},
     "spec.model.revision must be a string, got 5"),
    ("token-string", {"model": {"name": "kyutai/stt-1b-en_fr", "tokenSecret": "hf"}},
     "spec.model.tokenSecret must be an object"),
    ("token-empty-string", {"model": {"name": "kyutai/stt-1b-en_fr", "tokenSecret": ""}},
     "spec.model.tokenSecret must be an object"),
    ("token-no-name", {"model": {"name": "kyutai/stt-1b-en_fr", "tokenSecret": {}}},
     "spec.model.tokenSecret.name is required"),
    ("token-name-integer", {"model": {"name": "kyutai/stt-1b-en_fr", "tokenSecret": {"name": 5}}},
     "spec.model.tokenSecret.name must be a string, got 5"),
    ("token-key-integer",
     {"model": {"name": "kyutai/stt-1b-en_fr", "tokenSecret": {"name": "hf", "key": 5}}},
     "spec.model.tokenSecret.key must be a string, got 5"),
    ("token-on-preset", {"model": {"name": "tiny", "tokenSecret": {"name": "hf"}}},
     "spec.model.tokenSecret applies to a Hugging Face repo only; 'tiny' (preset) is not fetched"),
    ("volume-string", {"model": {"volume": "x"}},
     "spec.model.volume must be an object"),
    ("volume-empty-string", {"model": {"volume": ""}},
     "spec.model.volume must be an object"),
    ("volume-empty", {"model": {"volume": {}}},
     "spec.model.volume needs exactly one of claimName (a PVC) and hostPath (a folder on each "
     "node)"),
    ("volume-both", {"model": {"volume": {"claimName": "w", "hostPath": "/m"}}},
     "spec.model.volume needs exactly one of claimName (a PVC) and hostPath (a folder on each "
     "node)"),
    ("volume-relative-host-path", {"model": {"volume": {"hostPath": "m"}}},
     "spec.model.volume.hostPath must be absolute, got 'm'"),
    ("volume-absolute-sub-path", {"model": {"volume": {"hostPath": "/m", "subPath": "/x"}}},
     "spec.model.volume.subPath must be relative, without '..'"),
    ("volume-dotdot-sub-path", {"model": {"volume": {"hostPath": "/m", "subPath": "a/../b"}}},
     "spec.model.volume.subPath must be relative, without '..'"),
    ("volume-claim-integer", {"model": {"volume": {"claimName": 5}}},
     "spec.model.volume.claimName must be a string, got 5"),
    ("volume-sub-path-integer", {"model": {"volume": {"claimName": "w", "subPath": 5}}},
     "spec.model.volume.subPath must be a string, got 5"),
    ("volume-with-cache", {"model": {"volume": {"claimName": "w"}, "cache": {}}},
     "spec.model.cache applies to a Hugging Face repo only; a volume is not fetched"),
    ("cache-string", {"model": {"name": "kyutai/stt-1b-en_fr", "cache": "x"}},
     "spec.model.cache must be an object"),
    ("cache-unknown-type", {"model": {"name": "kyutai/stt-1b-en_fr", "cache": {"type": "s3"}}},
     "spec.model.cache.type must be one of emptyDir, hostPath, persistentVolumeClaim, got 's3'"),
    ("cache-type-integer", {"model": {"name": "kyutai/stt-1b-en_fr", "cache": {"type": 5}}},
     "spec.model.cache.type must be a string, got 5"),
    ("cache-claim-missing",
     {"model": {"name": "kyutai/stt-1b-en_fr", "cache": {"type": "persistentVolumeClaim"}}},
     "spec.model.cache.claimName is required for a persistentVolumeClaim cache (a ReadWriteMany "
     "claim every pod of the pool mounts)"),
    ("cache-claim-integer", {"model": {"name": "kyutai/stt-1b-en_fr", "cache": {"claimName": 5}}},
     "spec.model.cache.claimName must be a string, got 5"),
    ("cache-path-integer", {"model": {"name": "kyutai/stt-1b-en_fr", "cache": {"path": 5}}},
     "spec.model.cache.path must be a string, got 5"),
    ("cache-on-preset", {"model": {"name": "tiny", "cache": {"type": "hostPath"}}},
     "spec.model.cache applies to a Hugging Face repo only; 'tiny' (preset) is not fetched"),
    ("cache-on-path", {"model": {"name": "/models/x", "cache": {}}},
     "spec.model.cache applies to a Hugging Face repo only; '/models/x' (path) is not fetched"),
    ("load-timeout-zero", {"model": {"name": "tiny", "loadTimeoutSeconds": 0}},
     "spec.model.loadTimeoutSeconds must be a positive integer, got 0"),
    ("load-timeout-string", {"model": {"name": "tiny", "loadTimeoutSeconds": "600"}},
     "spec.model.loadTimeoutSeconds must be a positive integer, got '600'"),
    ("load-timeout-boolean", {"model": {"name": "tiny", "loadTimeoutSeconds": True}},
     "spec.model.loadTimeoutSeconds must be a positive integer, got True"),
    ("slots-missing", {"slots": DROP},
     "spec.slots is required"),
    ("slots-string", {"slots": "16"},
     "spec.slots must be an integer, got '16'"),
    ("slots-boolean", {"slots": True},
     "spec.slots must be an integer, got True"),
    ("slots-negative", {"slots": -1},
     "spec.slots must be at least 0, got -1"),
    ("slots-null", {"slots": None},
     "spec.slots must be an integer, got None"),
    ("slots-per-pod-zero", {"slotsPerPod": 0},
     "spec.slotsPerPod must be at least 1, got 0"),
    ("slots-per-pod-over", {"slotsPerPod": 4097},
     "spec.slotsPerPod must be a whole number from 1 to 4096, or auto"),
    ("slots-per-pod-float", {"slotsPerPod": 1.5},
     "spec.slotsPerPod must be an integer, got 1.5"),
    ("context-zero", {"context": 0},
     "spec.context must be at least 1, got 0"),
    ("drain-negative", {"drainGracePeriodSeconds": -5},
     "spec.drainGracePeriodSeconds must be at least 0, got -5"),
    ("opus-workers-too-many", {"opusWorkers": 65},
     "spec.opusWorkers must be at most 64, got 65"),
    ("opus-workers-negative", {"opusWorkers": -1},
     "spec.opusWorkers must be at least 0, got -1"),
    ("intake-workers-too-many", {"intakeWorkers": 65},
     "spec.intakeWorkers must be at most 64, got 65"),
    ("cpu-not-a-quantity", {"resources": {"cpu": "lots"}},
     "spec.resources.cpu must be a CPU quantity like '4' or '1500m', got 'lots'"),
    ("engine-process-string", {"engineProcess": "yes"},
     "spec.engineProcess must be true or false, got 'yes'"),
    ("engine-process-null", {"engineProcess": None},
     "spec.engineProcess must be true or false, got None"),
    ("max-gpus-string", {"maxGPUs": "4"},
     "spec.maxGPUs must be an integer, got '4'"),
    ("max-gpus-negative", {"maxGPUs": -1},
     "spec.maxGPUs must be at least 0, got -1"),
    ("image-integer", {"image": 5},
     "spec.image must be a string, got 5"),
    ("image-zero", {"image": 0},
     "spec.image must be a string, got 0"),
    ("pull-policy-list", {"imagePullPolicy": ["Always"]},
     "spec.imagePullPolicy must be a string, got ['Always']"),
    ("priority-class-integer", {"priorityClassName": 7},
     "spec.priorityClassName must be a string, got 7"),
    ("dtype-unknown", {"dtype": "int8"},
     "spec.dtype must be one of auto, bfloat16, float16, float32, got 'int8'"),
    ("dtype-integer", {"dtype": 5},
     "spec.dtype must be one of auto, bfloat16, float16, float32, got 5"),
    ("node-selector-string", {"nodeSelector": "gpu"},
     "spec.nodeSelector must be an object, got str"),
    ("affinity-list", {"affinity": ["x"]},
     "spec.affinity must be an object, got list"),
    ("tolerations-string", {"tolerations": "all"},
     "spec.tolerations must be a list of objects"),
    ("tolerations-of-strings", {"tolerations": ["x"]},
     "spec.tolerations must be a list of objects"),
    ("slots-over-gpu-budget", {"slots": 40, "slotsPerPod": 8, "maxGPUs": 4},
     "spec.slots=40 needs 5 pods x 1 GPU = 5 GPUs, over spec.maxGPUs=4; lower spec.slots to at "
     "most 32, raise spec.maxGPUs to 5, or raise spec.slotsPerPod"),
    ("multi-gpu-over-budget",
     {"slots": 16, "slotsPerPod": 8, "resources": {"gpus": 2}, "maxGPUs": 3},
     "spec.slots=16 needs 2 pods x 2 GPU = 4 GPUs, over spec.maxGPUs=3; lower spec.slots to at "
     "most 8, raise spec.maxGPUs to 4, or raise spec.slotsPerPod"),
    ("autoscaling-string", {"autoscaling": "on"},
     "spec.autoscaling must be an object, got str"),
    ("autoscaling-enabled-string", {"autoscaling": {"enabled": "yes"}},
     "spec.autoscaling.enabled must be true or false, got 'yes'"),
    ("min-slots-negative", {"autoscaling": {"minSlots": -1}},
     "spec.autoscaling.minSlots must be at least 0, got -1"),
    ("max-slots-string", {"autoscaling": {"maxSlots": "x"}},
     "spec.autoscaling.maxSlots must be an integer, got 'x'"),
    ("target-free-negative", {"autoscaling": {"targetFreeFraction": -0.1}},
     "spec.autoscaling.targetFreeFraction must be a non-negative number, got -0.1"),
    ("target-free-boolean", {"autoscaling": {"targetFreeFraction": True}},
     "spec.autoscaling.targetFreeFraction must be a non-negative number, got True"),
    ("scale-up-window-string", {"autoscaling": {"scaleUpStabilizationSeconds": "x"}},
     "spec.autoscaling.scaleUpStabilizationSeconds must be a non-negative number, got 'x'"),
    ("scale-down-window-negative", {"autoscaling": {"scaleDownStabilizationSeconds": -1}},
     "spec.autoscaling.scaleDownStabilizationSeconds must be a non-negative number, got -1"),
    ("autoscaling-no-ceiling", {"autoscaling": {"enabled": True}},
     "spec.autoscaling.maxSlots must be at least 1 when autoscaling is on"),
    ("autoscaling-out-of-order", {"autoscaling": {"enabled": True, "minSlots": 64, "maxSlots": 32}},
     "spec.autoscaling.minSlots (64) is above maxSlots (32); lower minSlots or raise maxSlots "
     "(minSlots left out is one pod's slots, slotsPerPod)"),
    ("autoscaling-over-gpu-budget",
     {"maxGPUs": 2, "autoscaling": {"enabled": True, "maxSlots": 64}},
     "spec.autoscaling.maxSlots=64 needs 8 pods x 1 GPU = 8 GPUs, over spec.maxGPUs=2; lower "
     "spec.autoscaling.maxSlots to at most 16, raise spec.maxGPUs to 8, or raise "
     "spec.slotsPerPod"),
    ("behavior-string", {"autoscaling": {"behavior": "x"}},
     "spec.autoscaling.behavior must be an object, got str"),
    ("scale-up-string", {"autoscaling": {"behavior": {"scaleUp": "x"}}},
     "spec.autoscaling.behavior.scaleUp must be an object, got str"),
    ("select-policy-unknown",
     {"autoscaling": {"behavior": {"scaleUp": {"selectPolicy": "Sometimes"}}}},
     "spec.autoscaling.behavior.scaleUp.selectPolicy must be Max, Min or Disabled, got "
     "'Sometimes'"),
    ("select-policy-integer", {"autoscaling": {"behavior": {"scaleDown": {"selectPolicy": 5}}}},
     "spec.autoscaling.behavior.scaleDown.selectPolicy must be a string, got 5"),
    ("policies-string", {"autoscaling": {"behavior": {"scaleUp": {"policies": "x"}}}},
     "spec.autoscaling.behavior.scaleUp.policies must be a list of objects"),
    ("policies-of-strings", policies("scaleDown", "x"),
     "spec.autoscaling.behavior.scaleDown.policies must be a list of objects"),
    ("policy-without-type", policies("scaleDown", {"value": 1, "periodSeconds": 15}),
     "spec.autoscaling.behavior.scaleDown.policies[0].type is required"),
    ("policy-type-integer", policies("scaleDown", {"type": 5, "value": 1, "periodSeconds": 15}),
     "spec.autoscaling.behavior.scaleDown.policies[0].type must be a string, got 5"),
    ("policy-type-unknown",
     policies("scaleUp", {"type": "Pods", "value": 1, "periodSeconds": 15},
              {"type": "Nodes", "value": 1, "periodSeconds": 15}),
     "spec.autoscaling.behavior.scaleUp.policies[1].type must be Pods or Percent, got 'Nodes'"),
    ("policy-without-value", policies("scaleUp", {"type": "Pods", "periodSeconds": 15}),
     "spec.autoscaling.behavior.scaleUp.policies[0].value is required"),
    ("policy-value-zero", policies("scaleUp", {"type": "Percent", "value": 0, "periodSeconds": 15}),
     "spec.autoscaling.behavior.scaleUp.policies[0].value must be at least 1, got 0"),
    ("policy-period-string",
     policies("scaleUp", {"type": "Pods", "value": 1, "periodSeconds": "15"}),
     "spec.autoscaling.behavior.scaleUp.policies[0].periodSeconds must be an integer, got '15'"),
    ("policy-without-period", policies("scaleUp", {"type": "Pods", "value": 1}),
     "spec.autoscaling.behavior.scaleUp.policies[0].periodSeconds is required"),
    ("resources-string", {"resources": "x"},
     "spec.resources must be an object, got str"),
    ("gpus-negative", {"resources": {"gpus": -1}},
     "spec.resources.gpus must be at least 0, got -1"),
    ("gpus-string", {"resources": {"gpus": "1"}},
     "spec.resources.gpus must be an integer, got '1'"),
    ("gpu-resource-integer", {"resources": {"gpuResourceName": 5}},
     "spec.resources.gpuResourceName must be a string, got 5"),
    ("cpu-boolean", {"resources": {"cpu": True}},
     "spec.resources.cpu must be a quantity like '4' or '16Gi'"),
    ("memory-list", {"resources": {"memory": [1]}},
     "spec.resources.memory must be a quantity like '4' or '16Gi'"),
    ("auth-string", {"auth": "x"},
     "spec.auth must be an object, got str"),
    ("api-keys-string", {"auth": {"apiKeysSecret": "keys"}},
     "spec.auth.apiKeysSecret must be an object, got str"),
    ("api-keys-no-name", {"auth": {"apiKeysSecret": {}}},
     "spec.auth.apiKeysSecret.name is required"),
    ("api-keys-empty-string", {"auth": {"apiKeysSecret": ""}},
     "spec.auth.apiKeysSecret.name is required"),
    ("api-keys-name-integer", {"auth": {"apiKeysSecret": {"name": 5}}},
     "spec.auth.apiKeysSecret.name must be a string, got 5"),
    ("api-keys-key-integer", {"auth": {"apiKeysSecret": {"name": "k", "key": 5}}},
     "spec.auth.apiKeysSecret.key must be a string, got 5"),
    ("pod-token-no-name", {"auth": {"podTokenSecret": {}}},
     "spec.auth.podTokenSecret.name is required"),
    ("api-keys-without-pod-token", {"auth": {"apiKeysSecret": {"name": "k"}}},
     "spec.auth.apiKeysSecret needs spec.auth.podTokenSecret (the routers' token), or an "
     "operator with a pod token seed (ASRPOOL_POD_TOKEN_SEED), which gives each pool its own: "
     "the router checks API keys and its streams reach keyed pods only with the token, so "
     "without it every client would be refused"),
    ("rollout-string", {"rollout": "x"},
     "spec.rollout must be an object, got str"),
    ("rollout-never-moves", {"rollout": {"maxSurge": 0, "maxUnavailable": "0%"}},
     "spec.rollout.maxSurge and maxUnavailable are both 0: a rollout could never move; raise one"
     " of them (maxSurge 1 needs one spare GPU)"),
    ("rollout-surge-word", {"rollout": {"maxSurge": "lots"}},
     "spec.rollout.maxSurge must be a whole number of pods or a percentage like '25%', got "
     "'lots'"),
    ("rollout-unavailable-over-100", {"rollout": {"maxUnavailable": "150%"}},
     "spec.rollout.maxUnavailable must be a whole number of pods or a percentage like '25%', got"
     " '150%'"),
    ("rollout-surge-boolean", {"rollout": {"maxSurge": True}},
     "spec.rollout.maxSurge must be a whole number of pods or a percentage like '25%', got True"),
    ("budget-string", {"disruptionBudget": "x"},
     "spec.disruptionBudget must be an object, got str"),
    ("budget-both", {"disruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}},
     "spec.disruptionBudget takes maxUnavailable or minAvailable, not both"),
    ("budget-unavailable-negative", {"disruptionBudget": {"maxUnavailable": -1}},
     "spec.disruptionBudget.maxUnavailable must be a whole number of pods or a percentage like "
     "'25%', got -1"),
    ("budget-available-word", {"disruptionBudget": {"minAvailable": "x"}},
     "spec.disruptionBudget.minAvailable must be a whole number of pods or a percentage like "
     "'25%', got 'x'"),
    ("automount-string", {"automountServiceAccountToken": "yes"},
     "spec.automountServiceAccountToken must be true or false"),
    ("pod-metadata-string", {"podMetadata": "x"},
     "spec.podMetadata must be an object"),
    ("pod-labels-integer", {"podMetadata": {"labels": {"a": 1}}},
     "spec.podMetadata.labels must map names to strings"),
    ("pod-annotations-string", {"podMetadata": {"annotations": "x"}},
     "spec.podMetadata.annotations must map names to strings"),
    ("env-string", {"env": "x"},
     "spec.env must be a list of objects"),
    ("env-without-name", {"env": [{"value": "x"}]},
     "spec.env[0] needs a name"),
    ("env-empty-name", {"env": [{"name": "A"}, {"name": ""}]},
     "spec.env[1] needs a name"),
    ("env-name-integer", {"env": [{"name": 5}]},
     "spec.env[0] needs a name"),
    ("env-twice", {"env": [{"name": "A"}, {"name": "B"}, {"name": "A"}]},
     "spec.env names 'A' twice"),
    ("env-from-string", {"envFrom": "x"},
     "spec.envFrom must be a list of objects"),
    ("env-from-of-strings", {"envFrom": ["x"]},
     "spec.envFrom must be a list of objects"),
    ("volumes-of-strings", {"volumes": ["x"]},
     "spec.volumes must be a list of objects"),
    ("volumes-twice", {"volumes": [X, X]},
     "spec.volumes names 'x' twice"),
    ("pull-secrets-without-name", {"imagePullSecrets": [{}]},
     "spec.imagePullSecrets[0] needs a name"),
    ("service-account-integer", {"serviceAccountName": 5},
     "spec.serviceAccountName must be a string"),
    ("runtime-class-list", {"runtimeClassName": ["x"]},
     "spec.runtimeClassName must be a string"),
    ("service-account-zero", {"serviceAccountName": 0},
     "spec.serviceAccountName must be a string"),
    ("runtime-class-false", {"runtimeClassName": False},
     "spec.runtimeClassName must be a string"),
    ("topology-spread-string", {"topologySpreadConstraints": "x"},
     "spec.topologySpreadConstraints must be a list of objects"),
    ("env-reserved", {"env": [{"name": "ASRPOOL_POOL", "value": "other"}]},
     "spec.env: environment variable 'ASRPOOL_POOL' is set by the operator; remove it (or use "
     "another name)"),
    ("env-reserved-with-a-field", {"env": [{"name": "ASRPOOL_ENGINE_PROCESS", "value": "1"}]},
     "spec.env: environment variable 'ASRPOOL_ENGINE_PROCESS' is set by the operator; set "
     "spec.engineProcess instead"),
    ("env-reserved-hf-token", {"env": [{"name": "HF_TOKEN", "value": "x"}]},
     "spec.env: environment variable 'HF_TOKEN' is set by the operator; remove it (or use "
     "another name)"),
    ("volume-reserved", {"volumes": [{"name": "model-cache", "emptyDir": {}}]},
     "spec.volumes: volume 'model-cache' is set by the operator; remove it (or use another name)"),
    ("mount-reserved-trailing-slash",
     {"volumes": [X], "volumeMounts": [{"name": "x", "mountPath": "/var/cache/asrpool/"}]},
     "spec.volumeMounts: mount path '/var/cache/asrpool/' is '/var/cache/asrpool', at or under "
     "'/var/cache/asrpool' which the operator mounts; use another path"),
    ("mount-reserved-double-slash",
     {"volumes": [X], "volumeMounts": [{"name": "x", "mountPath": "//models"}]},
     "spec.volumeMounts: mount path '//models' is '/models', at or under '/models' which the "
     "operator mounts; use another path"),
    ("mount-reserved-dotdot",
     {"volumes": [X], "volumeMounts": [{"name": "x", "mountPath": "/tmp/../models"}]},
     "spec.volumeMounts: mount path '/tmp/../models' is '/models', at or under '/models' which "
     "the operator mounts; use another path"),
    ("mount-reserved-under",
     {"volumes": [X], "volumeMounts": [{"name": "x", "mountPath": "/etc/asrpool/keys/./k"}]},
     "spec.volumeMounts: mount path '/etc/asrpool/keys/./k' is '/etc/asrpool/keys/k', at or "
     "under '/etc/asrpool/keys' which the operator mounts; use another path"),
    ("mount-relative", {"volumes": [X], "volumeMounts": [{"name": "x", "mountPath": "models"}]},
     "spec.volumeMounts: mount path 'models' must be absolute"),
    ("mount-without-path", {"volumes": [X], "volumeMounts": [{"name": "x"}]},
     "spec.volumeMounts: mount path '' must be absolute"),
    ("mount-unknown-volume", {"volumeMounts": [{"name": "nowhere", "mountPath": "/x"}]},
     "spec.volumeMounts names volume 'nowhere', which is not in spec.volumes"),
    ("mounts-without-name", {"volumeMounts": [{"mountPath": "/x"}]},
     "spec.volumeMounts[0] needs a name"),
    ("first-model-then-template", {"model": {}, "env": "x"},
     "spec.model needs exactly one of name (a preset, a Hugging Face repo id or a path in the "
     "image) and volume (a checkpoint directory)"),
    ("first-template-then-dtype", {"env": "x", "dtype": "int8"},
     "spec.env must be a list of objects"),
    ("first-dtype-then-slots", {"dtype": "int8", "slots": "x"},
     "spec.dtype must be one of auto, bfloat16, float16, float32, got 'int8'"),
    ("first-slots-then-resources", {"slots": "x", "resources": "x"},
     "spec.slots must be an integer, got 'x'"),
    ("first-auth-then-rollout", {"auth": "x", "rollout": "x"},
     "spec.auth must be an object, got str"),
    ("first-rollout-then-resources", {"rollout": "x", "resources": "x"},
     "spec.rollout must be an object, got str"),
    ("first-reserved-then-autoscaling",
     {"env": [{"name": "POD_IP"}], "autoscaling": {"enabled": True}},
     "spec.env: environment variable 'POD_IP' is set by the operator; remove it (or use another "
     "name)"),
]


@pytest.mark.parametrize(("fields", "message"),
                         [pytest.param(fields, message, id=name)
                          for name, fields, message in REFUSED])
def test_a_bad_spec_is_refused_in_these_words(fields: dict[str, Any] | None,
                                              message: str) -> None:
    assert refusal(fields) == message


def test_a_name_too_long_is_named_before_the_template() -> None:
    message = (f"metadata.name {LONG_NAME!r} is 51 characters; pools are named at most 50 so"
               " that their children's names and labels fit")
    assert refusal({}, name=LONG_NAME) == message
    assert refusal({"env": [{"name": "POD_IP"}]}, name=LONG_NAME) == message


def test_a_pod_token_of_the_pools_own_is_refused_under_a_seed() -> None:
    assert refusal({"auth": {"podTokenSecret": {"name": "t"}}}, seed="s") == (
        "spec.auth.podTokenSecret: this operator gives each pool its own pod token (its"
        " Secret stt-pod-token), which is what the routers send; leave podTokenSecret out")


# Odd values the readers take as absent: they must stay accepted.
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("ok-falsy-sections", {"autoscaling": None, "auth": {}, "rollout": [], "resources": 0,
                           "disruptionBudget": ""}),
    ("ok-falsy-lists", {"env": None, "tolerations": [], "volumes": 0, "podMetadata": ""}),
    ("ok-null-texts", {"image": None, "priorityClassName": "", "dtype": None}),
    ("ok-api-keys-null", {"auth": {"apiKeysSecret": None}}),
    ("ok-cache-null", {"model": {"name": "kyutai/stt-1b-en_fr", "cache": None,
                                 "tokenSecret": None}}),
    ("ok-volume-null", {"model": {"name": "tiny", "volume": None}}),
    # null where the CRD has a default reads as the default, as the API server reads it
    ("ok-null-defaults", {"model": {"name": "tiny", "loadTimeoutSeconds": None},
                          "autoscaling": {"enabled": None},
                          "automountServiceAccountToken": None, "context": None}),
    ("ok-policies-null", {"autoscaling": {"behavior": {"scaleUp": {"policies": None}}}}),
    ("ok-mounts-twice", {"volumes": [X], "volumeMounts": [{"name": "x", "mountPath": "/a"},
                                                          {"name": "x", "mountPath": "/b"}]}),
]


@pytest.mark.parametrize("fields", [pytest.param(fields, id=name) for name, fields in ACCEPTED])
def test_values_that_read_as_absent_are_accepted(fields: dict[str, Any]) -> None:
    read(fields)


# The readers themselves: a nested section knows its path.

def test_a_nested_section_names_the_full_path() -> None:
    spec = specs.Section("spec", {"model": {"cache": {"claimName": 5}}})
    cache = spec.section("model").section("cache")
    assert cache.path == "spec.model.cache"
    with pytest.raises(specs.InvalidSpec, match=r"^spec\.model\.cache\.claimName must be a string,"
                                                r" got 5$"):
        cache.text("claimName")


def test_list_items_are_read_at_their_index() -> None:
    items = specs.Section("spec", {"env": [{"name": "A"}, {}]}).sections("env")
    assert [item.path for item in items] == ["spec.env[0]", "spec.env[1]"]
    assert str(items[1].error("name", "is required")) == "spec.env[1].name is required"


def test_the_error_is_a_value_error() -> None:
    """Callers outside the operator (``asrpool plan``) may catch it as one."""
    assert issubclass(specs.InvalidSpec, ValueError)
