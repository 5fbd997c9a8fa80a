"""Opt-in end-to-end checks against a real cluster: ``KUBECONFIG=... pytest -m e2e``.

What only a real API server can show: it applies the CRD's defaults and its CEL rules,
the scale subresource maps ``replicas`` to ``spec.slots``, the printer columns render,
and the garbage collector removes a deleted pool's children. The operator runs here, in
the test process, against the cluster's API (its kubeconfig) and a local Redis; no
server pod has to start (no GPU or image pull is needed). Every run uses a fresh
namespace and deletes it. The identity in the kubeconfig needs to create namespaces and
install the CRD (cluster-admin on a kind/minikube cluster is the simple case).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import kopf
import kubernetes
import pytest
from kopf.testing import KopfRunner

from asrpool.operator import handlers, naming, settings
from tests.operator import schemas
from tests.support import redis_servers
from tests.support.polling import eventually

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs KUBECONFIG (a cluster)"),
]
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def api() -> kubernetes.client.ApiClient:
    kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


@pytest.fixture(scope="module")
def crd(api: kubernetes.client.ApiClient) -> None:
    body = schemas.load_crd()
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    try:
        extensions.create_custom_resource_definition(body)
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
        current = extensions.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        extensions.replace_custom_resource_definition(body["metadata"]["name"], body)


@pytest.fixture
def namespace(api: kubernetes.client.ApiClient, crd: None) -> Iterator[str]:
    name = f"asrpool-e2e-{uuid.uuid4().hex[:6]}"
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
async def operator(namespace: str, redis_server: redis_servers.RedisServer
                   ) -> AsyncIterator[KopfRunner]:
    config = settings.OperatorSettings(namespaces=[namespace], redis_url=redis_server.url,
                                       resync_seconds=2.0)
    runner = KopfRunner(["run", "--standalone", "--namespace", namespace],
                        registry=handlers.build_registry(config), settings=kopf.OperatorSettings(),
                        timeout=60)
    await asyncio.to_thread(runner.__enter__)
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


def pools(api: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api)


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{naming.GROUP}/{naming.VERSION}", "kind": naming.KIND,
            "metadata": {"name": name},
            "spec": {"model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 16, **spec}}


def create(api: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any]) -> Any:
    return pools(api).create_namespaced_custom_object(
        naming.GROUP, naming.VERSION, namespace, naming.PLURAL, body)


def test_the_api_server_defaults_and_rejects_by_the_crd(
    api: kubernetes.client.ApiClient, namespace: str
) -> None:
    created = create(api, namespace, manifest("defaults"))
    assert created["spec"]["slotsPerPod"] == 8
    assert created["spec"]["resources"] == {"gpus": 1, "gpuResourceName": "nvidia.com/gpu"}
    bad = [manifest("bad1", slots=-1), manifest("bad2", slotsPerPod=0),
           manifest("bad3", autoscaling={"enabled": True, "minSlots": 9, "maxSlots": 8})]
    for body in bad:
        with pytest.raises(kubernetes.client.ApiException) as info:
            create(api, namespace, body)
        assert info.value.status == 422, body["metadata"]["name"]


async def test_scale_subresource_children_columns_and_garbage_collection(
    api: kubernetes.client.ApiClient, namespace: str, operator: KopfRunner
) -> None:
    create(api, namespace, manifest("stt"))
    apps = kubernetes.client.AppsV1Api(api)

    def replicas() -> int:
        try:
            return int(apps.read_namespaced_deployment("stt", namespace).spec.replicas)
        except kubernetes.client.ApiException as exc:
            raise AssertionError(f"no Deployment yet: {exc.status}") from exc

    assert await eventually(replicas, TIMEOUT) == 2
    pools(api).patch_namespaced_custom_object_scale(
        naming.GROUP, naming.VERSION, namespace, naming.PLURAL, "stt", {"spec": {"replicas": 24}})

    def scaled() -> None:
        assert replicas() == 3

    await eventually(scaled, TIMEOUT)
    table = api.call_api(
        f"/apis/{naming.GROUP}/{naming.VERSION}/namespaces/{namespace}/{naming.PLURAL}", "GET",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        response_type="object", auth_settings=["BearerToken"], _return_http_data_only=True)
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert {"Slots", "Free", "Ready", "Age"} <= set(columns)
    pools(api).delete_namespaced_custom_object(
        naming.GROUP, naming.VERSION, namespace, naming.PLURAL, "stt")

    def collected() -> None:
        assert apps.list_namespaced_deployment(namespace).items == []

    await eventually(collected, TIMEOUT)
