"""Comparing what was built with what the API server keeps."""

from __future__ import annotations

from asrpool.operator import diffs


def test_server_additions_do_not_count_as_a_difference() -> None:
    built = {"spec": {"replicas": 2, "template": {"containers": [{"name": "s", "image": "i"}]}}}
    live = {"metadata": {"uid": "u"}, "status": {}, "spec": {
        "replicas": 2, "progressDeadlineSeconds": 600,
        "template": {"containers": [{"name": "s", "image": "i", "imagePullPolicy": "Always"}]}}}
    assert diffs.contains(live, built)


def test_a_changed_value_a_missing_key_or_another_list_length_differ() -> None:
    built = {"spec": {"replicas": 2, "ports": [{"port": 1}]}}
    assert not diffs.contains({"spec": {"replicas": 3, "ports": [{"port": 1}]}}, built)
    assert not diffs.contains({"spec": {"ports": [{"port": 1}]}}, built)
    assert not diffs.contains({"spec": {"replicas": 2, "ports": []}}, built)
    assert not diffs.contains({"spec": {"replicas": 2, "ports": [{"port": 1}, {"port": 2}]}},
                              built)


def test_the_patch_leaves_out_the_type() -> None:
    built = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {}}
    assert diffs.managed_patch(built) == {"metadata": {"name": "x"}, "spec": {}}


def test_resource_quantities_compare_by_amount() -> None:
    built = {"resources": {"requests": {"cpu": "0.5", "memory": "1.5Gi"}, "limits": {"x": "2"}}}
    live = {"resources": {"requests": {"cpu": "500m", "memory": "1536Mi"}, "limits": {"x": "2"}}}
    assert diffs.contains(live, built)
    assert not diffs.contains({"resources": {"requests": {"cpu": "1", "memory": "1536Mi"},
                                             "limits": {"x": "2"}}}, built)
    assert not diffs.contains({"env": [{"value": "500m"}]}, {"env": [{"value": "0.5"}]})
