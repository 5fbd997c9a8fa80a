"""Reading a pool: defaults, and the rules the schema cannot express."""

from __future__ import annotations

from typing import Any

import pytest

from asrpool.operator import children, pools, settings, specs


def body(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "stt", "namespace": "speech"},
            "spec": {"model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 16, **spec}}


def test_a_minimal_pool_gets_the_defaults() -> None:
    pool = pools.from_body(body())
    assert (pool.name, pool.namespace, pool.model, pool.slots) == (
        "stt", "speech", "kyutai/stt-1b-en_fr", 16)
    assert (pool.slots_per_pod, pool.context, pool.gpus, pool.device) == (8, 375, 1, "cuda")
    assert pool.pods == 2


@pytest.mark.parametrize(("slots", "per_pod", "pods"), [(0, 8, 0), (1, 8, 1), (8, 8, 1),
                                                        (9, 8, 2), (256, 32, 8), (257, 32, 9)])
def test_pods_are_slots_over_slots_per_pod_rounded_up(slots: int, per_pod: int, pods: int) -> None:
    assert pools.from_body(body(slots=slots, slotsPerPod=per_pod)).pods == pods


def test_no_gpus_means_cpu() -> None:
    assert pools.from_body(body(resources={"gpus": 0})).device == "cpu"


def test_auth_secrets_get_their_default_keys() -> None:
    pool = pools.from_body(body(auth={"apiKeysSecret": {"name": "keys"},
                                      "podTokenSecret": {"name": "tok", "key": "t"}}))
    assert pool.api_keys == pools.SecretKey("keys", "keys.yaml")
    assert pool.pod_token == pools.SecretKey("tok", "t")


def _rejects(spec: dict[str, Any], *needles: str, name: str = "stt") -> None:
    raw = body(**spec)
    raw["metadata"]["name"] = name
    with pytest.raises(specs.InvalidSpec) as info:
        pools.from_body(raw)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_slots_beyond_the_gpu_budget_say_what_fits() -> None:
    _rejects({"slots": 40, "slotsPerPod": 8, "maxGPUs": 4},
             "spec.slots=40 needs 5 pods x 1 GPU = 5 GPUs", "spec.maxGPUs=4",
             "at most 32", "raise spec.maxGPUs to 5")


def test_multi_gpu_pods_count_every_gpu() -> None:
    _rejects({"slots": 16, "slotsPerPod": 8, "resources": {"gpus": 2}, "maxGPUs": 3},
             "2 pods x 2 GPU = 4 GPUs", "at most 8")


def test_autoscaling_ceiling_beyond_the_gpu_budget_is_invalid() -> None:
    _rejects({"maxGPUs": 2, "autoscaling": {"enabled": True, "maxSlots": 64}},
             "spec.autoscaling.maxSlots=64")


def test_autoscaling_bounds_out_of_order() -> None:
    _rejects({"autoscaling": {"enabled": True, "minSlots": 64, "maxSlots": 32}},
             "minSlots (64) is above maxSlots (32)")


def test_autoscaling_needs_a_ceiling() -> None:
    _rejects({"autoscaling": {"enabled": True}}, "spec.autoscaling.maxSlots")


def test_api_keys_need_the_routers_pod_token() -> None:
    keyed = pools.from_body(body(auth={"apiKeysSecret": {"name": "keys"}}))
    with pytest.raises(specs.InvalidSpec, match=r"apiKeysSecret needs spec\.auth\.podTokenSecret"):
        pools.check_auth(keyed)
    seeded = children.with_pod_token(keyed, settings.OperatorSettings(
        namespaces=["x"], pod_token_seed="seed"))
    pools.check_auth(seeded)  # the pool's own token, from the operator's seed, serves


def test_a_long_name_is_invalid() -> None:
    _rejects({}, "metadata.name", "at most 50", name="p" * 51)


@pytest.mark.parametrize(("spec", "needle"), [
    ({"slots": "16"}, "spec.slots must be an integer"),
    ({"slots": True}, "spec.slots must be an integer"),
    ({"slotsPerPod": 0}, "spec.slotsPerPod must be at least 1"),
    ({"model": "kyutai/stt"}, "spec.model must be an object"),
    ({"model": {}}, "spec.model needs exactly one of name"),
    ({"resources": {"memory": [1]}}, "spec.resources.memory"),
    ({"tolerations": "all"}, "spec.tolerations must be a list"),
    ({"auth": {"apiKeysSecret": {}}}, "spec.auth.apiKeysSecret.name is required"),
])
def test_bad_types_are_caught_even_without_a_schema(spec: dict[str, Any], needle: str) -> None:
    _rejects(spec, needle)


def test_missing_slots_is_caught() -> None:
    raw = body()
    del raw["spec"]["slots"]
    with pytest.raises(specs.InvalidSpec, match=r"spec\.slots is required"):
        pools.from_body(raw)


def test_a_rollout_that_could_never_move_is_invalid() -> None:
    _rejects({"rollout": {"maxSurge": 0, "maxUnavailable": "0%"}},
             "spec.rollout.maxSurge and maxUnavailable are both 0")


def test_rollout_and_budget_values_are_pods_or_percentages() -> None:
    _rejects({"rollout": {"maxSurge": "lots"}}, "spec.rollout.maxSurge", "'25%'")
    _rejects({"disruptionBudget": {"maxUnavailable": -1}}, "spec.disruptionBudget.maxUnavailable")
    _rejects({"disruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}}, "not both")


def test_slots_per_pod_auto_starts_with_one_pod_then_sizes_from_what_pods_measured() -> None:
    """Each pod measures its own engine (serve --batch-size auto); the operator sizes
    the pool from what they measured, one pod first, the template the same throughout."""
    first = pools.from_body(body(slots=1000, slotsPerPod="auto"))
    assert (first.auto_slots, first.slots_per_pod, first.pods) == (True, 1000, 1)
    sized = pools.from_body(body(slots=1000, slotsPerPod="auto"), measured_slots=256)
    assert (sized.slots_per_pod, sized.pods) == (256, 4)
    config = settings.OperatorSettings(namespaces=["speech"], redis_url="redis://redis:6379/0")
    envs = [children.server_environment(pool, config)["ASRPOOL_BATCH_SIZE"]
            for pool in (first, sized)]
    assert envs == ["auto", "auto"]
    pinned = pools.from_body(body(slots=16, slotsPerPod=8), measured_slots=256)
    assert (pinned.auto_slots, pinned.slots_per_pod) == (False, 8)
    assert children.server_environment(pinned, config)["ASRPOOL_BATCH_SIZE"] == "8"


def test_slots_per_pod_is_a_number_or_auto() -> None:
    _rejects({"slotsPerPod": "many"}, "spec.slotsPerPod must be an integer or auto, got 'many'")
