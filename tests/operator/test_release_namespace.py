"""A pool in the operator's own namespace may name neither the operator's service account
nor any Secret there: its pods would hold the platform's credentials (the Redis admin
password, the seeds) or the operator's rights, which the pool's writer may not."""

from __future__ import annotations

from typing import Any

import pytest

from asrpool.operator import pools, specs

RELEASE, OPERATOR_SA = "asrpool-system", "asrpool-operator"


def _pool(namespace: str, **spec: Any) -> pools.Pool:
    return pools.from_body({"metadata": {"name": "stt", "namespace": namespace}, "spec": {
        "model": {"name": "tiny"}, "slots": 8, **spec}})


def _check(pool: pools.Pool) -> None:
    pools.check_release_namespace(pool, RELEASE, OPERATOR_SA)


SECRET_VOLUME = {"name": "creds", "secret": {"secretName": "asrpool-redis"}}
PROJECTED = {"name": "all", "projected": {"sources": [
    {"configMap": {"name": "c"}}, {"secret": {"name": "asrpool-pod-token"}}]}}


@pytest.mark.parametrize(("spec", "named"), [
    ({"serviceAccountName": OPERATOR_SA}, "spec.serviceAccountName: 'asrpool-operator'"),
    ({"env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {
        "name": "asrpool-redis", "key": "password"}}}]}, "spec.env: PASSWORD names a Secret"),
    ({"envFrom": [{"secretRef": {"name": "asrpool-redis"}}]},
     "spec.envFrom: asrpool-redis names a Secret"),
    ({"volumes": [SECRET_VOLUME]}, "spec.volumes: creds names a Secret"),
    ({"volumes": [PROJECTED]}, "spec.volumes: all names a Secret"),
    ({"auth": {"apiKeysSecret": {"name": "asrpool-redis"}}},
     "spec.auth.apiKeysSecret: asrpool-redis names a Secret"),
    ({"model": {"name": "kyutai/private", "tokenSecret": {"name": "asrpool-redis"}}},
     "spec.model.tokenSecret: asrpool-redis names a Secret"),
])
def test_a_pool_in_the_operators_namespace_is_refused_naming_what(
        spec: dict[str, Any], named: str) -> None:
    with pytest.raises(specs.InvalidSpec) as refused:
        _check(_pool(RELEASE, **spec))
    assert named in str(refused.value)
    if "serviceAccountName" not in named:
        assert "may name none" in str(refused.value) and RELEASE in str(refused.value)


def test_the_same_pool_in_a_namespace_of_its_own_is_for_that_namespaces_rbac() -> None:
    _check(_pool("speech", serviceAccountName=OPERATOR_SA, volumes=[SECRET_VOLUME],
                 envFrom=[{"secretRef": {"name": "mine"}}]))


def test_what_names_no_secret_passes_in_the_operators_namespace() -> None:
    _check(_pool(RELEASE, serviceAccountName="speech-pods", imagePullSecrets=[{"name": "reg"}],
                 env=[{"name": "SECRET_SAUCE", "value": "x"}],
                 volumes=[{"name": "c", "configMap": {"name": "c"}}]))


def test_an_operator_that_does_not_know_its_namespace_checks_nothing() -> None:
    pools.check_release_namespace(_pool(RELEASE, serviceAccountName=OPERATOR_SA), None, None)
