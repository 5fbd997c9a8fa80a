"""A small async face on the Kubernetes API for the operator's own calls.

kopf watches and patches the pools itself; the children, pods and events of what the
operator does go through here: plain dicts in and out, merge patches, and one error
type. Calls run the official ``kubernetes`` client in worker threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3

TIMEOUT_SECONDS = 30
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # its body may be JSON, which is YAML


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 when none came back)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Kind:
    api_version: str  # "v1" or "group/version"
    plural: str

    def path(self, namespace: str, name: str = "", subresource: str = "") -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [root, "namespaces", namespace, self.plural, name, subresource]
        return "/".join(part for part in parts if part)


CONFIG_MAPS = Kind("v1", "configmaps")
SECRETS = Kind("v1", "secrets")
SERVICES = Kind("v1", "services")
PODS = Kind("v1", "pods")
DEPLOYMENTS = Kind("apps/v1", "deployments")
DISRUPTION_BUDGETS = Kind("policy/v1", "poddisruptionbudgets")
NETWORK_POLICIES = Kind("networking.k8s.io/v1", "networkpolicies")
POOLS = Kind("asrpool.io/v1alpha1", "streamingasrpools")
_BY_KIND = {
    ("v1", "ConfigMap"): CONFIG_MAPS,
    ("v1", "Secret"): SECRETS,
    ("v1", "Service"): SERVICES,
    ("v1", "Pod"): PODS,
    ("apps/v1", "Deployment"): DEPLOYMENTS,
    ("policy/v1", "PodDisruptionBudget"): DISRUPTION_BUDGETS,
    ("networking.k8s.io/v1", "NetworkPolicy"): NETWORK_POLICIES,
    ("asrpool.io/v1alpha1", "StreamingASRPool"): POOLS,
}


def kind_of(obj: Mapping[str, Any]) -> Kind:
    return _BY_KIND[(obj["apiVersion"], obj["kind"])]


def load_configuration(url: str | None) -> kubernetes.client.Configuration:
    """In-cluster credentials, else kubeconfig; or a plain URL (``kubectl proxy``)."""
    configuration = kubernetes.client.Configuration()
    if url:
        configuration.host = url.rstrip("/")
        return configuration
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return configuration


class Kube:
    """Get, list, create, patch: each returns the object(s) as plain dicts."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self._client = kubernetes.client.ApiClient(configuration)

    def close(self) -> None:
        self._client.close()

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", kind.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, kind: Kind, namespace: str, labels: Mapping[str, str]) -> list[Any]:
        """Objects whose labels include ``labels`` (also checked here, not only by the server)."""
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}
        found = await self._call("GET", kind.path(namespace), query=query)
        return [item for item in found.get("items", []) if _has_labels(item, labels)]

    async def create(self, kind: Kind, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call("POST", kind.path(namespace), body=body)

    async def apply(self, kind: Kind, namespace: str, name: str, body: Mapping[str, Any],
                    field_manager: str) -> dict[str, Any]:
        """Server-side apply of a whole desired object: it creates what is missing, and
        removes what this manager applied before and ``body`` no longer has. ``force``
        takes over fields another manager changed (the operator owns its children)."""
        query = {"fieldManager": field_manager, "force": "true"}
        return await self._call("PATCH", kind.path(namespace, name), body=body, query=query,
                                content_type=APPLY_PATCH)

    async def patch(
        self, kind: Kind, namespace: str, name: str, body: Mapping[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        path = kind.path(namespace, name, subresource)
        return await self._call("PATCH", path, body=body, content_type=MERGE_PATCH)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self._call_sync, method, path, body, query, content_type)

    def _call_sync(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        query: Mapping[str, str] | None,
        content_type: str,
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        try:
            response = self._client.call_api(
                path, method, query_params=list((query or {}).items()), header_params=headers,
                body=dict(body) if body is not None else None, auth_settings=["BearerToken"],
                _return_http_data_only=True, _preload_content=False,
                _request_timeout=TIMEOUT_SECONDS,
            )
        except kubernetes.client.ApiException as exc:
            raise KubeError(f"{method} {path}: {exc.status} {_reason(exc)}", exc.status) from exc
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # no answer at all
            raise KubeError(f"{method} {path}: {exc}") from exc
        answer: dict[str, Any] = json.loads(response.data or b"{}")
        return answer


def _reason(exc: kubernetes.client.ApiException) -> str:
    try:
        return str(json.loads(exc.body).get("message", exc.reason))
    except (TypeError, ValueError):
        return str(exc.reason)


def _has_labels(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    actual = obj.get("metadata", {}).get("labels") or {}
    return all(actual.get(key) == value for key, value in labels.items())
