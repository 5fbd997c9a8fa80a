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


def test_a_removed_field_changes_the_digest_so_the_child_is_applied_again() -> None:
    before = {"metadata": {"name": "x"}, "spec": {"nodeSelector": {"gpu": "h100"}}}
    after = {"metadata": {"name": "x"}, "spec": {}}
    live = diffs.with_digest(before)
    assert diffs.contains(live, diffs.with_digest(before))
    assert diffs.contains(live, after)  # every field of `after` is there...
    assert not diffs.contains(live, diffs.with_digest(after))  # ...but it was built otherwise
    assert after == {"metadata": {"name": "x"}, "spec": {}}  # the built object is not changed


def test_resource_quantities_compare_by_amount() -> None:
    built = {"resources": {"requests": {"cpu": "0.5", "memory": "1.5Gi"}, "limits": {"x": "2"}}}
    live = {"resources": {"requests": {"cpu": "500m", "memory": "1536Mi"}, "limits": {"x": "2"}}}
    assert diffs.contains(live, built)
    assert not diffs.contains({"resources": {"requests": {"cpu": "1", "memory": "1536Mi"},
                                             "limits": {"x": "2"}}}, built)
    assert not diffs.contains({"env": [{"value": "500m"}]}, {"env": [{"value": "0.5"}]})
