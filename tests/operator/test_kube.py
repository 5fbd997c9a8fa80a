"""The operator's API calls, against the emulator over real HTTP."""

from __future__ import annotations

import pytest

from asrpool.operator import kube
from tests.operator import emulator

NS = emulator.NAMESPACE


def test_paths() -> None:
    assert kube.PODS.path("ns") == "/api/v1/namespaces/ns/pods"
    assert kube.POOLS.path("ns", "p", "status") == (
        "/apis/asrpool.io/v1alpha1/namespaces/ns/streamingasrpools/p/status")
    assert kube.kind_of({"apiVersion": "apps/v1", "kind": "Deployment"}) is kube.DEPLOYMENTS


def config_map(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"},
            "metadata": {"name": name, "namespace": NS, "labels": labels}}


async def test_get_create_list_patch(cluster: emulator.Cluster) -> None:
    api = kube.Kube(kube.load_configuration(cluster.url))
    try:
        assert await api.get(kube.CONFIG_MAPS, NS, "a") is None
        await api.create(kube.CONFIG_MAPS, NS, config_map("a", pool="x"))
        await api.create(kube.CONFIG_MAPS, NS, config_map("b", pool="y"))
        found = await api.list(kube.CONFIG_MAPS, NS, {"pool": "x"})
        assert [item["metadata"]["name"] for item in found] == ["a"]
        await api.patch(kube.CONFIG_MAPS, NS, "a", {"data": {"b": "2"}})
        patched = await api.get(kube.CONFIG_MAPS, NS, "a")
        assert patched is not None and patched["data"] == {"a": "1", "b": "2"}
        with pytest.raises(kube.KubeError) as info:
            await api.create(kube.CONFIG_MAPS, NS, config_map("a"))
        assert info.value.status == 409 and "POST" in str(info.value)
    finally:
        api.close()


async def test_no_answer_is_a_kube_error() -> None:
    api = kube.Kube(kube.load_configuration("http://127.0.0.1:9"))
    try:
        with pytest.raises(kube.KubeError) as info:
            await api.get(kube.PODS, NS, "x")
        assert info.value.status == 0
    finally:
        api.close()
